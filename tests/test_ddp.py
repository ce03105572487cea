"""Data-parallel BP through Ray Train (TorchTrainer, DDP over gloo): the baseline pipelines are measured
against, on the same blocks and global batch as single-process BP."""

from __future__ import annotations

import pytest

from growpipe.api import train
from growpipe.local import train_local
from tests.conftest import tiny_config


@pytest.mark.usefixtures("ray_session")
def test_ray_train_ddp_tracks_single_process_bp():
    cfg = tiny_config(name="ddp", method="bp", threads=1, net={"blocks": 2, "width": 64}, train={"epochs": 2},
                      runtime={"engine": "ddp"}, ddp={"workers": 2})  # fmt: skip
    bp = train_local(cfg, progress=None)
    lines: list[str] = []
    run = train(cfg, progress=lines.append, keep_net=True)
    result, net = run.result, run.net
    assert result["runtime"] == "ray-train-ddp" and result["workers"] == 2 and result["epochs"] == 2
    # two equal shards per global batch, gradients averaged: the same steps as BP up to float rounding
    # (the last, odd-sized batch of each epoch splits unevenly)
    assert abs(result["test_accuracy"] - bp.summary()["test_accuracy"]) <= 0.01
    losses = [r["loss"]["b1.ce"] for r in result["history"]]
    assert losses == sorted(losses, reverse=True) and losses[0] == pytest.approx(
        bp.history[0]["loss"]["b1.ce"], rel=0.02
    )
    assert net is not None and net.depth == 2
    assert any("2 DDP workers" in line for line in lines)
