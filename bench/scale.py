"""How the Ray pipeline scales with the size of a block and the number of stages, and a cost model from it.

For MLP blocks of about 0.1 M to 100 M parameters each (DASCPL on Fashion-MNIST) and K stages (one actor
each, on this machine's cores), two epochs per run (the second is reported; a checkpoint after every epoch).
Every cell runs --repeats times, interleaved: each repeat measures the link, then runs every cell once, starting
one cell later than the repeat before; each figure and ratio below is reported as its median over the repeats
with its spread [min-max] and n, and the JSON keeps every repeat's raw row ("runs") beside the summary
("spread"). Per cell:

- training, evaluation and checkpoint seconds of the epoch; the evaluation's bytes (activations between the
  stages, probabilities back) against the bytes of the weights (what gathering the net would move);
  activation bytes handed on in training; peak RSS of every stage actor;
- the cost model (growpipe.costmodel) from step times `growpipe partition` profiles in one process, a hop
  cost and a bandwidth measured between two actors, and this machine's cores: predicted against measured
  training epochs, as profiled and with the slowdown a step shows in the pipeline measured on the K = 2 run
  of the same width in the same repeat (that run is the calibration; the others check it); and its prediction
  (from the medians) for K = 16-64
  stages on a described cluster (--cluster FILE: YAML with step_ms, packet_mb, hop_ms, mb_per_s, parallel,
  slowdown; default: one device per stage like this machine's core);
- real early exit in one process on a trained DASCPL net (trained once): measured time per sample at thresholds
  1.0, 0.999, 0.99, 0.9 and 0.7 against the MACs the accounting says each saves, the thresholds timed --repeats
  times, interleaved the same way.

    .venv/bin/growpipe bench scale --json-out bench/out/scale.json      # 5 repeats
    .venv/bin/growpipe bench scale --quick                              # one tiny cell, 2 repeats
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from repeats import format_spread, median_figures, rotation, spread, summarize  # noqa: E402

from growpipe.api import train  # noqa: E402
from growpipe.config import RunConfig, build_config  # noqa: E402
from growpipe.costmodel import Hardware, epoch_seconds, predict, relative_error  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.partition import plan_partition  # noqa: E402

BATCH = 64
THRESHOLDS = (1.0, 0.999, 0.99, 0.9, 0.7)
"""Where real early exit is timed: the full path (1.0), thresholds that lose little, and the issue's 0.9, 0.7."""
FIGURES = ("train_seconds", "eval_seconds", "checkpoint_seconds", "eval_plus_checkpoint_share", "stage0_peak_rss_mb",
           "predicted_train_seconds", "model_error", "slowdown", "calibrated_train_seconds", "calibrated_error",
           "wall_seconds", "test_accuracy")  # fmt: skip
"""A cell's figures and ratios summarised over the repeats (median, [min-max], n)."""
EXIT_FIGURES = ("time_saved", "us_per_sample", "time_over_macs")
"""The early-exit timings summarised over the repeats (accuracy, depth and MACs are the same in every repeat)."""


def width_for(params: float) -> int:
    """The MLP width whose square (a hidden block's weights) is about `params`."""
    return max(8, round(math.sqrt(params)))


INPUTS = {"fashion-mnist": 784, "digits": 64}
"""Input features per sample of the datasets the benchmark uses (the first block's fan-in)."""


def run_config(
    width: int,
    stages: int,
    batches: int,
    ck: str,
    data: str = "fashion-mnist",
    test_rows: int | None = 1024,
    epochs: int = 2,
) -> RunConfig:
    """DASCPL, `stages` one-layer MLP blocks of `width` units on flattened images, `epochs` epochs, a
    checkpoint every epoch into `ck`; `test_rows` of the test split (None: all)."""
    return build_config({
        "method": "dascpl", "seed": 0, "threads": 1,
        "data": {"name": data, "batch_size": BATCH, "limit_train": batches * BATCH, "limit_test": test_rows},
        "net": {"backbone": "mlp", "blocks": stages, "width": width, "layers_per_block": 1},
        "scpl": {"projector": "linear", "proj_dim": 64},
        "train": {"epochs": epochs},
        "tracking": {"mlflow": False},
        "checkpoint": {"enabled": True, "uri": ck, "every_epochs": 1, "keep": 1, "overwrite": True},
        "runtime": {"cpus_per_stage": 1, "timeline_epoch": 0, "dashboard": False, "stage_timeout_s": 1800},
    })  # fmt: skip


def packet_mb(width: int) -> float:
    """MiB of a packet between two blocks of `width` units (a batch of fp32 activations)."""
    return BATCH * width * 4 / 2**20


def calibrate(rows: list[dict[str, Any]], link: tuple[float, float]) -> None:
    """Per width, the slowdown a step shows in the pipeline: measured / predicted on its smallest-K run (the
    calibration); every row gets the calibrated prediction and error (the calibration row marked)."""

    def at(slowdown: float, r: dict[str, Any]) -> float:
        hw = Hardware(min(r["cores"], r["stages"]), link[0], link[1], slowdown)
        return epoch_seconds(r["profiled_step_ms"], r["batches"], packet_mb(r["width"]), hw)

    for width in {r["width"] for r in rows}:
        same = [r for r in rows if r["width"] == width]
        base = min(same, key=lambda r: r["stages"])
        slowdown = base["train_seconds"] / at(1.0, base)
        for r in same:
            r["slowdown"] = round(slowdown, 3)
            r["calibrated_train_seconds"] = round(at(slowdown, r), 3)
            r["calibrated_error"] = None if r is base else round(relative_error(at(slowdown, r), r["train_seconds"]), 4)


@ray.remote(num_cpus=0)
class _Sink:
    def take(self, x: np.ndarray) -> int:
        return int(x.nbytes)


def measure_link(sizes_mb: tuple[float, ...] = (0.0001, 1.0, 8.0, 32.0), repeats: int = 9) -> tuple[float, float]:
    """(fixed ms per actor call, MiB/s): a line through the median time of handing arrays of `sizes_mb` to
    another actor and back the call's answer."""
    sink = _Sink.remote()
    ray.get(sink.take.remote(np.zeros(1, np.float32)))
    points = []
    for mb in sizes_mb:
        x = np.random.default_rng(0).random(int(mb * 2**20 / 4), dtype=np.float32)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ray.get(sink.take.remote(x))
            times.append((time.perf_counter() - t0) * 1000)
        points.append((mb, statistics.median(times)))
    ray.kill(sink)
    slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return max(float(intercept), 0.01), 1000.0 / max(float(slope), 1e-6)


def weights_mb(width: int, stages: int, inputs: int) -> float:
    """About what the blocks' weights and optimizer state weigh (what gathering the net moves): inputs x w
    for the first block, w x w for the others, x 3 (weights and Adam's two moments), fp32."""
    params = inputs * width + (stages - 1) * width * width
    return params * 4 * 3 / 2**20


def one_cell(width: int, stages: int, batches: int, cores: int, link: tuple[float, float], tmp: str,
             data: str, test_rows: int | None = 1024, epochs: int = 2) -> dict[str, Any]:  # fmt: skip
    """One run of `stages` blocks of `width` units: its measured last epoch and the model's prediction."""
    cfg = run_config(width, stages, batches, tmp, data, test_rows, epochs)
    profile = plan_partition(cfg, stages)
    t0 = time.perf_counter()
    result = train(cfg, runtime="ray", progress=None, keep_net=False).result
    wall = time.perf_counter() - t0
    row = result["history"][-1]
    hw = Hardware(parallel=min(cores, stages), hop_ms=link[0], mb_per_s=link[1])
    predicted = epoch_seconds(profile["predicted_stage_ms"], batches, packet_mb(width), hw)
    epoch = row["seconds"]
    stages_rows = result["stages"]
    return {
        "width": width,
        "params_per_block": width * width,
        "stages": stages,
        "batches": batches,
        "test_rows": test_rows,
        "train_seconds": round(epoch, 3),
        "eval_seconds": row["eval_seconds"],
        "checkpoint_seconds": row["checkpoint_seconds"],
        "eval_plus_checkpoint_share": round(
            (row["eval_seconds"] + row["checkpoint_seconds"])
            / (epoch + row["eval_seconds"] + row["checkpoint_seconds"]),
            4,
        ),  # fmt: skip
        "eval_bytes_mb": {k: round(v / 2**20, 3) for k, v in (row["eval_bytes"] or {}).items()},
        "weights_mb": round(weights_mb(width, stages, INPUTS[data]), 1),
        "train_activations_mb_per_epoch": round(sum(s["sent_mb"] for s in stages_rows) / len(result["history"]), 2),
        "peak_rss_mb": [s["peak_rss_mb"] for s in stages_rows],
        "stage0_peak_rss_mb": stages_rows[0]["peak_rss_mb"],
        "profiled_step_ms": profile["predicted_stage_ms"],
        "predicted_train_seconds": round(predicted, 3),
        "model_error": round(relative_error(predicted, epoch), 4),
        "cores": cores,
        "wall_seconds": round(wall, 1),
        "test_accuracy": result["test_accuracy"],
    }


def _line(row: dict[str, Any]) -> str:
    parts = [
        f"w={row['width']:>6} ({row['params_per_block'] / 1e6:7.2f} M/block) K={row['stages']}:",
        f"train {row['train_seconds']:.2f}s (model {row['predicted_train_seconds']:.2f}s,",
        f"{100 * row['model_error']:.0f}% off), eval {row['eval_seconds']:.2f}s,",
        f"ckpt {row['checkpoint_seconds']:.2f}s ({100 * row['eval_plus_checkpoint_share']:.0f}% of the epoch),",
        f"eval bytes {sum(row['eval_bytes_mb'].values()):.1f} MB vs weights {row['weights_mb']:.0f} MB,",
        f"peak RSS {max(row['peak_rss_mb']):.0f} MB (stage 0 {row['peak_rss_mb'][0]:.0f})",
    ]
    return " ".join(parts)


def _spread_line(cell: dict[str, Any]) -> str:
    """A cell's medians and [min-max] over the repeats, one line."""
    s = cell["spread"]
    calibrated = "calibration" if s["calibrated_error"] is None else format_spread(s["calibrated_error"])
    return (f"w={cell['width']:>6} K={cell['stages']}: train s {format_spread(s['train_seconds'])}, eval+ckpt share "
            f"{format_spread(s['eval_plus_checkpoint_share'])}, model off {format_spread(s['model_error'])}, "
            f"calibrated off {calibrated}, stage 0 RSS MB {format_spread(s['stage0_peak_rss_mb'], 0)}, "
            f"n {s['train_seconds']['n']}")  # fmt: skip


def summarize_cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell over the repeats: the medians of its figures (lists and dicts element by element), their spreads
    ("spread"), every repeat's raw row ("runs")."""
    return {**median_figures(runs), "repeats": len(runs), "spread": summarize(runs, FIGURES), "runs": runs}


def _exit_row(th: float, m: dict[str, Any], full: float) -> dict[str, Any]:
    return {
        "threshold": th, "accuracy": round(m["accuracy"], 4), "points_lost": round(100 * (full - m["accuracy"]), 2),
        "mean_depth": round(m["mean_depth"], 3), "time_saved": round(m["time_saved_fraction"], 4),
        "macs_saved": round(m["macs_saved_fraction"], 4),
        "time_over_macs": round(m["time_saved_fraction"] / m["macs_saved_fraction"], 3)
        if m["macs_saved_fraction"] > 0 else None,
        "us_per_sample": round(1e6 * m["seconds_per_sample"], 2),
    }  # fmt: skip


def early_exit_timing(quick: bool, repeats: int) -> list[dict[str, Any]]:
    """A DASCPL net trained once in one process; real early exit at each threshold (1.0: the full path), timed
    `repeats` times with the thresholds interleaved: measured seconds per sample against the MACs the accounting
    gives for the same exits, medians with their spreads."""
    from growpipe.data import load_data
    from growpipe.evaluation import measure_early_exit
    from growpipe.local import train_local

    cfg = build_config({
        "method": "dascpl", "seed": 0, "threads": 1,
        "data": {"name": "digits" if quick else "fashion-mnist", "batch_size": 128,
                 "limit_train": None if quick else 20000, "limit_test": None if quick else 5000},
        "net": {"backbone": "mlp", "blocks": 4, "width": 256 if quick else 1024},
        "train": {"epochs": 1 if quick else 4}, "tracking": {"mlflow": False}, "checkpoint": {"enabled": False},
    })  # fmt: skip
    torch.set_num_threads(1)
    run = train_local(cfg, progress=None)
    bundle = run.bundle or load_data(cfg.data, cfg.seed)
    full = run.result["test_accuracy"]
    runs: dict[float, list[dict[str, Any]]] = {th: [] for th in THRESHOLDS}
    for r in range(repeats):
        for th in rotation(THRESHOLDS, r):
            runs[th].append(_exit_row(th, measure_early_exit(run.net, bundle, cfg.eval, th), full))
    return [{**median_figures(rs), "spread": summarize(rs, EXIT_FIGURES), "runs": rs} for rs in runs.values()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="one tiny digits cell (K = 2), a tiny early-exit net, 2 repeats")  # fmt: skip
    ap.add_argument("--repeats", type=int,
                    help="runs of each cell, interleaved: medians and [min-max] (default 2 quick, 5 full)")  # fmt: skip
    ap.add_argument("--params", default="1e5,1e6,1e7", help="parameters per block of the K sweep (comma-separated)")
    ap.add_argument("--stages", default="2,4,8", help="K values of the sweep")
    ap.add_argument("--largest", type=float, default=1e8, help="one more cell at this size with K = 2 (0: none)")
    ap.add_argument("--batches", type=int, default=16, help="batches per epoch of the sweep's cells")
    ap.add_argument("--largest-batches", type=int, default=48, help="batches per epoch of the largest cell")
    ap.add_argument("--largest-test", type=int, default=1024, help="test rows of the largest cell (0: all)")
    ap.add_argument("--largest-epochs", type=int, default=2, help="epochs of the largest cell (the last is measured)")
    ap.add_argument(
        "--early-exit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time real early exit on a trained DASCPL net (--no-early-exit: skip)",
    )
    ap.add_argument("--cluster", metavar="YAML", help="the cluster to predict K = 16-64 for (see the docstring)")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}; e.g. --repeats 5")
    repeats = args.repeats or (2 if args.quick else 5)
    cores = os.cpu_count() or 1
    sizes = [float(p) for p in args.params.split(",") if p.strip()]
    cells = [(width_for(p), int(k)) for p in sizes for k in args.stages.split(",")]
    batches = args.batches
    if args.quick:
        cells, batches, args.largest = [(64, 2)], 4, 0
    if args.largest:
        cells.append((width_for(args.largest), 2))
    owns = not ray.is_initialized()
    if owns:
        ray.init(num_cpus=max(8, *(k for _, k in cells)), include_dashboard=False, log_to_driver=False)
    try:
        links: list[tuple[float, float]] = []
        runs: list[list[dict[str, Any]]] = [[] for _ in cells]
        with tempfile.TemporaryDirectory(prefix="growpipe-scale-") as tmp:
            for r in range(repeats):
                link = measure_link((0.0001, 1.0) if args.quick else (0.0001, 1.0, 8.0, 32.0), 3 if args.quick else 9)
                links.append(link)
                print(f"repeat {r + 1}/{repeats}: link {link[0]:.2f} ms per call, {link[1]:.0f} MiB/s; {cores} cores")
                rows = []
                for i in rotation(range(len(cells)), r):
                    width, k = cells[i]
                    data = "digits" if args.quick else "fashion-mnist"
                    if args.largest and width == width_for(args.largest):
                        row = one_cell(width, k, args.largest_batches, cores, link, tmp, data,
                                       args.largest_test or None, args.largest_epochs)  # fmt: skip
                    else:
                        row = one_cell(width, k, batches, cores, link, tmp, data)
                    runs[i].append(row)
                    rows.append(row)
                    print(_line(row), flush=True)
                calibrate(rows, link)  # on this repeat's own runs and link
        hop, mb_per_s = spread(h for h, _ in links), spread(m for _, m in links)
        link = (hop["median"], mb_per_s["median"]) if hop and mb_per_s else link
        cells_out = [summarize_cell(rs) for rs in runs]
        print(f"median of {repeats} repeat(s) [min-max]: link {format_spread(hop)} ms per call, "
              f"{format_spread(mb_per_s, 0)} MiB/s")  # fmt: skip
        for c in cells_out:
            print(_spread_line(c))
        cluster = yaml.safe_load(Path(args.cluster).read_text()) if args.cluster else None
        mid = [c for c in cells_out if c["stages"] == max(c2["stages"] for c2 in cells_out)] or cells_out
        base = mid[0]
        described = cluster or {"step_ms": statistics.median(base["profiled_step_ms"]), "packet_mb":
                                packet_mb(base["width"]), "hop_ms": link[0], "mb_per_s": link[1]}  # fmt: skip
        forecast = predict(described, [16, 32, 64], base["batches"])
        for f in forecast:
            print(f"predicted: K={f['stages']}: {f['epoch_seconds']:.2f} s per epoch of {base['batches']} batches")
    finally:
        if owns:
            ray.shutdown()
    exits = early_exit_timing(args.quick, repeats) if args.early_exit else []
    for e in exits:
        s = e["spread"]
        print(
            f"early exit at {e['threshold']}: accuracy {e['accuracy']} ({-e['points_lost']:+.2f} points against the "
            f"full path), mean depth {e['mean_depth']}, time saved {format_spread(s['time_saved'], 3)} vs MACs "
            f"saved {e['macs_saved']:.3f}, {format_spread(s['us_per_sample'], 1)} us/sample"
        )
    out = {"cores": cores, "repeats": repeats,
           "link": {"hop_ms": link[0], "mb_per_s": link[1], "spread": {"hop_ms": hop, "mb_per_s": mb_per_s},
                    "runs": [{"hop_ms": h, "mb_per_s": m} for h, m in links]},
           "cells": cells_out, "cluster": described, "forecast": forecast, "early_exit": exits}  # fmt: skip
    if args.json_out:
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
