"""train.lr_schedule: each block's rate over its own steps (warm-up, then a decay), pure and in a growing net."""

from __future__ import annotations

import math

import pytest

from growpipe.config import LRScheduleSpec
from growpipe.errors import ConfigError
from growpipe.local import train_local
from growpipe.nn.lr_schedule import lr_factor
from tests.conftest import tiny_config


def test_the_factor_warms_up_linearly_then_decays_to_the_floor_and_stays():
    flat = LRScheduleSpec()
    assert flat.is_flat() and [lr_factor(s, flat) for s in (0, 10, 10_000)] == [1.0, 1.0, 1.0]
    warm = LRScheduleSpec(warmup_steps=4)
    assert [lr_factor(s, warm) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    linear = LRScheduleSpec(warmup_steps=2, decay="linear", decay_steps=4, min_factor=0.2)
    assert [lr_factor(s, linear) for s in range(2, 8)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    cosine = LRScheduleSpec(decay="cosine", decay_steps=10)
    assert lr_factor(0, cosine) == 1.0 and lr_factor(5, cosine) == pytest.approx(0.5)
    assert lr_factor(10, cosine) == pytest.approx(0.0) and lr_factor(3, cosine) == pytest.approx(
        (1 + math.cos(math.pi * 0.3)) / 2)  # fmt: skip


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [
        ({"decay": "cosine"}, "train.lr_schedule: decay cosine needs decay_steps: the steps it takes, e.g. 1000"),
        ({"warmup_steps": -1}, "train.lr_schedule.warmup_steps"),
        ({"min_factor": 1.5}, "train.lr_schedule.min_factor"),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_naming_the_field(schedule, needle):
    with pytest.raises(ConfigError) as err:
        tiny_config(train={"lr_schedule": schedule})
    assert needle in str(err.value)


def test_a_grown_block_warms_up_on_its_own_clock_while_the_one_below_goes_on():
    """Two blocks train 1 epoch, then a third is appended (the others keep learning) for 1 more: each block's
    rate is lr times its own warm-up fraction, from its own step count."""
    warmup = 1000
    cfg = tiny_config(data={"limit_train": 256, "batch_size": 64}, train={"lr": 0.01, "lr_schedule": {
        "warmup_steps": warmup}}, grow={"schedule": [{"kind": "layer", "epochs": 1}], "freeze": False})  # fmt: skip
    net = train_local(cfg, progress=None).net
    assert [b.steps for b in net.blocks] == [8, 8, 4]
    for block in net.blocks:
        for opt in block.optimizers.values():
            for group in opt.param_groups:  # the rate of its last step: step steps-1 of the warm-up
                assert group["lr"] == pytest.approx(group["initial_lr"] * block.steps / warmup)
