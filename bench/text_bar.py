"""The text recipe (configs/text.yaml) against the classical bar on several text sets (issue 28): per set and
seed, the bar (growpipe baseline: TF-IDF + logistic regression on the run's own rows) and every rule on the
reference trainer, the best validation epoch restored (eval.restore_best; its checkpoints go to a temporary
directory under --checkpoint-dir, removed after each run).

    .venv/bin/python bench/text_sets.py --out bench/out/text-sets     # news-leads, news-pair
    .venv/bin/python bench/text_bar.py --json-out bench/out/text-bar.json \\
        --sets 20newsgroups,bench/out/text-sets/news-leads,bench/out/text-sets/news-pair
    .venv/bin/python bench/text_bar.py --quick --sets bench/out/text-sets/news-pair --methods bp,dascpl

A set is `20newsgroups` or a directory with train.parquet and test.parquet (text, label). Prints a Markdown
table per set: the bar, then per rule the test accuracy of the full path, the best exit's, the selected epoch,
seconds of the whole run (load, train, evaluate; the JSON has train_seconds too), and the gaps to the bar and to
BP in points; with several --seeds, their means. Writes every row as JSON (after each set).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.baseline import classical_bar  # noqa: E402
from growpipe.config import RunConfig, load_config  # noqa: E402
from growpipe.errors import ConfigError, DataError, GrowpipeError, NonFiniteError, ShapeError  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.local import train_local  # noqa: E402

METHODS = ("bp", "al", "scpl", "dascpl")
NEWSGROUPS = "20newsgroups"
QUICK = ("data.limit_train=600", "data.limit_test=300", "train.epochs=2")
DEFAULT_SETS = f"{NEWSGROUPS},bench/out/text-sets/news-leads,bench/out/text-sets/news-pair"


def data_name(item: str) -> tuple[str, str]:
    """A --sets item as (label, data.name): 20newsgroups itself, or a parquet directory."""
    if item == NEWSGROUPS:
        return item, item
    d = Path(item)
    missing = [f for f in ("train.parquet", "test.parquet") if not (d / f).is_file()]
    if missing:
        raise ConfigError(f"--sets: {item} lacks {', '.join(missing)}; give {NEWSGROUPS} or a directory that "
                          "bench/text_sets.py wrote (train.parquet, test.parquet)")  # fmt: skip
    return d.resolve().name, f"parquet:{d.resolve()}"


def run_config(config: Path, name: str, method: str, seed: int, threads: int, overrides: list[str],
               checkpoints: Path) -> RunConfig:  # fmt: skip
    """The run of `method` on data `name`: the config, --set overrides, then what this benchmark fixes (no
    MLflow; checkpoints kept for eval.restore_best, only the start's and the best epoch's)."""
    fixed = [f"data.name={name}", f"method={method}", f"seed={seed}", f"threads={threads}", "tracking.mlflow=false",
             "checkpoint.enabled=true", f"checkpoint.uri={checkpoints}", "checkpoint.every_epochs=0"]  # fmt: skip
    return load_config(config, [*overrides, *fixed])


def train_row(cfg: RunConfig, checkpoints: Path) -> dict[str, Any]:
    """One reference-trainer run of `cfg` (checkpoints in a fresh directory under `checkpoints`, removed after):
    full-path and exit accuracies, the selected epoch, seconds; a run that diverged gives its error instead."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{cfg.method}-", dir=checkpoints))
    cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"uri": str(tmp)})})
    start = time.perf_counter()
    try:
        s = train_local(cfg, progress=None).summary()
    except NonFiniteError as e:
        return {"error": str(e).splitlines()[0], "seconds": round(time.perf_counter() - start, 1)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    exits = s["exit_accuracy"]
    best = max(range(len(exits)), key=exits.__getitem__)
    return {
        "test_accuracy": s["test_accuracy"],
        "exit_accuracy": exits,
        "best_exit": best + 1,
        "best_exit_accuracy": exits[best],
        "selected_epoch": s["selected_epoch"],
        "val_accuracy": best_val(s["history"]),
        "epochs": s["epochs"],
        "seconds": round(time.perf_counter() - start, 1),
        "train_seconds": s["train_seconds"],
    }


def best_val(history: list[dict[str, Any]]) -> float | None:
    """The best validation accuracy of a run's epochs (the selected one's): what a recipe choice may read."""
    return max((h["val_accuracy"] for h in history if h.get("val_accuracy") is not None), default=None)


def points(a: float | None, b: float | None) -> float | None:
    """a - b in accuracy points (None when either is missing)."""
    return None if a is None or b is None else round(100 * (a - b), 2)


def add_gaps(rows: list[dict[str, Any]]) -> None:
    """Each rule row's gap to its set and seed's bar and BP run, in points (full path; best exit to the bar)."""
    bars = {(r["set"], r["seed"]): r.get("accuracy") for r in rows if r["method"] == "bar"}
    bps = {(r["set"], r["seed"]): r.get("test_accuracy") for r in rows if r["method"] == "bp"}
    for r in rows:
        if r["method"] != "bar":
            key = (r["set"], r["seed"])
            r["vs_bar_points"] = points(r.get("test_accuracy"), bars.get(key))
            r["best_exit_vs_bar_points"] = points(r.get("best_exit_accuracy"), bars.get(key))
            r["vs_bp_points"] = None if r["method"] == "bp" else points(r.get("test_accuracy"), bps.get(key))


def seed_means(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per set and model, the mean over seeds of every figure (rows of runs that failed left out)."""
    out = []
    for s in dict.fromkeys(r["set"] for r in rows):
        for m in dict.fromkeys(r["method"] for r in rows if r["set"] == s):
            group = [r for r in rows if r["set"] == s and r["method"] == m and "error" not in r and "skipped" not in r]
            mean = {"set": s, "method": m, "seed": "mean", "seeds": len(group)}
            for key in ("accuracy", "test_accuracy", "best_exit_accuracy", "seconds", "vs_bar_points",
                        "best_exit_vs_bar_points", "vs_bp_points"):  # fmt: skip
                values = [r[key] for r in group if r.get(key) is not None]
                if values:
                    mean[key] = round(statistics.fmean(values), 4)
            out.append(mean)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """A set's rows as Markdown."""

    def f(v: Any, fmt: str = ".4f") -> str:
        return "" if v is None else format(v, fmt)

    def gap(v: Any) -> str:
        return "" if v is None else f"{v:+.2f}"

    head = ("seed", "model", "test acc", "best exit", "selected epoch", "s", "vs bar (pt)", "best exit vs bar",
            "vs BP (pt)")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if r["method"] == "bar":
            model = r.get("kind", "bar")
            acc = f(r.get("accuracy")) or f"skipped: {r.get('skipped')}"
            lines.append(f"| {r['seed']} | {model} | {acc} |  |  | {f(r.get('seconds'), '.1f')} |  |  |  |")
            continue
        if "error" in r:
            lines.append(f"| {r['seed']} | {r['method']} | failed: {r['error']} |  |  | {r['seconds']} |  |  |  |")
            continue
        several = len(r.get("exit_accuracy", ())) > 1 or r["seed"] == "mean"  # one exit: the full path itself
        exit_ = f(r.get("best_exit_accuracy")) if several else ""
        exit_ += f" (@{r['best_exit']})" if several and "best_exit" in r else ""
        lines.append(f"| {r['seed']} | {r['method']} | {f(r.get('test_accuracy'))} | {exit_} | "
                     f"{f(r.get('selected_epoch'), 'd')} | {f(r.get('seconds'), '.1f')} | "
                     f"{gap(r.get('vs_bar_points'))} | {gap(r.get('best_exit_vs_bar_points'))} | "
                     f"{gap(r.get('vs_bp_points'))} |")  # fmt: skip
    return "\n".join(lines)


def csv(raw: str, flag: str) -> list[str]:
    """A comma-separated flag's items (at least one)."""
    items = [p.strip() for p in raw.split(",") if p.strip()]
    if not items:
        raise ConfigError(f"{flag}: nothing given; give a comma-separated list")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=DEFAULT_SETS, help=f"comma-separated: {NEWSGROUPS} or parquet directories "
                    f"(default {DEFAULT_SETS})")  # fmt: skip
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated rules")
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "text.yaml", help="default configs/text.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override applied to every run")  # fmt: skip
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each run (default 1)")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {' '.join(QUICK)}")
    ap.add_argument("--checkpoint-dir", type=Path, default=REPO / "bench" / "out" / "text-bar-checkpoints",
                    help="each run's temporary checkpoints (default bench/out/text-bar-checkpoints)")  # fmt: skip
    ap.add_argument("--json-out", metavar="FILE", help="write every row as JSON")
    args = ap.parse_args(argv)
    base = [*(QUICK if args.quick else ()), *args.overrides]
    try:
        sets = [data_name(item) for item in csv(args.sets, "--sets")]
        methods = csv(args.methods, "--methods")
        if unknown := [m for m in methods if m not in METHODS]:
            raise ConfigError(f"--methods: {', '.join(unknown)} not known; choose from {', '.join(METHODS)}")
        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads}: give 1 or more")
        try:
            seeds = [int(s) for s in csv(args.seeds, "--seeds")]
        except ValueError:
            raise ConfigError(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2") from None
        configs = {(label, m, seed): run_config(args.config, name, m, seed, args.threads, base, args.checkpoint_dir)
                   for label, name in sets for seed in seeds for m in methods}  # fmt: skip  # bad input fails here
    except GrowpipeError as e:
        print(f"text_bar.py: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    settings = {"config": str(args.config), "overrides": base, "seeds": seeds, "threads": args.threads,
                "quick": args.quick, "methods": methods, "sets": dict(sets)}  # fmt: skip
    try:
        for label, name in sets:
            for seed in seeds:
                bar = classical_bar(configs[label, methods[0], seed])  # the rows every rule trains and tests on
                rows.append({"set": label, "data": name, "seed": seed, "method": "bar", **bar})
                print(f"== {label} seed {seed}: bar {bar.get('accuracy', bar.get('skipped'))}", flush=True)
                for m in methods:
                    row = {"set": label, "data": name, "seed": seed, "method": m,
                           **train_row(configs[label, m, seed], args.checkpoint_dir)}  # fmt: skip
                    rows.append(row)
                    print(f"== {label} seed {seed}: {m} {row.get('error') or format(row['test_accuracy'], '.4f')} "
                          f"({row['seconds']} s)", flush=True)  # fmt: skip
            add_gaps(rows)
            mine = [r for r in rows if r["set"] == label]
            print(f"\n#### {label} ({name})\n\n{table(mine + (seed_means(mine) if len(seeds) > 1 else []))}\n",
                  flush=True)  # fmt: skip
            if args.json_out:  # after every set: a long run that fails later keeps the sets it finished
                means = seed_means(rows) if len(seeds) > 1 else []
                atomic_write_json(args.json_out, {"settings": settings, "rows": rows, "means": means})
    except (DataError, ShapeError) as e:
        print(f"text_bar.py: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        if args.checkpoint_dir.is_dir() and not any(args.checkpoint_dir.iterdir()):
            args.checkpoint_dir.rmdir()
    if args.json_out:
        print(f"JSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
