"""A block's learning rate over its own training steps: a linear warm-up, then a decay (train.lr_schedule).

Every block counts its own steps (Block.steps) from the moment it is built, so a block appended by a growth
warms up and decays on its own clock while the blocks below keep theirs: the learning rate per phase of a
growing net. Each engine sets the rate just before a block's optimizer step (`set_scheduled_lr`), from the
block's step count alone, so the reference trainer and every Ray engine step at the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from growpipe.config.net import LRScheduleSpec

BASE_LR = "initial_lr"
"""The param-group key holding the rate the schedule scales (torch's LR schedulers use the same key)."""


def lr_factor(step: int, spec: LRScheduleSpec) -> float:
    """The multiplier of the base learning rate at a block's training step `step` (0: its first)."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.decay == "none" or spec.decay_steps is None:
        return 1.0
    done = min(1.0, (step - spec.warmup_steps) / spec.decay_steps)
    fall = done if spec.decay == "linear" else (1.0 - math.cos(math.pi * done)) / 2.0
    return 1.0 - (1.0 - spec.min_factor) * fall


def set_scheduled_lr(optimizers: Iterable[torch.optim.Optimizer], step: int, spec: LRScheduleSpec,
                     scale: float = 1.0) -> None:  # fmt: skip
    """Set every param group's rate to its base rate times lr_factor(step) times `scale` (a no-op for the flat
    schedule at scale 1)."""
    if spec.is_flat() and scale == 1.0:
        return
    factor = lr_factor(step, spec) * scale
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group.setdefault(BASE_LR, group["lr"]) * factor
