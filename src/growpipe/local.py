"""The single-process reference trainer: every block in order for every batch, no Ray.

It is the oracle the Ray runtime is checked against: for a seed, the data order, initial weights and
updates are fixed. It grows where the config's growth plan says (schedule, every N epochs, or on a
validation plateau), appending a block and freezing the earlier ones.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from growpipe.callbacks import notify, run_callbacks
from growpipe.config import RunConfig
from growpipe.data import DataBundle, iterate_batches, load_data
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.evaluation import evaluate_net
from growpipe.growth import FrozenWatch, GrowthPlan, growth_event, note_epoch
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from growpipe.report import epoch_row, format_epoch, summarize
from growpipe.tracking import resolve_tracking

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
    frozen_unchanged: bool | None = None

    def summary(self) -> dict[str, Any]:
        """The result JSON (see growpipe.report.summarize)."""
        summary = summarize(
            self.net.cfg,
            self.net.depth,
            self.history,
            self.growth,
            self.evaluation,
            self.train_seconds,
            self.samples_seen,
        )
        summary["frozen_unchanged"] = self.frozen_unchanged
        return summary


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


def train_local(cfg: RunConfig, progress: Progress | None = print, bundle: DataBundle | None = None) -> TrainResult:
    """Train (and grow) a net in this process; return the trained net, its history and evaluation."""
    say = progress or (lambda _msg: None)
    cfg = resolve_tracking(cfg)
    callbacks = run_callbacks(cfg, cfg.name, say)
    try:
        result = _train(cfg, say, bundle, callbacks)
    except Exception as e:
        notify(callbacks, "on_error", f"{type(e).__name__}: {e}", say=say)
        raise
    finally:
        notify(callbacks, "close", say=say)
    return result


def _train(cfg: RunConfig, say: Progress, bundle: DataBundle | None, callbacks: list[Any]) -> TrainResult:
    set_cpu_threads(cfg.threads)
    device = resolve_device(cfg.device)
    bundle = bundle or load_data(cfg.data)
    say(f"data   {bundle.summary()}")
    seed_everything(cfg.seed)
    net = GrowableNet.build(cfg, InputInfo.from_bundle(bundle), device)
    say(f"net    {cfg.method} on {cfg.net.backbone}, {net.depth} blocks, device {device}")
    notify(callbacks, "on_start", say=say)
    result = TrainResult(net=net, bundle=bundle)
    plan = GrowthPlan(cfg)
    watch = FrozenWatch()
    epoch = 0
    ev: dict[str, Any] | None = None

    def grow_if_due() -> None:
        nonlocal ev
        for step in plan.due(epoch, result.history, net.depth):
            event = growth_event(epoch, step, net.depth + 1, result.history, plan.policy)
            block = net.grow(step)
            watch.note({b.index: b.checksum() for b in net.blocks if b.frozen})
            plan.grew(epoch)
            ev = None
            result.growth.append(event)
            notify(callbacks, "on_growth", event, say=say)
            say(f"grow   +{step.kind} block {block.index} ({block.spec.encoder.family}) -> {net.depth} blocks")

    grow_if_due()
    while epoch < plan.total_epochs:
        epoch += 1
        losses, samples, seconds = _epoch(net, bundle, cfg, epoch)
        result.train_seconds += seconds
        result.samples_seen += samples
        ev = evaluate_net(net, bundle, cfg)
        training = sum(not b.frozen for b in net.blocks)
        row = epoch_row(epoch, cfg, net.depth, training, losses, ev, samples, seconds)
        result.history.append(row)
        note_epoch(result.growth, row)
        say(format_epoch(row))
        notify(callbacks, "after_epoch", row, say=say)
        grow_if_due()
    result.frozen_unchanged = watch.unchanged({b.index: b.checksum() for b in net.blocks})
    result.evaluation = ev or evaluate_net(net, bundle, cfg)  # the last epoch's, unless the net changed since
    summary = result.summary()
    notify(callbacks, "on_finish", summary, say=say)
    notify(callbacks, "on_final_net", net, summary, say=say)
    return result
