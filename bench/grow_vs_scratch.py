"""Grow vs scratch: is growing a net while it trains better than training the final net from the start?

Per suite, rule and seed, the same final architecture (K blocks, the suite's widths) trained two ways on the
Ray pipeline (the local rules; method bp on GPipe stage actors):

  - scratch: K blocks from the first epoch, E epochs;
  - grown-frozen: 1 block, one more every E/K epochs (a layer step of the next block's width), the earlier
    blocks frozen and their outputs cached: each phase trains one block;
  - grown-all: the same growth, every block training on (grow.freeze false: the local losses need no backward
    pass through the blocks below, so they keep learning while the net grows);
  - grown-joint: grown-frozen, then a joint phase (grow.joint: --joint-epochs more epochs in which every block
    learns again, at --joint-lr times its rate; their time and MACs count);
  both grown arms start a block with `grow.init` preserve where the blocks allow it (its output has its
  input's shape), else fresh, and evaluate the net just before and just after each growth
  (grow.eval_at_growth: its cost is in their seconds).

After each epoch: test accuracy, wall-clock seconds since the run was asked for (start-up, growth and
evaluation included) and training MACs so far (3 x the forward MACs of each training block per sample; a
frozen block's forward once per cache, every epoch without one). Per run: the seconds and MACs at which it first
reaches the scratch arm's final accuracy (mean over seeds) minus 0.5 point; per suite, rule and grown arm: its
time and MACs to that target as fractions of the scratch arm's total, the final accuracies, and the largest
drop of accuracy at a growth. Seed 0 of each grown arm is also trained by the single-process reference trainer
(--reference) as a check of the pipeline's accuracy. Prints a Markdown table, writes JSON and one PNG
per suite (accuracy vs seconds and vs MACs, mean of the seeds).

    .venv/bin/growpipe bench grow-vs-scratch --quick --json-out bench/out/grow_vs_scratch-quick.json
    .venv/bin/python bench/grow_vs_scratch.py --suites digits,fashion-mnist --methods dascpl,al \\
        --json-out bench/out/grow_vs_scratch.json
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import RunConfig, load_config  # noqa: E402
from growpipe.errors import ConfigError  # noqa: E402
from growpipe.outputs import write_png  # noqa: E402
from growpipe.report import end_bench  # noqa: E402

TARGET_GAP = 0.005  # the target: the scratch arm's final accuracy minus half a point


@dataclass(frozen=True)
class Suite:
    config: str  # configs/ file, {rule} filled in
    widths: list[int]  # the final net's block widths (K = len)
    epochs: int  # E, a multiple of K
    overrides: list[str] = field(default_factory=list)


SUITES = {
    "fashion-mnist": Suite("fashion-mnist-{rule}.yaml", [32, 64, 128, 256], 8, ["net.backbone=cnn"]),
    "digits": Suite("digits-{rule}.yaml", [128, 128, 128, 128], 12, ["net.residual=true"]),
    "text": Suite("text.yaml", [256, 256], 8, ["method={rule}"]),
}
METHODS = ("al", "scpl", "dascpl", "bp")
ARMS = ("scratch", "grown-frozen", "grown-all", "grown-joint")
QUICK = ["data.limit_train=256", "data.limit_test=128"]


def widths_override(suite: Suite, k: int) -> str:
    """The net's first k widths, as the backbone's field takes them (a CNN: per block; else one width)."""
    if "net.backbone=cnn" in suite.overrides:
        return f"net.widths=[{','.join(map(str, suite.widths[:k]))}]"
    return f"net.width={suite.widths[0]}"


def arm_overrides(suite: Suite, arm: str, epochs: int, init: str, joint: tuple[int, float] = (1, 0.3)) -> list[str]:
    """What one arm sets on the suite's config: scratch K blocks for `epochs`; a grown arm 1 block, then a layer
    step of the next width every epochs/K epochs, the earlier blocks frozen (grown-frozen, grown-joint: then
    `joint` = (epochs, lr factor) of grow.joint) or not (grown-all)."""
    k = len(suite.widths)
    if arm == "scratch":
        return [f"net.blocks={k}", widths_override(suite, k), f"train.epochs={epochs}", "grow.schedule=[]"]
    phase = epochs // k
    steps = ", ".join(f"{{kind: layer, epochs: {phase}, width: {w}}}" for w in suite.widths[1:])
    return ["net.blocks=1", widths_override(suite, 1), f"train.epochs={epochs - phase * (k - 1)}",
            f"grow.schedule=[{steps}]", f"grow.max_blocks={k}", f"grow.init={init}",
            f"grow.freeze={str(arm != 'grown-all').lower()}", "grow.eval_at_growth=true",
            *([f"grow.joint={{epochs: {joint[0]}, lr_factor: {joint[1]}}}"] if arm == "grown-joint" else [])
            ]  # fmt: skip


def decay_overrides(suite: Suite, arm: str, epochs: int, decay: str, steps_per_epoch: int) -> list[str]:
    """train.lr_schedule for one arm: each block's rate falls to a tenth over the epochs it trains in its arm's
    plan (scratch: all E; a grown block: its phase of E/K; grown-all's blocks then go on at the tenth)."""
    if decay == "none":
        return []
    phase = epochs if arm == "scratch" else epochs // len(suite.widths)
    return [
        f"train.lr_schedule.decay={decay}",
        f"train.lr_schedule.decay_steps={phase * steps_per_epoch}",
        "train.lr_schedule.min_factor=0.1",
    ]


def steps_per_epoch(cfg: RunConfig) -> int:
    """Training steps of one epoch of `cfg`'s data (its training rows after data.limit_train and val_fraction)."""
    from growpipe.data import load_data

    return math.ceil(len(load_data(cfg.data, cfg.seed).train) / cfg.data.batch_size)


def run_config(suite_name: str, suite: Suite, method: str, arm: str, seed: int, epochs: int, init: str,
               extra: list[str], quick: bool, joint: tuple[int, float] = (1, 0.3)) -> RunConfig:  # fmt: skip
    rule_sets = ["runtime.engine=gpipe", "bp_pipeline.micro_batches=2"] if method == "bp" else []
    sets = [*suite.overrides, *(QUICK if quick else []), *arm_overrides(suite, arm, epochs, init, joint), *rule_sets,
            f"name=gvs-{suite_name}-{method}-{arm}-s{seed}", f"seed={seed}", "tracking.mlflow=false",
            "checkpoint.enabled=false", "runtime.dashboard=false", "runtime.timeline_epoch=0", *extra]  # fmt: skip
    sets = [s.replace("{rule}", method) for s in sets]
    return load_config(REPO / "configs" / suite.config.format(rule=method), sets)


def block_macs(macs_per_exit: list[int]) -> list[int]:
    """Forward MACs per sample of each block, from the MACs of the path to each exit (differences; the exit
    heads are small beside the blocks, and a deeper exit's head replaces a shallower one's)."""
    return [m - (macs_per_exit[i - 1] if i else 0) for i, m in enumerate(macs_per_exit)]


def training_macs(history: list[dict[str, Any]], caches: list[dict[str, Any]], macs: list[int]) -> list[float]:
    """Cumulative training MACs after each epoch: per sample 3 x the forward MACs of each training block (forward
    and backward), plus the frozen blocks' forward: once when a cache of their outputs is built (the epoch the
    cache record names, before the next one), every epoch when none serves the newest block."""
    cached_from = {c["block"]: c["epoch"] for c in caches}  # newest block -> epoch after which it reads the cache
    total, out = 0.0, []
    for h in history:
        n = h["samples_per_second"] * h["seconds"]
        depth, training = h["blocks"], h["training"]
        frozen = sum(macs[: depth - training])
        newest = depth - 1
        uses_cache = newest in cached_from and h["epoch"] > cached_from[newest]
        total += n * (3 * sum(macs[depth - training : depth]) + (0 if uses_cache else frozen))
        built = [c for c in caches if c["epoch"] == h["epoch"]]
        total += sum(n * sum(macs[: c["block"]]) for c in built)
        out.append(total)
    return out


def first_reach(points: list[tuple[float, float, float]], target: float) -> tuple[float, float] | None:
    """(seconds, MACs) of the first epoch at or above `target` accuracy; None: never."""
    return next(((t, m) for t, m, a in points if a >= target), None)


def train_one(cfg: RunConfig, runtime: str) -> tuple[dict[str, Any], list[float]]:
    """Train; return the result and the wall-clock seconds since the call at each epoch's end."""
    from growpipe.api import train

    start, stamps = time.perf_counter(), []

    def progress(line: str) -> None:
        if line.startswith("epoch "):
            stamps.append(time.perf_counter() - start)

    return train(cfg, runtime, progress=progress).result, stamps


def measure(name: str, suite: Suite, method: str, arm: str, seed: int, epochs: int, init: str, extra: list[str],
            quick: bool, runtime: str = "ray", joint: tuple[int, float] = (1, 0.3)) -> dict[str, Any]:  # fmt: skip
    """One run; a grown arm whose blocks cannot start preserved falls back to fresh (said in the row)."""
    try:
        result, stamps = train_one(run_config(name, suite, method, arm, seed, epochs, init, extra, quick, joint),
                                   runtime)  # fmt: skip
    except ConfigError as e:  # refused before anything trained: the config, or the shapes the data gives
        if arm == "scratch" or init != "preserve" or "grow.init: preserve" not in str(e):
            raise
        init = "fresh"
        result, stamps = train_one(run_config(name, suite, method, arm, seed, epochs, init, extra, quick, joint),
                                   runtime)  # fmt: skip
    macs = training_macs(result["history"], result.get("prefix_caches") or [], block_macs(result["macs_per_exit"]))
    accs = [h["test_accuracy"] for h in result["history"]]
    return {"suite": name, "method": method, "arm": arm, "seed": seed, "runtime": runtime,
            "init": None if arm == "scratch" else init, "final_accuracy": result["test_accuracy"],
            "points": [[round(t, 2), m, a] for t, m, a in zip(stamps, macs, accs, strict=True)],
            "growth": [{k: g.get(k) for k in ("epoch", "blocks", "acc_before", "acc_after", "acc_just_before",
                                               "acc_just_after")} for g in result.get("growth", [])]}  # fmt: skip


def pick(runs: list[dict[str, Any]], suite: str, method: str, arm: str, runtime: str = "ray") -> list[dict[str, Any]]:
    return [r for r in runs if (r["suite"], r["method"], r["arm"], r["runtime"]) == (suite, method, arm, runtime)]


def summarize(runs: list[dict[str, Any]], runtime: str = "ray") -> list[dict[str, Any]]:
    """Per suite, rule and grown arm: finals, the target, and the arm's time and MACs to it against scratch's
    total."""
    rows = []
    for suite, method, grown_arm in sorted({(r["suite"], r["method"], r["arm"]) for r in runs
                                            if r["runtime"] == runtime and r["arm"] != "scratch"}):  # fmt: skip
        scratch, grown = pick(runs, suite, method, "scratch", runtime), pick(runs, suite, method, grown_arm, runtime)
        if not scratch:
            continue
        target = statistics.mean(r["final_accuracy"] for r in scratch) - TARGET_GAP
        scratch_s = statistics.mean(r["points"][-1][0] for r in scratch)
        scratch_m = statistics.mean(r["points"][-1][1] for r in scratch)
        reached = [first_reach([tuple(p) for p in r["points"]], target) for r in grown]
        hit = [x for x in reached if x is not None]
        drops = [g["acc_just_before"] - g["acc_just_after"] for r in grown for g in r["growth"]
                 if g["acc_just_before"] is not None and g["acc_just_after"] is not None]  # fmt: skip
        ref = pick(runs, suite, method, grown_arm, "local") if runtime == "ray" else []
        rows.append({
            "suite": suite, "method": method, "arm": grown_arm, "seeds": len(grown), "init": grown[0]["init"],
            "scratch_final": _mean_sd([r["final_accuracy"] for r in scratch]),
            "grown_final": _mean_sd([r["final_accuracy"] for r in grown]),
            "target": round(target, 4), "scratch_seconds": round(scratch_s, 1),
            "grown_seconds": round(statistics.mean(r["points"][-1][0] for r in grown), 1),
            "reached": f"{len(hit)}/{len(reached)}",
            "time_to_target_fraction": round(statistics.mean(t for t, _ in hit) / scratch_s, 3) if hit else None,
            "macs_to_target_fraction": round(statistics.mean(m for _, m in hit) / scratch_m, 3) if hit else None,
            "largest_drop_at_growth": round(max(drops), 4) if drops else None,
            "reference_final": ref[0]["final_accuracy"] if ref else None,
        })  # fmt: skip
    return rows


def _mean_sd(values: list[float]) -> list[float]:
    return [round(statistics.mean(values), 4), round(statistics.stdev(values), 4) if len(values) > 1 else 0.0]


def markdown(rows: list[dict[str, Any]]) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "never" if v is None else format(v, fmt)

    lines = ["| suite | rule | grown arm | init | scratch final | grown final | reached | time to target / scratch "
             "time | MACs to target / scratch MACs | largest drop at growth | reference (grown, seed 0) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        (sm, ss), (gm, gs) = r["scratch_final"], r["grown_final"]
        lines.append(f"| {r['suite']} | {r['method']} | {r['arm']} | {r['init']} | {sm:.4f} ± {ss:.4f} | "
                     f"{gm:.4f} ± {gs:.4f} | "
                     f"{r['reached']} | {f(r['time_to_target_fraction'], '.2f')} | "
                     f"{f(r['macs_to_target_fraction'], '.2f')} | {f(r['largest_drop_at_growth'], '+.4f')} | "
                     f"{f(r['reference_final'], '.4f')} |")  # fmt: skip
    return "\n".join(lines)


def mean_curve(runs: list[dict[str, Any]], axis: int) -> list[tuple[float, float]]:
    """Epoch by epoch, the mean over seeds of (seconds or MACs, accuracy)."""
    n = min(len(r["points"]) for r in runs)
    return [(statistics.mean(r["points"][i][axis] for r in runs), statistics.mean(r["points"][i][2] for r in runs))
            for i in range(n)]  # fmt: skip


def plot_suite(suite: str, runs: list[dict[str, Any]], path: Path, runtime: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    for ax, axis, label in ((axes[0], 0, "wall-clock seconds"), (axes[1], 1, "training MACs")):
        for method in sorted({r["method"] for r in runs}):
            for arm, style in zip(ARMS, ("--", "-", ":", "-."), strict=True):
                chosen = pick(runs, suite, method, arm, runtime)
                if chosen:
                    curve = mean_curve(chosen, axis)
                    ax.plot([x for x, _ in curve], [a for _, a in curve], style, marker="o", markersize=3,
                            label=f"{method} {arm}")  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{suite}: grown while training vs trained from scratch (mean of seeds)")
    fig.tight_layout()
    try:
        return write_png(path, fig)
    finally:
        plt.close(fig)


def join_or_start_ray() -> None:
    """One Ray for every run (each run's start-up is then its own actors, as on a running cluster)."""
    from growpipe.runtime.pipeline import connect

    connect(load_config(REPO / "configs" / "digits-dascpl.yaml", []), cpus=max(os.cpu_count() or 1, 8))


def _csv(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [v for v in value.split(",") if v]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"{flag}: unknown {bad or 'empty list'}; choose from {','.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", default="fashion-mnist,text,digits", help="comma list of " + ",".join(SUITES))
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of " + ",".join(METHODS))
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default 3)")
    ap.add_argument("--epochs", type=int, help="E for every suite (a multiple of its K; default: the suite's)")
    ap.add_argument("--init", choices=("preserve", "fresh"), default="preserve",
                    help="how grown blocks start (preserve falls back to fresh where the blocks cannot)")  # fmt: skip
    ap.add_argument("--arms", default=",".join(ARMS[1:]), help="grown arms beside scratch: " + ",".join(ARMS[1:]))
    ap.add_argument("--reference", action="store_true", help="also train seed 0 of each grown arm single-process")
    ap.add_argument("--runtime", choices=("ray", "local"), default="ray",
                    help="ray: the Ray pipeline; local: every run single-process (a check of the bench)")  # fmt: skip
    ap.add_argument(
        "--decay",
        choices=("none", "cosine", "linear"),
        default="none",
        help="train.lr_schedule per arm: each block's rate decays to a tenth over its own training epochs",
    )
    ap.add_argument("--joint-epochs", type=int, default=1, help="grown-joint: epochs of its joint phase (1)")
    ap.add_argument("--joint-lr", type=float, default=0.3, help="grown-joint: the joint phase's lr factor (0.3)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    ap.add_argument("--quick", action="store_true", help="256 training rows, 2 blocks, 2 epochs: a smoke test")
    ap.add_argument("--plots", default="bench/plots", metavar="DIR", help="where the PNGs go")
    ap.add_argument("--json-out", metavar="FILE")
    args = ap.parse_args(argv)
    suites, methods = _csv(args.suites, tuple(SUITES), "--suites"), _csv(args.methods, METHODS, "--methods")
    arms = _csv(args.arms, ARMS[1:], "--arms")
    if args.seeds < 1:
        raise SystemExit("--seeds must be 1 or more")
    if args.joint_epochs < 1 or not 0 < args.joint_lr <= 1:
        raise SystemExit("--joint-epochs must be 1 or more and --joint-lr in (0, 1]")
    joint = (args.joint_epochs, args.joint_lr)
    start, runs = time.perf_counter(), []
    if args.runtime == "ray":
        join_or_start_ray()
    for suite in suites:
        s = SUITES[suite]
        if args.quick:
            s = Suite(s.config, s.widths[:2], 2, s.overrides)
        epochs = args.epochs or s.epochs
        if epochs % len(s.widths):
            raise SystemExit(f"--epochs {epochs}: {suite} grows to {len(s.widths)} blocks; give a multiple of it")
        for method in methods:
            spe = (
                0
                if args.decay == "none"
                else steps_per_epoch(
                    run_config(suite, s, method, "scratch", 0, epochs, args.init, args.set, args.quick)
                )
            )
            sets = {arm: [*args.set, *decay_overrides(s, arm, epochs, args.decay, spe)] for arm in ARMS}
            for seed in range(args.seeds):
                for arm in ("scratch", *arms):
                    print(f"== {suite} {method} seed {seed}: {arm}", flush=True)
                    runs.append(measure(suite, s, method, arm, seed, epochs, args.init, sets[arm], args.quick,
                                        args.runtime, joint))  # fmt: skip
            for arm in arms if args.reference and args.runtime == "ray" else []:
                runs.append(measure(suite, s, method, arm, 0, epochs, args.init, sets[arm], args.quick, "local",
                                    joint))  # fmt: skip
    rows = summarize(runs, args.runtime)
    print(markdown(rows))
    tag = "-quick" if args.quick else ""
    plots = [str(plot_suite(suite, [r for r in runs if r["suite"] == suite],
                            REPO / args.plots / f"grow_vs_scratch-{suite}{tag}.png", args.runtime))
             for suite in suites]  # fmt: skip
    out = {"rows": rows, "runs": runs, "plots": plots, "seconds": round(time.perf_counter() - start, 1),
           "settings": {"suites": suites, "methods": methods, "arms": arms, "seeds": args.seeds, "init": args.init,
                        "target_gap": TARGET_GAP, "quick": args.quick, "runtime": args.runtime,
                        "sets": args.set, "decay": args.decay, "joint": list(joint)}}  # fmt: skip
    return end_bench(out, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
