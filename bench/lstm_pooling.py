"""Why SCPL with last-state pooling on a BiLSTM block falls to chance: train SCPL (reference trainer, the
20 Newsgroups transformer suite's data and heads, embedding + one BiLSTM block) per case, then look at the
BiLSTM block's pooled features of a batch of test documents: how alike they are (mean pairwise cosine),
how saturated its outputs are (|h| > 0.99) and their spread, next to its contrastive loss per epoch.

    .venv/bin/growpipe bench lstm-pooling --json-out bench/out/lstm-pooling.json
    .venv/bin/python bench/lstm_pooling.py --cases "last;mean" --epochs 2

Prints one row per case and writes JSON (bench/RESULTS.md, "LSTM speed and the LSTM on 20 Newsgroups").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "src"))

from compare import SUITES  # noqa: E402

from growpipe.config import load_config  # noqa: E402
from growpipe.data.batches import iterate_batches  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.local import train_local  # noqa: E402

LSTM = ["net.backbone=lstm", "net.width=128", "net.embed_dim=128", "data.max_len=128", "net.blocks=2",
        "tracking.mlflow=false", "checkpoint.enabled=false"]  # fmt: skip
CASES = {
    "last": ["net.lstm_pooling=last"],
    "last-embed-std-1": ["net.lstm_pooling=last", "net.embed_init_std=1.0"],
    "last-lr-3e-4": ["net.lstm_pooling=last", "train.lr=0.0003"],
    "last-batch-256": ["net.lstm_pooling=last", "data.batch_size=256"],
    "mean": ["net.lstm_pooling=mean"],
    "last-clip-1": ["net.lstm_pooling=last", "train.grad_clip=1.0"],  # issue 28: does clipping keep them apart?
    "last-clip-0.5": ["net.lstm_pooling=last", "train.grad_clip=0.5"],
    "last-clip-5": ["net.lstm_pooling=last", "train.grad_clip=5.0"],
    "mean-clip-1": ["net.lstm_pooling=mean", "train.grad_clip=1.0"],
}


def diagnose(overrides: list[str], docs: int = 256) -> dict[str, Any]:
    """Train SCPL with `overrides`; the test accuracy, the BiLSTM block's loss per epoch and how alike its
    pooled features of `docs` test documents are."""
    cfg = load_config(REPO / "configs" / "20newsgroups-scpl.yaml", overrides)
    run = train_local(cfg, progress=None)
    first, lstm = run.net.blocks[0], run.net.blocks[-1]
    batch = next(iter(iterate_batches(run.bundle.test, docs, shuffle=False)))
    with torch.no_grad():
        s, mask, _ = lstm.encode(first.forward(batch))
        feats = lstm.features(s, mask)
        z = F.normalize(feats, dim=1)
        off_diagonal = ~torch.eye(len(z), dtype=torch.bool)
        cosine = (z @ z.T)[off_diagonal].mean().item()
        spread = feats.std(0).mean().item() / (feats.abs().mean().item() + 1e-12)
    key = f"b{len(run.net.blocks) - 1}.supcon"
    return {
        "test_accuracy": run.summary()["test_accuracy"],
        "supcon_per_epoch": [round(h["loss"][key], 3) for h in run.history],
        "mean_pairwise_cosine": round(cosine, 4),
        "saturated_fraction": round((s.abs() > 0.99).float().mean().item(), 4),
        "relative_spread": round(spread, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=";".join(CASES), help=f"';'-separated, of: {', '.join(CASES)}")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per case (4)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to every case")  # fmt: skip
    ap.add_argument("--json-out", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    names = args.cases.split(";")
    if unknown := [n for n in names if n not in CASES]:
        ap.error(f"--cases: {', '.join(unknown)} not known; choose from {', '.join(CASES)}")
    base = [*SUITES["20newsgroups"].overrides, *LSTM, f"train.epochs={args.epochs}"]
    rows = []
    print("| case | test acc | supcon per epoch | mean pairwise cosine | saturated |\n| --- | --- | --- | --- | --- |")
    for name in names:
        row = {"case": name, "overrides": CASES[name], **diagnose([*base, *CASES[name], *args.overrides])}
        rows.append(row)
        losses = ", ".join(f"{v:.2f}" for v in row["supcon_per_epoch"])
        print(f"| {name} | {row['test_accuracy']:.4f} | {losses} | {row['mean_pairwise_cosine']:.4f} | "
              f"{row['saturated_fraction']:.4f} |", flush=True)  # fmt: skip
    if args.json_out:
        print(f"JSON: {atomic_write_json(args.json_out, {'rows': rows, 'epochs': args.epochs})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
