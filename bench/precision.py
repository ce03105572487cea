"""bf16 against fp32 (train.precision) on the reference trainer: the same config, seed and data trained in each
precision, per learning rule: test accuracy (full path and every exit), seconds per epoch (median of the epochs
after the first), bf16's accuracy gap in points (final epoch, and the last three epochs' mean) and time ratio
to fp32, and the bytes one sample's activations take across a hop (the first block's output, numel x element
size).

    .venv/bin/python bench/precision.py --json-out bench/out/precision-fm.json
    .venv/bin/python bench/precision.py --quick            # digits MLP 32 wide, 2 epochs: a smoke run

Prints a Markdown table for bench/RESULTS.md (with the 1-minute load average around each run, the machine
being shared) and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("al", "scpl", "dascpl", "bp")
PRECISIONS = ("fp32", "bf16")
CONFIG, QUICK_CONFIG = "configs/fashion-mnist-dascpl.yaml", "configs/digits-dascpl.yaml"
QUICK = ["net.width=32", "train.epochs=2"]


def hop_bytes(result) -> dict:
    """What one sample's activations take leaving the first block (x, and AL's label code t): bytes, dtype, shape."""
    from growpipe.data import iterate_batches

    net, bundle = result.net, result.bundle
    p = next(iter(iterate_batches(bundle.test, 1, shuffle=False, side_groups=net.side_groups())))
    out = net.blocks[0].forward(p)
    sent = [v for v in (out.x, out.t) if v is not None]
    return {
        "hop_bytes_per_sample": sum(v[0].numel() * v.element_size() for v in sent),
        "hop_dtype": str(out.x.dtype).removeprefix("torch."),
        "hop_shape": list(out.x.shape[1:]),
    }


def run_one(config: Path, method: str, precision: str, overrides: list[str]) -> dict:
    """Train `config` with one rule in one precision on the reference trainer; its row."""
    from growpipe.config import load_config
    from growpipe.local import train_local

    sets = [f"method={method}", f"train.precision={precision}", *overrides]
    cfg = load_config(config, [*sets, "tracking.mlflow=false", "checkpoint.enabled=false"])
    command = " ".join(["growpipe train --runtime local", f"--config {config}", *(f"--set {o}" for o in sets)])
    print(f"== {method} / {precision}: {command}", flush=True)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    result = train_local(cfg, progress=print)
    s = result.summary()
    epoch_s = [row["seconds"] for row in s["history"]]
    return {
        "method": method,
        "precision": precision,
        "blocks": s["blocks"],
        "epochs": s["epochs"],
        "test_accuracy": s["test_accuracy"],
        "exit_depths": s["exit_depths"],
        "exit_accuracy": s["exit_accuracy"],
        "epoch_accuracy": [row["test_accuracy"] for row in s["history"]],
        "epoch_seconds": epoch_s,
        "seconds_per_epoch": statistics.median(epoch_s[1:] or epoch_s),
        **hop_bytes(result),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "command": command,
    }


def last3(row: dict) -> float:
    """The mean full-path test accuracy of the last three epochs (one epoch's figure moves by a point or more)."""
    return statistics.mean(row["epoch_accuracy"][-3:])


def compare(rows: list[dict]) -> list[dict]:
    """Per rule, bf16 against fp32: accuracy gap in points (full path, per exit, and the last three epochs'
    mean), time and bytes ratios."""
    by = {(r["method"], r["precision"]): r for r in rows}
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        a, b = by[(method, "fp32")], by[(method, "bf16")]
        out.append(
            {
                "method": method,
                "accuracy_points": round(100 * (b["test_accuracy"] - a["test_accuracy"]), 2),
                "exit_accuracy_points": [round(100 * (y - x), 2) for x, y in zip(a["exit_accuracy"],
                                                                                 b["exit_accuracy"], strict=True)],
                "last3_points": round(100 * (last3(b) - last3(a)), 2),
                "time_ratio": round(b["seconds_per_epoch"] / a["seconds_per_epoch"], 3),
                "hop_bytes_ratio": round(b["hop_bytes_per_sample"] / a["hop_bytes_per_sample"], 3),
            }
        )  # fmt: skip
    return out


def markdown(rows: list[dict], ratios: list[dict]) -> str:
    """The rows as a Markdown table; the bf16 rows carry their gap and ratios to fp32."""
    vs = {r["method"]: r for r in ratios}
    out = [
        "| method | precision | test acc (full path) | vs fp32 (points) | vs fp32, last 3 epochs | accuracy per exit "
        "| s/epoch (median, epochs 2+) | time vs fp32 | bytes/sample per hop | load (1 min, before/after) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        v = vs[r["method"]] if r["precision"] == "bf16" else None
        gap, gap3, ratio = (
            (f"{v['accuracy_points']:+.2f}", f"{v['last3_points']:+.2f}", f"{v['time_ratio']:.2f}x")
            if v
            else ("-",) * 3
        )
        exits = ", ".join(f"@{d}: {a:.4f}" for d, a in zip(r["exit_depths"], r["exit_accuracy"], strict=True))
        out.append(
            f"| {r['method']} | {r['precision']} | {r['test_accuracy']:.4f} | "
            f"{gap} | {gap3} | {exits} | {r['seconds_per_epoch']:.2f} | "
            f"{ratio} | {r['hop_bytes_per_sample']:,} ({r['hop_dtype']}) | "
            f"{r['load_1min'][0]:.2f} / {r['load_1min'][1]:.2f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help=f"the run's YAML (default {CONFIG}; --quick: {QUICK_CONFIG})")
    ap.add_argument(
        "--methods", default="dascpl,bp", help="comma-separated rules, each set on the config (%(default)s)"
    )
    ap.add_argument("--epochs", type=int, help="train.epochs (default: the config's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to every run")  # fmt: skip
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_CONFIG}, 32 wide, 2 epochs: a smoke run")
    ap.add_argument("--json-out", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    if unknown := [m for m in methods if m not in METHODS]:
        raise SystemExit(f"--methods: {unknown[0]} not known; choose from {', '.join(METHODS)}")
    config = Path(args.config or (QUICK_CONFIG if args.quick else CONFIG))
    if not config.is_absolute() and not config.is_file():
        config = REPO / config  # the checkout's configs/ from any directory
    overrides = [*(QUICK if args.quick else []), *args.overrides, f"threads={args.threads}"]
    if args.epochs is not None:
        overrides.append(f"train.epochs={args.epochs}")
    rows = [run_one(config, m, p, overrides) for m in methods for p in PRECISIONS]
    ratios = compare(rows)
    print(markdown(rows, ratios))
    if args.json_out:
        from growpipe.fsutil import atomic_write_json

        out = {"config": str(config), "overrides": overrides, "rows": rows, "bf16_vs_fp32": ratios}
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
