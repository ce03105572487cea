"""Blocks as big as their worker: no stage actor ever holds a block but its own (the per-epoch evaluation
streams through the stages), through training, evaluation, growth, checkpoints, recovery and resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import growpipe.faults
from growpipe.checkpoint import CheckpointStore
from growpipe.data import load_data
from growpipe.errors import StageError
from growpipe.local import train_local
from growpipe.nn.methods import build_block
from growpipe.nn.net import plan_blocks
from growpipe.nn.specs import InputInfo
from growpipe.runtime.pipeline import Pipeline
from growpipe.runtime.stage import Stage
from tests.conftest import tiny_config


def test_the_guard_fails_a_stage_that_builds_a_block_it_was_not_given(monkeypatch):
    monkeypatch.setenv("GROWPIPE_OWN_BLOCKS_ONLY", "1")
    monkeypatch.setattr(growpipe.faults, "guarded_stage", None)  # put back after the test
    cfg = tiny_config(threads=1)
    info = InputInfo.from_bundle(load_data(cfg.data), cfg.net)
    specs = plan_blocks(cfg.net, cfg.rule(), info)
    threads = torch.get_num_threads()
    try:  # a stage sets torch's threads to runtime.cpus_per_stage
        stage = Stage(1, cfg)
    finally:
        torch.set_num_threads(threads)
    stage.setup(specs[1], info)  # its own block: fine
    with pytest.raises(StageError, match="stage 1 built block 0, which it does not hold"):
        build_block(cfg.rule(), specs[0], info)  # what gathering the net into this actor would do


@pytest.mark.usefixtures("ray_session")
def test_each_stage_holds_only_its_block_through_growth_a_stage_lost_in_evaluation_and_a_resume(tmp_path: Path,
                                                                                             monkeypatch):  # fmt: skip
    """AL (its exits read through the label-side decoders of the blocks below), grown by a block that trains
    from the frozen prefix's cache, a checkpoint every epoch; stage 1 dies in the first evaluation and is
    replaced from the newest checkpoint; then the run is resumed for one more epoch. Every stage actor runs
    with the guard: building any block it was not given fails the run."""
    monkeypatch.setenv("GROWPIPE_OWN_BLOCKS_ONLY", "1")
    monkeypatch.setenv("GROWPIPE_DIE_IN_EVAL", f"1:{tmp_path / 'died'}")
    grow = {"schedule": [{"kind": "layer", "epochs": 1}]}
    ck = {"enabled": True, "uri": str(tmp_path / "ck"), "every_epochs": 1}
    cfg = tiny_config(name="bounded", method="al", threads=1, train={"epochs": 1}, grow=grow, checkpoint=ck)
    reference = train_local(cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(
        update={"enabled": False})}), progress=None).summary()  # fmt: skip
    lines: list[str] = []
    with Pipeline(cfg) as p:
        result = p.train(progress=lines.append, keep_net=False)
    assert (tmp_path / "died").exists() and result["restarts"] == 1, lines
    assert any(line.startswith("recover") for line in lines) and any(line.startswith("cache") for line in lines)
    assert result["blocks"] == 3 and result["epochs"] == 2
    assert result["exit_accuracy"] == pytest.approx(reference["exit_accuracy"], abs=1e-6)  # replayed exactly

    latest = CheckpointStore(str(tmp_path / "ck"), "bounded").latest()
    longer = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 2})})
    with Pipeline(longer, resume=latest.path) as p:
        resumed = p.train(progress=None, keep_net=False)
    assert resumed["epochs"] == 3 and resumed["blocks"] == 3 and resumed["early_exit"]["accuracy"] > 0
