"""Growth benchmark: train 2 blocks on the Ray pipeline, grow to 4 one block at a time, and report

  - accuracy before and after each growth, and whether the frozen blocks stayed bit-identical;
  - seconds per epoch of the newest block's phase with the frozen-prefix cache and without it, each as a
    ratio to training that block alone, in one process, on precomputed prefix outputs
    (cache_epoch_ratio, nocache_epoch_ratio);
  - the adaptive-inference trade-off of the grown net (accuracy, mean depth, MACs saved per threshold),
    with a PNG of accuracy vs compute.

DASCPL (a classifier at every block, so every depth is an exit) on Fashion-MNIST (CNN) and 20 Newsgroups
(TF-IDF bag of embeddings, dense blocks on top).

    .venv/bin/growpipe bench growth --quick --json-out bench/out/growth-quick.json
    .venv/bin/python bench/growth.py --json-out bench/out/growth.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from growpipe.config import RunConfig, load_config
from growpipe.data import iterate_batches, load_data
from growpipe.nn.methods import build_block
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from growpipe.plots import plot_accuracy_vs_compute
from growpipe.report import end_bench
from growpipe.runtime.prefix_cache import PrefixCache

REPO = Path(__file__).resolve().parents[1]

SUITES: dict[str, dict[str, Any]] = {
    "fashion-mnist": {
        "config": "fashion-mnist-dascpl.yaml",
        "overrides": ["net.blocks=2", "net.widths=[32,64]"],
        "grow_widths": [128, 256],
    },
    "20newsgroups": {
        "config": "20newsgroups-dascpl.yaml",
        "overrides": [],
        "grow_widths": [256, 256],
    },
}


def suite_config(
    suite: str, epochs: tuple[int, int], limit_train: int | None, cache: bool, limit_test: int | None = None
) -> RunConfig:
    """2 blocks for epochs[0] epochs, then two layer growth steps of epochs[1] epochs each."""
    spec = SUITES[suite]
    steps = ", ".join(f"{{kind: layer, epochs: {epochs[1]}, width: {w}}}" for w in spec["grow_widths"])
    overrides = [
        *spec["overrides"],
        f"name=bench-growth-{suite}-{'cache' if cache else 'nocache'}",
        f"train.epochs={epochs[0]}",
        f"grow.schedule=[{steps}]",
        f"grow.cache.enabled={str(cache).lower()}",
        "runtime.timeline_epoch=0",
        "runtime.dashboard=false",
        "checkpoint.enabled=false",
        "tracking.mlflow=false",
    ]
    if limit_train:
        overrides.append(f"data.limit_train={limit_train}")
    if limit_test:
        overrides.append(f"data.limit_test={limit_test}")
    return load_config(REPO / "configs" / spec["config"], overrides)


def run_ray(cfg: RunConfig) -> tuple[dict[str, Any], GrowableNet]:
    from growpipe.runtime.pipeline import Pipeline

    with Pipeline(cfg) as p:
        result = p.train(progress=print)
        return result, p.final_net()


def last_phase_seconds(result: dict[str, Any]) -> list[float]:
    """Epoch seconds of the last phase (the newest block training, earlier ones frozen)."""
    blocks = result["blocks"]
    return [h["seconds"] for h in result["history"] if h["blocks"] == blocks]


def seconds_alone(cfg: RunConfig, net: GrowableNet) -> float:
    """One epoch of a fresh copy of the last block trained alone on precomputed outputs of the frozen
    blocks below it, in this process, one torch thread (a stage's share): the floor for that phase."""
    torch.set_num_threads(1)
    bundle = load_data(cfg.data)
    info = InputInfo.from_bundle(bundle)
    prefix, last = net.blocks[:-1], net.blocks[-1]
    cache = PrefixCache(len(bundle.train), max_mb=1e9, spill=False)
    with torch.no_grad():
        for p in iterate_batches(bundle.train, cfg.data.batch_size, shuffle=False, side_groups=net.side_groups()):
            for b in prefix:
                p = b.forward(p)
            cache.append(p)
    fresh = build_block(cfg.rule(), last.spec, info)
    start = time.perf_counter()
    for p in cache.packets(cfg.data.batch_size, cfg.seed, epoch=cfg.total_epochs()):
        fresh.train_step(p)
    return time.perf_counter() - start


def measure(
    suite: str, epochs: tuple[int, int], limit_train: int | None, limit_test: int | None, out_dir: Path
) -> dict[str, Any]:
    print(f"== {suite}: 2 blocks x {epochs[0]} epochs, then +1 block x {epochs[1]} epochs, twice", flush=True)
    with_cache, net = run_ray(suite_config(suite, epochs, limit_train, True, limit_test))
    without_cache, _ = run_ray(suite_config(suite, epochs, limit_train, False, limit_test))
    cfg = suite_config(suite, epochs, limit_train, True, limit_test)
    alone = seconds_alone(cfg, net)
    cached = statistics.median(last_phase_seconds(with_cache))
    uncached = statistics.median(last_phase_seconds(without_cache))
    full = with_cache["test_accuracy"]
    keys = ("threshold", "accuracy", "mean_depth", "macs_saved_fraction")
    adaptive = [{k: r[k] for k in keys} for r in with_cache["adaptive"]]
    within = [r for r in adaptive if r["accuracy"] >= full - 0.005]
    plot = plot_accuracy_vs_compute(with_cache, out_dir / f"growth-{suite}-accuracy-vs-compute.png",
                                    f"DASCPL on {suite}, grown 2 -> 4 blocks")  # fmt: skip
    row = {
        "suite": suite,
        "acc_before": [g["acc_before"] for g in with_cache["growth"]],
        "acc_after": [g["acc_after"] for g in with_cache["growth"]],
        "acc_after_no_cache": [g["acc_after"] for g in without_cache["growth"]],
        "frozen_unchanged": bool(with_cache["frozen_unchanged"] and without_cache["frozen_unchanged"]),
        "cache_epoch_ratio": cached / alone,
        "nocache_epoch_ratio": uncached / alone,
        "seconds_per_epoch": {"with_cache": cached, "without_cache": uncached, "alone": alone},
        "cache_build_seconds": [c["seconds"] for c in with_cache["prefix_caches"]],
        "prefix_caches": with_cache["prefix_caches"],
        "test_accuracy": full,
        "exit_accuracy": with_cache["exit_accuracy"],
        "adaptive": adaptive,
        "best_macs_saved_within_half_point": max((r["macs_saved_fraction"] for r in within), default=0.0),
        "plot": str(plot),
        "train_samples": with_cache["prefix_caches"][0]["samples"] if with_cache["prefix_caches"] else None,
    }
    print(
        "   accuracy before -> after each growth: "
        + ", ".join(f"{b:.4f} -> {a:.4f}" for b, a in zip(row["acc_before"], row["acc_after"], strict=True))
        + f"; frozen blocks unchanged: {row['frozen_unchanged']}\n"
        f"   last phase s/epoch: with cache {cached:.2f}, without {uncached:.2f}, block alone {alone:.2f} -> "
        f"cache_epoch_ratio {row['cache_epoch_ratio']:.2f}, nocache_epoch_ratio {row['nocache_epoch_ratio']:.2f}\n"
        f"   full path {full:.4f}; adaptive saves {100 * row['best_macs_saved_within_half_point']:.1f}% of MACs "
        f"within 0.5 points; plot {plot}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Growth benchmark: accuracy across growth, prefix cache, adaptive exits")
    ap.add_argument("--quick", action="store_true", help="Fashion-MNIST only, 3000/2000 samples, 1 epoch per phase")
    ap.add_argument("--suites", default=None, help="comma-separated: fashion-mnist,20newsgroups (default: both)")
    ap.add_argument("--limit-train", type=int, help="training samples (default: 3000 quick, 20000 full)")
    ap.add_argument("--limit-test", type=int, help="test samples (default: 2000 quick, all full)")
    ap.add_argument("--epochs", default=None, help="INITIAL,PER_GROWTH epochs (default 1,1 quick, 3,2 full)")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON (plots go beside it)")
    args = ap.parse_args(argv)
    suites = (args.suites or ("fashion-mnist" if args.quick else "fashion-mnist,20newsgroups")).split(",")
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        ap.error(f"--suites: unknown {unknown}; choose from {sorted(SUITES)}")
    raw_epochs = args.epochs or ("1,1" if args.quick else "3,2")
    try:
        epochs = tuple(int(e) for e in raw_epochs.split(","))
        assert len(epochs) == 2 and min(epochs) >= 1
    except (ValueError, AssertionError):
        ap.error(f"--epochs {raw_epochs!r}: give INITIAL,PER_GROWTH, both >= 1, e.g. 3,2")
    limit = args.limit_train or (3000 if args.quick else 20000)
    out_dir = Path(args.json_out).parent if args.json_out else REPO / "bench" / "out"
    start = time.perf_counter()
    limit_test = args.limit_test or (2000 if args.quick else None)
    rows = [measure(s, epochs, limit, limit_test, out_dir) for s in suites]  # type: ignore[arg-type]
    main_row = rows[0]
    out = {
        **{
            k: main_row[k]
            for k in (
                "acc_before",
                "acc_after",
                "frozen_unchanged",
                "cache_epoch_ratio",
                "nocache_epoch_ratio",
                "adaptive",
            )
        },  # fmt: skip
        "cases": rows,
        "settings": {
            "method": "dascpl",
            "epochs": list(epochs),
            "limit_train": limit,
            "limit_test": limit_test,
            "runtime": "ray",
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "quick": args.quick,
        },  # fmt: skip
        "seconds": round(time.perf_counter() - start, 1),
    }
    return end_bench(out, args.json_out)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main())
