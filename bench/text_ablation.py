"""Text-model ablation: each deviation of growpipe's sequence models from the seeds' code, one at a time and
together, on the 20 Newsgroups transformer suite of `bench compare` (reference trainer, same seed). Later
overrides win, so each variant states every setting it depends on.

    .venv/bin/python bench/text_ablation.py --json-out bench/out/text-ablation.json
    .venv/bin/python bench/text_ablation.py --variants shipped,identity --methods bp,scpl --ks 2
    .venv/bin/python bench/text_ablation.py --runs shipped/bp,seeds/scpl   # just these (variant/method)
    .venv/bin/python bench/text_ablation.py --quick        # 640 documents, 2 epochs: a smoke run

Prints a Markdown table (accuracy of the full path and of every exit, seconds) and writes JSON (with each
run's per-epoch test accuracy, full path and every exit).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from compare import SUITES  # noqa: E402

from growpipe.config import load_config  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.local import train_local  # noqa: E402

# Before issue 18: N(0, 1) token and position vectors, no final LayerNorm, feed-forward 4 x 64, an MLP
# projector and a linear classifier (and no input LayerNorm on the blocks or the classifiers, which came with
# issue 28). Each variant changes that starting point; "now" is what the suite runs today (growpipe's defaults
# plus the suite's overrides in bench/compare.py): the seeds' projector and feed-forward width, embeddings at
# std 0.02, learned positions, no final LayerNorm, a LayerNorm on each transformer block's input and on each
# classifier's input, linear classifiers.
BEFORE = ("net.embed_init_std=1.0", "net.positions=learned", "net.final_norm=false", "net.ff_width=256",
          "scpl.projector=mlp", "scpl.classifier=linear", "net.input_norm=false",
          "scpl.classifier_norm=false")  # fmt: skip
SEEDS = ("scpl.projector=identity", "net.positions=none", "net.final_norm=true", "net.ff_width=64",
         "scpl.classifier=mlp")  # fmt: skip
VARIANTS: dict[str, tuple[str, ...]] = {
    "shipped": BEFORE,
    "identity": (*BEFORE, "scpl.projector=identity"),
    "init0.02": (*BEFORE, "net.embed_init_std=0.02"),
    "nopos": (*BEFORE, "net.positions=none"),
    "finalnorm": (*BEFORE, "net.final_norm=true"),
    "mlpcls": (*BEFORE, "scpl.classifier=mlp"),
    "seeds": (*BEFORE, *SEEDS),
    "seeds+init0.02": (*BEFORE, *SEEDS, "net.embed_init_std=0.02"),
    "now": (),
    "seeds+init0.02-finalnorm": (*BEFORE, *SEEDS, "net.embed_init_std=0.02", "net.final_norm=false"),
    "seeds+init0.02+positions": (*BEFORE, *SEEDS, "net.embed_init_std=0.02", "net.positions=learned"),
}


def run(method: str, k: int, overrides: list[str]) -> dict:
    """One reference-trainer run of the suite's config for `method` with K blocks and `overrides`."""
    cfg = load_config(REPO / "configs" / f"20newsgroups-{method}.yaml",
                      [*overrides, f"net.blocks={k}", "tracking.mlflow=false", "checkpoint.enabled=false"])  # fmt: skip
    start = time.perf_counter()
    s = train_local(cfg, progress=None).summary()
    curve = [{"epoch": i + 1, "test_accuracy": h["test_accuracy"], "exit_accuracy": h["exit_accuracy"]}
             for i, h in enumerate(s["history"])]  # fmt: skip
    return {"test_accuracy": s["test_accuracy"], "exit_accuracy": s["exit_accuracy"],
            "seconds": round(time.perf_counter() - start, 1), "history": curve}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--methods", default="bp,al,scpl,dascpl", help="comma-separated rules")
    ap.add_argument("--ks", default="2", help="comma-separated block counts K")
    ap.add_argument("--runs", help="comma-separated variant/method pairs instead of every variant x method")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to every run")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="the compare suite's quick sizes")
    ap.add_argument("--json-out", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    suite = SUITES["20newsgroups"]
    base = list(suite.quick if args.quick else suite.overrides) + args.overrides
    if args.runs:
        pairs = [tuple(r.split("/", 1)) for r in args.runs.split(",")]
    else:
        pairs = [(v, m) for v in args.variants.split(",") for m in args.methods.split(",")]
    unknown = [v for v, _ in pairs if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    rows = []
    print("| variant | method | K | test acc | per exit | s |\n| --- | --- | --- | --- | --- | --- |", flush=True)
    for variant, method in pairs:
        for k in map(int, args.ks.split(",")):
            extra = [o for o in VARIANTS[variant] if method != "bp" or not o.startswith("scpl.")]
            row = {"variant": variant, "method": method, "k": k, "overrides": extra, **run(method, k, base + extra)}
            rows.append(row)
            exits = ", ".join(f"{a:.3f}" for a in row["exit_accuracy"])
            print(f"| {variant} | {method} | {k} | {row['test_accuracy']:.4f} | {exits} | {row['seconds']} |",
                  flush=True)  # fmt: skip
    if args.json_out:
        atomic_write_json(args.json_out, {"base": base, "rows": rows})
        print(f"JSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
