"""Pipeline benchmark: one MLP cut into K equal, compute-heavy blocks, trained on the same Fashion-MNIST
batches four ways, compared as samples/s ratios:

  (a) growpipe's reference trainer, sequential, 1 torch thread            (local rule: SCPL)
  (b) BP on the same layers, one process, K torch threads
  (c) the growpipe Ray pipeline, K stage actors x 1 CPU                   (local rule: SCPL)
  (c') the same with pipeline.transport compiled (a Ray Compiled Graph over the stages)
  (d) torch.distributed.pipelining GPipe, K processes on gloo (BP, same blocks, 4 micro-batches)

plus the per-hop overhead of (c) and (c') and their stage utilisation. One measurement of an arm is the median samples/s
over its epochs after the first (warm-up). The block width is calibrated once per target so one block step
takes the target time on this machine. The arms then run --repeats times, interleaved: each repeat runs every
arm once, starting one arm later than the repeat before (a b c d, then b c d a, ...), and gives every ratio
from its own figures. Reported per figure and per ratio: the median over the repeats, its spread [min-max]
and n. (c) runs with pipeline.packets_per_call 1 and 2 (--quick: 1) as two arms; the ratios use the one with
the higher median samples/s. The JSON keeps every repeat's raw figures ("runs") beside the summary ("spread").

    .venv/bin/growpipe bench pipeline --quick --json-out bench/out/pipeline-quick.json   # 2 repeats, ~2 min
    .venv/bin/growpipe bench pipeline --json-out bench/out/pipeline.json   # 20 ms and 10 ms steps, 5 repeats
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
from repeats import rotation, spread_table, summarize

from growpipe.config import RunConfig, build_config
from growpipe.data import load_data
from growpipe.local import train_local
from growpipe.nn.methods import build_block
from growpipe.nn.net import plan_blocks
from growpipe.nn.specs import InputInfo
from growpipe.report import end_bench

K = 2
GROUPS = (1, 2)
"""pipeline.packets_per_call values the full run measures (c) with (the faster is reported); --quick: 1."""


def bench_config(
    widths: tuple[int, ...], batches: int, epochs: int, batch_size: int, method: str = "scpl"
) -> RunConfig:
    """The benchmark model: K MLP blocks of 2 layers (block i has widths[i] units) on flattened Fashion-MNIST."""
    return build_config(
        {
            "name": f"bench-pipeline-{method}-{'x'.join(map(str, widths))}",
            "method": method,
            "seed": 0,
            "threads": 1,
            "data": {
                "name": "fashion-mnist",
                "batch_size": batch_size,
                "limit_train": batches * batch_size,
                "limit_test": 256,
            },  # fmt: skip
            "net": {"backbone": "mlp", "blocks": K, "widths": list(widths), "layers_per_block": 2},
            "scpl": {"projector": "linear", "proj_dim": 128},
            "train": {"epochs": epochs},
            "runtime": {"cpus_per_stage": 1, "timeline_epoch": 0, "dashboard": False},
            "pipeline": {"window": 4},
            "tracking": {"mlflow": False},  # a benchmark measures, it does not record runs
            "checkpoint": {"enabled": False},
        }
    )


def block_steps_ms(widths: tuple[int, ...], batch_size: int) -> list[float]:
    """Median milliseconds of one train_step of each block, 1 thread, on random inputs of the right shape."""
    from growpipe.nn.packet import Packet

    torch.set_num_threads(1)
    cfg = bench_config(widths, 8, 1, batch_size)
    info = InputInfo.from_bundle(load_data(cfg.data))
    y = torch.arange(batch_size) % 10
    out = []
    for spec in plan_blocks(cfg.net, cfg.rule(), info):
        block = build_block(cfg.rule(), spec, info)
        x = torch.randn(batch_size, *(info.shape if spec.index == 0 else (widths[spec.index - 1],)))
        times = []
        for i in range(8):
            t0 = time.perf_counter()
            block.train_step(Packet(x=x, y=y, index=i))
            times.append(time.perf_counter() - t0)
        out.append(1000 * statistics.median(times[2:]))
    return out


def calibrate(target_ms: float, batch_size: int) -> tuple[tuple[int, ...], list[float]]:
    """Widths (multiples of 64) making every block step take about target_ms: equal blocks.

    Block 0 maps the 784 pixels, later blocks map width to width, so equal widths would leave block 0
    lighter and the pipeline bound by the last block; the first width is raised until the steps match.
    """
    width = 256
    while True:
        ms = block_steps_ms((width,) * K, batch_size)
        if ms[-1] >= target_ms or width >= 8192:
            break
        width = int(width * max(1.1, min(2.0, (target_ms / ms[-1]) ** 0.5)) // 64 * 64) + 64
    first = width
    for _ in range(4):  # block 1 grows with the first width too, so a few proportional steps
        if ms[0] >= ms[-1] * 0.95:
            break
        first = round(first * (ms[-1] / ms[0]) ** 0.5 / 64) * 64
        ms = block_steps_ms((first,) + (width,) * (K - 1), batch_size)
    return (first,) + (width,) * (K - 1), ms


def median_rate(history: list[dict[str, Any]]) -> float:
    """Samples/s: the median of the epochs after the first (warm-up), or the only epoch."""
    return statistics.median([h["samples_per_second"] for h in history[1:]] or [history[0]["samples_per_second"]])


def run_sequential(cfg: RunConfig) -> float:
    return median_rate(train_local(cfg, progress=None).history)


def run_bp_threads(cfg: RunConfig) -> float:
    bp = cfg.model_copy(update={"method": "bp", "threads": K})
    rate = median_rate(train_local(bp, progress=None).history)
    torch.set_num_threads(1)
    return rate


def run_ray(cfg: RunConfig, packets_per_call: int, transport: str = "object_store") -> dict[str, Any]:
    from growpipe.runtime.pipeline import Pipeline

    pipeline = cfg.pipeline.model_copy(update={"packets_per_call": packets_per_call, "transport": transport})
    with Pipeline(cfg.model_copy(update={"pipeline": pipeline})) as p:
        result = p.train(progress=None)
    return {
        "samples_per_second": median_rate(result["history"]),
        "hop_overhead_ms": result["hop_overhead_ms"],
        "stage_utilisation": [round(s["utilisation"], 4) for s in result["stages"]],
        "stages": result["stages"],
    }


# ---- (d) torch.distributed.pipelining GPipe ------------------------------------------------------------


def run_torch_gpipe(cfg: RunConfig) -> float:
    """Samples/s of PyTorch's GPipe (4 micro-batches, K processes on gloo) on the same blocks trained by BP."""
    from torch_gpipe import train_torch_gpipe

    return median_rate(train_torch_gpipe(cfg.model_copy(update={"method": "bp"}), K, 4)["history"])


# ---- driver ------------------------------------------------------------------------------------------

RATIOS = (("speedup_vs_sequential", "sequential", "c/a"), ("ratio_vs_bp_threads", "bp_threads", "c/b"),
          ("ratio_vs_torch_gpipe", "torch_gpipe", "c/d"))  # fmt: skip
"""Each ratio of the report: (c)'s samples/s over the named arm's, in the same repeat."""
COMPILED_KEYS = ("hop_overhead_ms", "compiled_vs_sequential", "compiled_vs_object_store", "hop_overhead_ms_compiled")
"""(c)'s hop overhead, then (c')'s figures: its speedup over (a), its rate over (c)'s with 1 packet per call (the
default, and one packet per execution as (c') has), its hop overhead."""
HEADLINE = ("speedup_vs_sequential", "ratio_vs_bp_threads", "ratio_vs_torch_gpipe", "hop_overhead_ms",
            "stage_utilisation", "compiled", "spread")  # fmt: skip
"""The first case's keys the JSON repeats at its top level."""


def arms(groups: tuple[int, ...]) -> list[str]:
    """The arms a repeat runs: (a), (b), (c) once per packets_per_call value, (c'), (d)."""
    return ["sequential", "bp_threads", *(f"growpipe_ray_{g}" for g in groups), "growpipe_compiled", "torch_gpipe"]


def arm_label(arm: str) -> str:
    """How the report names an arm."""
    if arm.startswith("growpipe_ray_"):
        group = int(arm.rsplit("_", 1)[1])
        return f"(c) growpipe Ray pipeline, {K} stages, {group} packet(s) per call"
    return {"sequential": "(a) sequential reference, 1 thread", "bp_threads": f"(b) BP, one process, {K} threads",
            "growpipe_ray": "(c) growpipe Ray pipeline (the ratios' packets per call)",
            "growpipe_compiled": f"(c') growpipe Ray pipeline, {K} stages, pipeline.transport compiled",
            "torch_gpipe": f"(d) torch GPipe, {K} procs, gloo"}[arm]  # fmt: skip


def run_arm(arm: str, cfg: RunConfig) -> dict[str, Any]:
    """One measurement of one arm: {arm: samples/s}, and for (c) its hop overhead and stage utilisation too."""
    if arm.startswith("growpipe_ray_"):
        group = int(arm.rsplit("_", 1)[1])
        fig = run_ray(cfg, group)
        return {arm: fig["samples_per_second"], f"hop_overhead_ms_{group}": fig["hop_overhead_ms"],
                f"stage_utilisation_{group}": fig["stage_utilisation"]}  # fmt: skip
    if arm == "growpipe_compiled":
        fig = run_ray(cfg, 1, "compiled")
        return {arm: fig["samples_per_second"], "hop_overhead_ms_compiled": fig["hop_overhead_ms"],
                "stage_utilisation_compiled": fig["stage_utilisation"]}  # fmt: skip
    run = {"sequential": run_sequential, "bp_threads": run_bp_threads, "torch_gpipe": run_torch_gpipe}[arm]
    return {arm: run(cfg)}


def with_ratios(run: dict[str, Any], group: int) -> dict[str, Any]:
    """A repeat's figures plus (c)'s for packets_per_call `group` and the ratios from them."""
    pipe = run[f"growpipe_ray_{group}"]
    out = {**run, "growpipe_ray": pipe, "hop_overhead_ms": run[f"hop_overhead_ms_{group}"],
           "stage_utilisation": run[f"stage_utilisation_{group}"]}  # fmt: skip
    compiled = {"compiled_vs_sequential": run["growpipe_compiled"] / run["sequential"],
                "compiled_vs_object_store": run["growpipe_compiled"] / run["growpipe_ray_1"]}  # fmt: skip
    return out | {ratio: pipe / run[arm] for ratio, arm, _ in RATIOS} | compiled


def measure(
    target_ms: float, batches: int, epochs: int, batch_size: int, groups: tuple[int, ...], repeats: int
) -> dict[str, Any]:
    """Every figure and ratio for one block-step target: `repeats` repeats of every arm, interleaved."""
    widths, ms = calibrate(target_ms, batch_size)
    cfg = bench_config(widths, batches, epochs, batch_size)
    steps = ", ".join(f"{m:.1f}" for m in ms)
    print(f"-- target {target_ms:g} ms: widths {list(widths)}, block steps {steps} ms, batch {batch_size}", flush=True)
    names = arms(groups)
    runs = []
    for r in range(repeats):
        order = rotation(names, r)
        run: dict[str, Any] = {"order": order}
        for arm in order:
            run |= run_arm(arm, cfg)
        runs.append(run)
        rates = "  ".join(f"{arm} {run[arm]:.0f}" for arm in order)
        print(f"   repeat {r + 1}/{repeats}: {rates} samples/s", flush=True)
    best = max(groups, key=lambda g: statistics.median(run[f"growpipe_ray_{g}"] for run in runs))
    runs = [with_ratios(run, best) for run in runs]
    keys = [*names, "growpipe_ray", *(ratio for ratio, _, _ in RATIOS), *COMPILED_KEYS]
    summary = summarize(runs, keys)
    med = {k: s["median"] for k, s in summary.items() if s is not None}
    utilisation = [statistics.median(u) for u in zip(*(run["stage_utilisation"] for run in runs), strict=True)]
    act_kb = batch_size * widths[0] * 4 / 1024
    rows = [(arm, arm_label(arm) + ", samples/s", 0) for arm in names]
    rows += [(ratio, f"{ratio} ({short})", 2) for ratio, _, short in RATIOS]
    shorts = ("c", "c'/a", "c'/c, 1 packet per call", "c'")
    rows += [(key, f"{key} ({short})", 2) for key, short in zip(COMPILED_KEYS, shorts, strict=True)]
    print(spread_table(summary, rows), flush=True)
    print(f"   (c) in the ratios: {best} packet(s) per call; utilisation {[round(u, 2) for u in utilisation]}, "
          f"activation {act_kb:.0f} KB", flush=True)  # fmt: skip
    return {
        "target_step_ms": target_ms,
        "block_step_ms": [round(m, 2) for m in ms],
        "widths": list(widths),
        "activation_kb": act_kb,
        "repeats": repeats,
        "samples_per_second": {arm: med[arm] for arm in ("sequential", "bp_threads", "growpipe_ray", "torch_gpipe")},
        "packets_per_call": best,
        "growpipe_ray_by_packets_per_call": {g: med[f"growpipe_ray_{g}"] for g in groups},
        **{ratio: med[ratio] for ratio, _, _ in RATIOS},
        "hop_overhead_ms": med["hop_overhead_ms"],
        "stage_utilisation": utilisation,
        "compiled": {"samples_per_second": med["growpipe_compiled"], **{k: med[k] for k in COMPILED_KEYS[1:]}},
        "spread": summary,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Pipeline benchmark: Ray pipeline vs sequential, BP threads, torch GPipe; "
                                 "every arm --repeats times, interleaved: medians and spreads [min-max]")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="only the >= 20 ms case, few batches, 2 repeats (~2 min)")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--batches", type=int, help="batches per epoch (default: 12 quick, 40 full)")
    ap.add_argument("--epochs", type=int, help="epochs per measurement, the first is warm-up (default 3 / 4)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--target-ms", type=float, action="append",
                    help="block step ms to calibrate for, repeatable (default: 20 quick, 20 and 10 full)")  # fmt: skip
    ap.add_argument("--repeats", type=int,
                    help="runs of every arm, interleaved: medians and [min-max] (default 2 quick, 5 full)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.epochs is not None and args.epochs < 2:
        ap.error("--epochs must be at least 2: the first epoch is warm-up and is not measured")
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}; e.g. --repeats 5")
    batches = args.batches or (12 if args.quick else 40)
    epochs = args.epochs or (3 if args.quick else 4)
    repeats = args.repeats or (2 if args.quick else 5)
    targets = args.target_ms or ([20.0] if args.quick else [20.0, 10.0])
    if min(targets) <= 0:
        ap.error("--target-ms must be positive, e.g. --target-ms 20")
    start = time.perf_counter()
    groups = (1,) if args.quick else GROUPS
    rows = [measure(t, batches, epochs, args.batch_size, groups, repeats) for t in targets]
    main_row = rows[0]
    out = {
        **{key: main_row[key] for key in HEADLINE},
        "cases": rows,
        "settings": {
            "stages": K,
            "method": "scpl",
            "batch_size": args.batch_size,
            "batches_per_epoch": batches,
            "epochs": epochs,
            "repeats": repeats,
            "window": 4,
            "packets_per_call_tried": list(groups),
            "inline_kb": RunConfig().runtime.inline_kb,
            "quick": args.quick,
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
        },
        "seconds": round(time.perf_counter() - start, 1),
    }
    return end_bench(out, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
