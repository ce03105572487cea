"""Reference-trainer figures: test accuracy (full path and every exit) and seconds per epoch for BP, AL,
SCPL and DASCPL on the same data, blocks, epochs and batch size.

    .venv/bin/python bench/reference.py --suite fashion-mnist --json-out bench/out/reference-fm.json
    .venv/bin/python bench/reference.py --quick            # digits, 1 epoch: a smoke run

Each row is what `growpipe train --config configs/SUITE-METHOD.yaml --runtime local` gives; the command is
recorded with the row. Prints a Markdown table for bench/RESULTS.md and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from growpipe.config import load_config
from growpipe.fsutil import atomic_write_json
from growpipe.local import train_local

REPO = Path(__file__).resolve().parents[1]
METHODS = ("bp", "al", "scpl", "dascpl")


def run_suite(suite: str, methods: list[str], overrides: list[str], progress: bool) -> list[dict]:
    """Train every method on one suite's config; one row per method."""
    rows = []
    for method in methods:
        config = REPO / "configs" / f"{suite}-{method}.yaml"
        cfg = load_config(config, [*overrides, "tracking.mlflow=false"])
        command = " ".join(
            ["growpipe train --runtime local", f"--config configs/{config.name}", *(f"--set {o}" for o in overrides)]
        )
        print(f"== {suite} / {method}: {command}", flush=True)
        start = time.perf_counter()
        s = train_local(cfg, progress=print if progress else None).summary()
        rows.append(
            {
                "suite": suite,
                "method": method,
                "backbone": s["backbone"],
                "blocks": s["blocks"],
                "epochs": s["epochs"],
                "batch_size": cfg.data.batch_size,
                "test_accuracy": s["test_accuracy"],
                "exit_depths": s["exit_depths"],
                "exit_accuracy": s["exit_accuracy"],
                "seconds_per_epoch": s["seconds_per_epoch"],
                "wall_seconds": round(time.perf_counter() - start, 1),
                "command": command,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table, with each rule's gap to BP on the same suite."""
    bp = {r["suite"]: r["test_accuracy"] for r in rows if r["method"] == "bp"}
    out = [
        "| suite | method | blocks | epochs | test acc (full path) | vs BP (points) | accuracy per exit | s/epoch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        gap = f"{100 * (r['test_accuracy'] - bp[r['suite']]):+.2f}" if r["suite"] in bp else "n/a"
        exits = ", ".join(f"@{d}: {a:.4f}" for d, a in zip(r["exit_depths"], r["exit_accuracy"], strict=True))
        out.append(
            f"| {r['suite']} | {r['method']} | {r['blocks']} | {r['epochs']} | {r['test_accuracy']:.4f} | {gap} | "
            f"{exits} | {r['seconds_per_epoch']:.1f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--suite", default="fashion-mnist", help="config prefix in configs/: digits, fashion-mnist, 20newsgroups"
    )
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated rules (default: all four)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to every method")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="digits, 1 epoch: checks the benchmark runs")
    ap.add_argument("--progress", action="store_true", help="print per-epoch lines")
    ap.add_argument("--json-out", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    suite, overrides = args.suite, list(args.overrides)
    if args.quick:
        suite, overrides = "digits", [*overrides, "train.epochs=1", "net.width=64"]
    rows = run_suite(suite, args.methods.split(","), overrides, args.progress)
    print(markdown(rows))
    if args.json_out:
        atomic_write_json(args.json_out, {"suite": suite, "rows": rows})
        print(f"JSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
