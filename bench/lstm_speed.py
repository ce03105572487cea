"""Where a BiLSTM block's time goes on CPU: one training step (forward + backward + Adam) of a BiLSTM block
on real 20 Newsgroups batches, packed (padding skipped, PyTorch's native kernel) against padded (oneDNN's
fused kernel, padding computed like the seeds'), across sequence length and threads.

    .venv/bin/python bench/lstm_speed.py --json-out bench/out/lstm-speed.json
    .venv/bin/python bench/lstm_speed.py --quick

Prints samples/s per case (median of --repeats timings of --batches batches) and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import build_config  # noqa: E402
from growpipe.data import load_data  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.nn.backbones import LSTMEncoder  # noqa: E402


def step_rate(tokens: torch.Tensor, embed: torch.nn.Embedding, hidden: int, packed: bool, batches: int,
              batch_size: int) -> float:  # fmt: skip
    """Samples/s of forward + backward + Adam of one BiLSTM block over `batches` batches of `tokens`."""
    enc = LSTMEncoder(embed.embedding_dim, hidden, 1, 0.0, packed=packed)
    opt = torch.optim.Adam(enc.parameters(), lr=1e-3)
    start = time.perf_counter()
    for b in range(batches):
        x = tokens[b * batch_size : (b + 1) * batch_size]
        mask = x != 0
        with torch.no_grad():
            s = embed(x)
        out, _ = enc(s, mask)
        loss = enc.pool(out, mask).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return batches * batch_size / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 batches, 1 repeat, lengths 32 and 64")
    ap.add_argument("--data", default="20newsgroups", help="text data.name (default 20newsgroups)")
    ap.add_argument("--lengths", default="64,128,256", help="comma-separated data.max_len values")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--hidden", type=int, default=128, help="LSTM hidden size per direction (default 128)")
    ap.add_argument("--batches", type=int, default=6, help="batches per timing (default 6)")
    ap.add_argument("--repeats", type=int, default=3, help="timings per case; the median is reported")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    lengths = [32, 64] if args.quick else [int(v) for v in args.lengths.split(",")]
    batches, repeats = (2, 1) if args.quick else (args.batches, args.repeats)
    batch_size, rows = 64, []
    for max_len in lengths:
        cfg = build_config({"data": {"name": args.data, "max_len": max_len, "vocab_size": 30000}})
        tokens = load_data(cfg.data).train.x
        tokens = tokens[torch.arange(batches * batch_size) % len(tokens)]  # the first rows, repeated if few
        real = float((tokens != 0).float().mean())
        torch.manual_seed(0)
        embed = torch.nn.Embedding(int(tokens.max()) + 1, 128, padding_idx=0)
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for packed in (True, False):
                rate = statistics.median(step_rate(tokens, embed, args.hidden, packed, batches, batch_size)
                                         for _ in range(repeats))  # fmt: skip
                row = {"max_len": max_len, "real_token_fraction": round(real, 3), "threads": threads,
                       "packed": packed, "samples_per_second": round(rate, 1)}  # fmt: skip
                rows.append(row)
                print(f"max_len {max_len:4d} (real tokens {real:.0%})  threads {threads}  "
                      f"{'packed' if packed else 'padded'}  {rate:8.1f} samples/s", flush=True)  # fmt: skip
    if args.json_out:
        atomic_write_json(args.json_out, {"hidden": args.hidden, "batch_size": batch_size, "rows": rows})
        print(f"JSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
