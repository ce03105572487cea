"""What the divergence guard (train.on_nonfinite, growpipe.nn.guard) costs a training step: the first block of
each learning rule on digits, timed with the guard as shipped (losses and a gradients-finite flag read in one
host sync) against the same step with the gradient check left out (losses only), in one process, the two
alternating, median of --repeats timings each.

    .venv/bin/python bench/guard.py --json-out bench/out/guard.json
    .venv/bin/python bench/guard.py --quick

Prints, per rule, ms per step both ways and their ratio, and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import build_config  # noqa: E402
from growpipe.data import iterate_batches, load_data  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.nn import guard  # noqa: E402
from growpipe.nn.methods import build_block  # noqa: E402
from growpipe.nn.net import plan_blocks  # noqa: E402
from growpipe.nn.specs import InputInfo  # noqa: E402

METHODS = ("al", "scpl", "dascpl", "bp")


@contextlib.contextmanager
def losses_only() -> Iterator[None]:
    """The guard without its pass over the gradients (what a loss-only check would cost)."""
    real = guard.nonfinite_flag
    guard.nonfinite_flag = lambda grads: None
    try:
        yield
    finally:
        guard.nonfinite_flag = real


def step_ms(block, packets: list, steps: int) -> float:
    """Milliseconds per training step of `block` over `steps` packets (cycled)."""
    start = time.perf_counter()
    for i in range(steps):
        block.train_step(packets[i % len(packets)])
    return 1000 * (time.perf_counter() - start) / steps


def measure(method: str, width: int, steps: int, repeats: int) -> dict:
    """One rule's first block: ms per step with the guard and with losses only, alternating."""
    cfg = build_config({"method": method, "net": {"width": width, "blocks": 2}, "data": {"batch_size": 64}})
    bundle = load_data(cfg.data, cfg.seed)
    info = InputInfo.from_bundle(bundle, cfg.net)
    spec = plan_blocks(cfg.net, cfg.rule(), info)[0]
    if method == "bp":  # a BP block trains alone only when it carries the classifier
        spec = plan_blocks(cfg.net.model_copy(update={"blocks": 1}), cfg.rule(), info)[0]
    block = build_block(cfg.rule(), spec, info)
    packets = list(iterate_batches(bundle.train, 64, shuffle=True, seed=0))
    step_ms(block, packets, steps)  # warm-up
    guarded, plain = [], []
    for _ in range(repeats):
        guarded.append(step_ms(block, packets, steps))
        with losses_only():
            plain.append(step_ms(block, packets, steps))
    g, p = statistics.median(guarded), statistics.median(plain)
    return {"method": method, "guard_ms": round(g, 4), "losses_only_ms": round(p, 4), "ratio": round(g / p, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="al and bp, 10 steps, 1 repeat")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated learning rules")
    ap.add_argument("--width", type=int, default=256, help="MLP width (default 256)")
    ap.add_argument("--steps", type=int, default=100, help="steps per timing (default 100)")
    ap.add_argument("--repeats", type=int, default=9, help="timings per variant; the median is reported")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a stage actor here)")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = ["al", "bp"] if args.quick else args.methods.split(",")
    steps, repeats = (10, 1) if args.quick else (args.steps, args.repeats)
    rows = [measure(m, args.width, steps, repeats) for m in methods]
    print(f"{'rule':<7} {'guard ms':>9} {'losses only ms':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['method']:<7} {r['guard_ms']:>9.3f} {r['losses_only_ms']:>15.3f} {r['ratio']:>6.3f}")
    if args.json_out:
        out = {"width": args.width, "steps": steps, "repeats": repeats, "threads": args.threads, "rows": rows}
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
