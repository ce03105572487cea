"""The single-process reference trainer: every block in order for every batch, no Ray.

It is the oracle the Ray runtime is checked against: for a seed, the data order, initial weights and
updates are fixed. It runs the growth schedule too: train the initial blocks for train.epochs, then for
each grow step append a block (freezing the earlier ones) and train for step.epochs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from growpipe.config import RunConfig
from growpipe.data import DataBundle, iterate_batches, load_data
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.nn.inference import collect_exits, evaluate_exits
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo

Progress = Callable[[str], None]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class TrainResult:
    """What a run produced: the trained net, per-epoch history, growth events and the final evaluation."""

    net: GrowableNet
    bundle: DataBundle
    history: list[dict[str, Any]] = field(default_factory=list)
    growth: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] = field(default_factory=dict)
    train_seconds: float = 0.0
    samples_seen: int = 0

    def summary(self) -> dict[str, Any]:
        """The result JSON: method, dataset, blocks, accuracy per exit, speed, history, growth, adaptive."""
        cfg = self.net.cfg
        ev = self.evaluation
        return {
            "method": cfg.method,
            "dataset": cfg.data.name,
            "backbone": cfg.net.backbone,
            "blocks": self.net.depth,
            "epochs": len(self.history),
            "test_accuracy": ev["full_accuracy"],
            "exit_depths": ev["exit_depths"],
            "exit_accuracy": ev["exit_accuracy"],
            "macs_per_exit": ev["macs_per_exit"],
            "adaptive": ev["adaptive"],
            "confidence": ev["confidence"],
            "train_seconds": round(self.train_seconds, 3),
            "samples_per_second": round(self.samples_seen / self.train_seconds, 1) if self.train_seconds else 0.0,
            "seconds_per_epoch": round(self.train_seconds / max(len(self.history), 1), 3),
            "history": self.history,
            "growth": self.growth,
            "config": cfg.model_dump(mode="json"),
        }


def evaluate_net(net: GrowableNet, bundle: DataBundle, cfg: RunConfig) -> dict[str, Any]:
    """Per-exit and adaptive evaluation on the test split."""
    batches = iterate_batches(bundle.test, 512, shuffle=False, side_groups=net.side_groups())
    preds = collect_exits(net, batches)
    return evaluate_exits(preds, cfg.eval.thresholds, cfg.eval.confidence, net.exit_costs())


def _epoch(net: GrowableNet, bundle: DataBundle, cfg: RunConfig, epoch: int) -> tuple[dict[str, float], int, float]:
    sums: dict[str, float] = {}
    batches = 0
    samples = 0
    start = time.perf_counter()
    for p in iterate_batches(
        bundle.train,
        cfg.data.batch_size,
        shuffle=True,
        seed=cfg.seed,
        epoch=epoch,
        side_groups=net.side_groups(),
    ):
        for k, v in net.train_step(p).items():
            sums[k] = sums.get(k, 0.0) + v
        batches += 1
        samples += p.batch_size
    seconds = time.perf_counter() - start
    return {k: v / max(batches, 1) for k, v in sums.items()}, samples, seconds


def _format_epoch(row: dict[str, Any]) -> str:
    losses = " ".join(f"{k}={v:.3f}" for k, v in row["loss"].items())
    accs = " ".join(f"@{d}={a:.4f}" for d, a in zip(row["exit_depths"], row["exit_accuracy"], strict=True))
    return (
        f"epoch {row['epoch']:>3}/{row['of']} | blocks {row['blocks']} (training {row['training']}) | "
        f"loss {losses} | acc {accs} | {row['samples_per_second']:.0f} samples/s | {row['seconds']:.1f}s"
    )


def train_local(cfg: RunConfig, progress: Progress | None = print, bundle: DataBundle | None = None) -> TrainResult:
    """Train (and grow) a net in this process; return the trained net, its history and evaluation."""
    say = progress or (lambda _msg: None)
    set_cpu_threads(cfg.threads)
    device = resolve_device(cfg.device)
    bundle = bundle or load_data(cfg.data)
    say(f"data   {bundle.summary()}")
    seed_everything(cfg.seed)
    net = GrowableNet.build(cfg, InputInfo.from_bundle(bundle), device)
    say(f"net    {cfg.method} on {cfg.net.backbone}, {net.depth} blocks, device {device}")
    result = TrainResult(net=net, bundle=bundle)
    phases = [(None, cfg.train.epochs), *((s, s.epochs) for s in cfg.grow.schedule)]
    total = cfg.total_epochs()
    epoch = 0
    for step, epochs in phases:
        acc_before = None
        if step is not None:
            acc_before = evaluate_net(net, bundle, cfg)["full_accuracy"] if result.history else None
            block = net.grow(step)
            say(f"grow   +{step.kind} block {block.index} ({block.spec.encoder.family}) -> {net.depth} blocks")
        for _ in range(epochs):
            epoch += 1
            losses, samples, seconds = _epoch(net, bundle, cfg, epoch)
            result.train_seconds += seconds
            result.samples_seen += samples
            ev = evaluate_net(net, bundle, cfg)
            row = {
                "epoch": epoch,
                "of": total,
                "blocks": net.depth,
                "training": sum(not b.frozen for b in net.blocks),
                "loss": losses,
                "exit_depths": ev["exit_depths"],
                "exit_accuracy": ev["exit_accuracy"],
                "test_accuracy": ev["full_accuracy"],
                "samples_per_second": samples / seconds if seconds else 0.0,
                "seconds": seconds,
            }
            result.history.append(row)
            say(_format_epoch(row))
        if step is not None:
            acc_after = result.history[-1]["test_accuracy"] if epochs else None
            result.growth.append(
                {
                    "epoch": epoch - epochs,
                    "kind": step.kind,
                    "group": step.group,
                    "blocks": net.depth,
                    "acc_before": acc_before,
                    "acc_after": acc_after,
                }
            )
    result.evaluation = evaluate_net(net, bundle, cfg)
    return result


def format_report(summary: dict[str, Any]) -> str:
    """A short human-readable table of the result JSON."""
    lines = [
        f"{summary['method']} on {summary['dataset']} ({summary['backbone']}, {summary['blocks']} blocks, "
        f"{summary['epochs']} epochs): test accuracy {summary['test_accuracy']:.4f}, "
        f"{summary['samples_per_second']:.0f} samples/s, {summary['train_seconds']:.1f}s training",
        "  exit depth  accuracy  MACs/sample",
    ]
    for d, a, m in zip(summary["exit_depths"], summary["exit_accuracy"], summary["macs_per_exit"], strict=True):
        lines.append(f"  {d:>10}  {a:8.4f}  {m:>11,}")
    if len(summary["exit_depths"]) > 1:
        lines.append(f"  adaptive ({summary['confidence']}): threshold  accuracy  mean depth  MACs saved")
        for r in summary["adaptive"]:
            lines.append(
                f"  {r['threshold']:>29.2f}  {r['accuracy']:8.4f}  {r['mean_depth']:10.2f}  "
                f"{100 * r['macs_saved_fraction']:9.1f}%"
            )
    for g in summary["growth"]:
        before = "n/a" if g["acc_before"] is None else f"{g['acc_before']:.4f}"
        after = "n/a" if g["acc_after"] is None else f"{g['acc_after']:.4f}"
        lines.append(f"  growth at epoch {g['epoch']}: +{g['kind']} -> {g['blocks']} blocks, acc {before} -> {after}")
    return "\n".join(lines)
