"""Method comparison: BP (single process, Ray Train data-parallel, GPipe and async 1F1B + SpecTrain on the
stage actors), the local rules (AL, SCPL, DASCPL on the Ray pipeline) and PyTorch's own GPipe
(torch.distributed.pipelining), on the same blocks, data and batches, for each dataset and stage count K.

Per cell: test accuracy, samples/s (median of the epochs after the first), training time to the target
accuracy (a fraction of single-process BP's best, or of the best method's when bp is left out), and
their ratios against single-process BP and against torch's GPipe, measured in one run of this script;
with --repeats N (odd) each cell trains N times and its median run by samples/s is reported. Prints
Markdown tables, writes JSON, one PNG of accuracy vs wall time per dataset and K, and (with
--results-md) the tables into bench/RESULTS.md.

    .venv/bin/growpipe bench compare --quick --json-out bench/out/compare-quick.json
    .venv/bin/growpipe bench compare --json-out bench/out/compare.json --results-md bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import median_rate

from growpipe.config import RunConfig, load_config
from growpipe.fsutil import atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def markers(suite: str) -> tuple[str, str]:
    """The comments around one suite's tables in a results file: a run rewrites only its own suites."""
    return f"<!-- bench compare {suite}: begin -->", f"<!-- bench compare {suite}: end -->"


@dataclass(frozen=True)
class Suite:
    """A dataset and model: the configs/ prefix and the settings every method shares on it."""

    overrides: tuple[str, ...]
    quick: tuple[str, ...]
    widths: tuple[int, ...] = ()
    """per-block widths of a CNN (the first K are used); empty: net.width for every block."""


# The transformer suite keeps the data it was measured on before configs/20newsgroups-*.yaml became
# `base: text.yaml` (issue 28): every word, no length percentile, no validation split, no word dropout (and no
# data.adapt, which chooses for a bag).
PRE_TEXT_RECIPE = ("data.min_count=1", "data.max_len_percentile=null", "data.val_fraction=0", "net.word_dropout=0",
                   "data.adapt=false")  # fmt: skip
SUITES = {
    "fashion-mnist": Suite(
        overrides=("data.limit_train=11904", "data.limit_test=2000", "train.epochs=6"),
        quick=("data.limit_train=640", "data.limit_test=256", "train.epochs=2"),
        widths=(32, 64, 128, 256),
    ),
    "20newsgroups": Suite(  # embedding, then K-1 transformer layers (mean-pooled): the sequence model
        overrides=(
            "net.backbone=transformer",
            "net.pooling=mean",
            "net.width=64",
            "net.heads=4",
            "net.embed_dim=64",
            "data.max_len=96",
            "data.vocab_size=30000",
            "net.dropout=0.1",
            "net.ff_width=64",  # the seeds' feed-forward width and projector (bench/text_ablation.py)
            "scpl.projector=identity",  # classifiers linear, as BP's (the seeds' Linear-Tanh-Linear: 2.8 points lower)
            "data.limit_train=5952",
            "data.limit_test=2000",
            "train.epochs=12",  # the local rules start slower here: at 4 epochs none has learned the task
            *PRE_TEXT_RECIPE,
        ),  # fmt: skip
        quick=(
            "net.backbone=transformer",
            "net.pooling=mean",
            "net.width=32",
            "net.heads=2",
            "net.embed_dim=32",
            "data.max_len=32",
            "data.vocab_size=5000",
            "net.dropout=0.1",
            "data.limit_train=640",
            "data.limit_test=256",
            "train.epochs=2",
            *PRE_TEXT_RECIPE,
        ),  # fmt: skip
    ),
}


@dataclass(frozen=True)
class Method:
    label: str
    rule: str
    """configs/SUITE-RULE.yaml the run starts from."""
    overrides: tuple[str, ...] = ()


METHODS = {
    "bp": Method("BP, single process", "bp"),
    "ddp": Method("BP, data-parallel (Ray Train DDP)", "bp", ("runtime.engine=ddp",)),
    "gpipe": Method("BP, GPipe (stage actors)", "bp", ("runtime.engine=gpipe",)),
    "1f1b": Method("BP, async 1F1B + SpecTrain", "bp", ("runtime.engine=1f1b", "bp_pipeline.spectrain=true")),
    "al": Method("AL (Ray pipeline)", "al"),
    "scpl": Method("SCPL (Ray pipeline)", "scpl"),
    "dascpl": Method("DASCPL (Ray pipeline)", "dascpl"),
    "torch-gpipe": Method("torch.distributed.pipelining GPipe", "bp"),
}


def run_config(suite: str, method: str, k: int, quick: bool, extra: list[str]) -> RunConfig:
    """The config one cell of the comparison trains."""
    s, m = SUITES[suite], METHODS[method]
    sets = [*(s.quick if quick else s.overrides), f"net.blocks={k}"]
    if s.widths:
        if k > len(s.widths):
            raise SystemExit(f"--ks: {suite} has {len(s.widths)} blocks at most; use K <= {len(s.widths)}")
        sets.append(f"net.widths=[{','.join(map(str, s.widths[:k]))}]")
    sets += [*m.overrides, f"name=compare-{suite}-{method}-k{k}", f"threads={k}", "tracking.mlflow=false",
             "checkpoint.enabled=false", "runtime.dashboard=false", "runtime.timeline_epoch=0", *extra]  # fmt: skip
    return load_config(REPO / "configs" / f"{suite}-{m.rule}.yaml", sets)


def train(method: str, cfg: RunConfig, k: int) -> dict[str, Any]:
    """Train one method; return its result JSON (growpipe's summary format)."""
    if method == "torch-gpipe":
        from torch_gpipe import train_torch_gpipe

        return train_torch_gpipe(cfg, k, cfg.bp_pipeline.micro_batches)
    from growpipe.api import train as train_run  # every other method: one engine each, the same run loop

    return train_run(cfg, "local" if method == "bp" else "ray", progress=None).result


def curve(history: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(cumulative training seconds, test accuracy) after each epoch."""
    t, out = 0.0, []
    for h in history:
        t += h["seconds"]
        out.append((round(t, 3), h["test_accuracy"]))
    return out


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds until the first epoch at or above target (None: never reached)."""
    return next((t for t, a in points if a >= target), None)


def measure(suite: str, method: str, k: int, quick: bool, extra: list[str]) -> dict[str, Any]:
    cfg = run_config(suite, method, k, quick, extra)
    start = time.perf_counter()
    row: dict[str, Any] = {"suite": suite, "k": k, "method": method, "label": METHODS[method].label}
    try:
        s = train(method, cfg, k)
    except Exception as e:  # one failed cell is reported, the others still run
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return row
    row.update(
        test_accuracy=s["test_accuracy"],
        best_accuracy=max(h["test_accuracy"] for h in s["history"]),
        samples_per_second=median_rate(s["history"]),
        train_seconds=s["train_seconds"],
        curve=curve(s["history"]),
        wall_seconds=round(time.perf_counter() - start, 1),
        epochs=len(s["history"]),
        backbone=s["backbone"],
    )
    return row


def measure_repeated(suite: str, method: str, k: int, quick: bool, extra: list[str], repeats: int) -> dict[str, Any]:
    """Train one cell `repeats` (odd) times; return the median run by samples/s (every figure of the row comes from
    that one run) with each run's samples/s and test accuracy beside it. A failed run fails the cell."""
    runs = []
    for i in range(repeats):
        runs.append(measure(suite, method, k, quick, extra))
        if "error" in runs[-1]:
            return runs[-1]
        if repeats > 1:
            r = runs[-1]
            print(f"    run {i + 1}/{repeats}: test acc {r['test_accuracy']:.4f}  "
                  f"{r['samples_per_second']:,.0f} samples/s", flush=True)  # fmt: skip
    ordered = sorted(runs, key=lambda r: r["samples_per_second"])
    row = dict(ordered[len(ordered) // 2])
    row.update(
        repeats=repeats,
        samples_per_second_runs=[r["samples_per_second"] for r in runs],
        test_accuracy_runs=[r["test_accuracy"] for r in runs],
    )
    return row


def add_ratios(rows: list[dict[str, Any]], target_fraction: float) -> dict[tuple[str, int], float]:
    """Fill each row's target time and ratios against BP and torch GPipe of the same suite and K; returns
    the target accuracy of each (suite, K)."""
    targets = {}
    for key in {(r["suite"], r["k"]) for r in rows}:
        cell = {r["method"]: r for r in rows if (r["suite"], r["k"]) == key and "error" not in r}
        if not cell:
            continue
        ref = cell.get("bp") or max(cell.values(), key=lambda r: r["best_accuracy"])
        targets[key] = target = round(target_fraction * ref["best_accuracy"], 4)
        for r in cell.values():
            r["target_accuracy"] = target
            r["target_reference"] = ref["method"]  # bp, or the best method when bp did not run
            r["time_to_target"] = time_to(r["curve"], target)
            for peer in ("bp", "torch-gpipe"):
                p = cell.get(peer)
                r[f"rate_vs_{peer}"] = r["samples_per_second"] / p["samples_per_second"] if p else None
                r[f"acc_vs_{peer}_points"] = 100 * (r["test_accuracy"] - p["test_accuracy"]) if p else None
            bp_t = cell["bp"].get("time_to_target") if "bp" in cell else None
            r["time_to_target_speedup_vs_bp"] = bp_t / r["time_to_target"] if bp_t and r["time_to_target"] else None
    return targets


def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def markdown(rows: list[dict[str, Any]], heading: bool = True) -> str:
    """One table per suite: every K and method, with the ratios (under a heading naming the suite and backbone)."""
    out = []
    for suite in dict.fromkeys(r["suite"] for r in rows):
        if heading:
            backbone = next((r["backbone"] for r in rows if r["suite"] == suite and "error" not in r), "?")
            out += [f"#### {suite} ({backbone})", ""]
        out += [
            "| K | method | test acc | vs BP (points) | samples/s | x BP | x torch GPipe | target acc (of) | "
            "s to target | speed-up to target vs BP |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in (r for r in rows if r["suite"] == suite):
            if "error" in r:
                out.append(f"| {r['k']} | {r['label']} | failed: {r['error']} | | | | | | | |")
                continue
            out.append(
                f"| {r['k']} | {r['label']} | {r['test_accuracy']:.4f} | {_f(r['acc_vs_bp_points'], '+.2f')} | "
                f"{r['samples_per_second']:,.0f} | {_f(r['rate_vs_bp'], '.2f')} | "
                f"{_f(r['rate_vs_torch-gpipe'], '.2f')} | {r['target_accuracy']:.4f} ({r['target_reference']}) | "
                f"{_f(r['time_to_target'], '.1f')} | {_f(r['time_to_target_speedup_vs_bp'], '.2f')} |"
            )
        out.append("")
    return "\n".join(out)


def write_plots(rows: list[dict[str, Any]], targets: dict[tuple[str, int], float], out_dir: Path) -> list[str]:
    """One PNG per (suite, K): accuracy vs training time, one line per method."""
    from growpipe.plots import plot_accuracy_vs_time

    paths = []
    for (suite, k), target in sorted(targets.items()):
        curves = {r["label"]: r["curve"] for r in rows if (r["suite"], r["k"]) == (suite, k) and "error" not in r}
        path = out_dir / f"compare-{suite}-k{k}.png"
        paths.append(str(plot_accuracy_vs_time(curves, path, f"{suite}, K = {k}", target)))
    return paths


def update_results(path: Path, sections: dict[str, str]) -> Path:
    """Replace each suite's text between its markers in a Markdown file (append it when absent)."""
    text = path.read_text() if path.exists() else ""
    for suite, section in sections.items():
        begin, end = markers(suite)
        block = f"{begin}\n{section.rstrip()}\n{end}"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            text = head + block + rest.split(end, 1)[1]
        else:
            text = text.rstrip() + ("\n\n" if text else "") + block + "\n"
    return atomic_write_text(path, text)


def _csv(value: str, allowed: Callable[[str], bool], flag: str, choices: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if not allowed(v)]
    if bad or not items:
        raise SystemExit(f"{flag}: {', '.join(bad) or 'nothing given'} not known; choose from {choices}")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny data and 2 epochs per run: a smoke run of every cell")
    ap.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, from {', '.join(SUITES)}")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--ks", default="2,4", help="stage counts K (= blocks), comma-separated (default 2,4)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="train each cell N times, report its median run by samples/s (default 1; odd N)")  # fmt: skip
    ap.add_argument("--target-fraction", type=float, default=0.95,
                    help="target = this x the best accuracy of single-process BP (or of the best method)")  # fmt: skip
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run, e.g. --set train.epochs=6")  # fmt: skip
    ap.add_argument("--json-out", metavar="FILE", help="write every row and ratio as JSON")
    ap.add_argument("--plot-dir", metavar="DIR", help="where the PNGs go (default: beside --json-out, else bench/out)")
    ap.add_argument("--results-md", metavar="FILE", help="write the tables into FILE between the bench-compare markers")
    args = ap.parse_args(argv)
    suites = _csv(args.suites, SUITES.__contains__, "--suites", ", ".join(SUITES))
    methods = _csv(args.methods, METHODS.__contains__, "--methods", ", ".join(METHODS))
    ks = [int(k) for k in _csv(args.ks, lambda v: v.isdigit() and int(v) >= 1, "--ks", "whole numbers >= 1")]
    if args.repeats < 1 or args.repeats % 2 == 0:
        raise SystemExit(f"--repeats: {args.repeats} has no middle run; give an odd count, e.g. --repeats 3")
    if not 0 < args.target_fraction <= 1:
        raise SystemExit("--target-fraction: must be in (0, 1], e.g. 0.95")
    cells = [(s, k, m) for s in suites for k in ks for m in methods]
    configs = {c: run_config(c[0], c[2], c[1], args.quick, args.overrides) for c in cells}  # bad input fails here
    plot_dir = Path(args.plot_dir or (Path(args.json_out).parent if args.json_out else REPO / "bench" / "out"))

    import ray

    from growpipe.runtime.pipeline import connect

    first = next(iter(configs.values()))
    if "ddp" in methods:  # Ray Train's placement-group cleaner polls the State API, which the dashboard serves
        first = first.model_copy(update={"runtime": first.runtime.model_copy(update={"dashboard": True})})
    owns, _ = connect(first, cpus=max(os.cpu_count() or 1, 2 * max(ks) + 1))
    start, rows = time.perf_counter(), []
    try:
        for i, (suite, k, method) in enumerate(cells, 1):
            print(f"[{i}/{len(cells)}] {suite} K={k} {METHODS[method].label} ...", flush=True)
            rows.append(measure_repeated(suite, method, k, args.quick, args.overrides, args.repeats))
            r = rows[-1]
            print("    " + (f"FAILED {r['error']}" if "error" in r else
                            f"test acc {r['test_accuracy']:.4f}  {r['samples_per_second']:,.0f} samples/s  "
                            f"{r['wall_seconds']:.0f} s"), flush=True)  # fmt: skip
    finally:
        if owns:
            ray.shutdown()
    targets = add_ratios(rows, args.target_fraction)
    seconds = round(time.perf_counter() - start, 1)
    settings = {"quick": args.quick, "repeats": args.repeats, "target_fraction": args.target_fraction,
                "overrides": args.overrides,
                "suites": {s: list(SUITES[s].quick if args.quick else SUITES[s].overrides) for s in suites},
                "cpus": os.cpu_count(), "seconds": seconds}  # fmt: skip
    out = {"rows": rows, "targets": {f"{s}/k{k}": t for (s, k), t in targets.items()}, "settings": settings}
    if args.json_out:  # first: the measurements survive a failing plot
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    table = markdown(rows)
    print(table)
    out["plots"] = plots = write_plots(rows, targets, plot_dir)
    print("plots: " + ", ".join(plots))
    if args.json_out:
        atomic_write_json(args.json_out, out)
    if args.results_md:
        cmd = "growpipe bench compare " + " ".join(argv if argv is not None else sys.argv[1:])
        runs = f"median run of {args.repeats} by samples/s" if args.repeats > 1 else "one run"
        note = (f"Reproduce: `{cmd}` ({seconds:.0f} s, {os.cpu_count()} CPUs; each cell: {runs}). Target accuracy: "
                f"{args.target_fraction:g} x the best epoch of the method in brackets (single-process BP when it "
                "ran). Plots: ")  # fmt: skip
        # RESULTS.md's layout: each suite's table under the heading of its own section, then its command
        sections = {s: markdown([r for r in rows if r["suite"] == s], heading=False) + "\n" + note
                    + ", ".join(f"`{Path(p).name}`" for p in plots if f"compare-{s}-" in Path(p).name)
                    for s in suites}  # fmt: skip
        print(f"results: {update_results(Path(args.results_md), sections)}")
    print(f"done in {seconds} s")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
