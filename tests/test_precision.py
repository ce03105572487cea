"""train.precision bf16: autocast forward passes, fp32 weights and optimizer state, bfloat16 activations between
blocks; every rule still learns, and the pipelined BP schedules run it too."""

from __future__ import annotations

import pytest
import torch

from growpipe.api import train
from growpipe.cli import main
from growpipe.local import train_local
from growpipe.nn.packet import Packet
from tests.conftest import tiny_config


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
def test_bf16_learns_like_fp32_keeps_fp32_weights_and_hands_on_bfloat16(method):
    runs = {p: train_local(tiny_config(method=method, threads=1, train={"epochs": 6, "precision": p}),
                           progress=None) for p in ("fp32", "bf16")}  # fmt: skip
    fp32, bf16 = (runs[p].result["test_accuracy"] for p in ("fp32", "bf16"))
    assert bf16 >= fp32 - 0.03, (fp32, bf16)
    net = runs["bf16"].net
    block = net.blocks[0]
    assert all(t.dtype == torch.float32 for t in block.modules.state_dict().values() if t.is_floating_point())
    for opt in block.optimizers.values():
        for state in opt.state.values():
            assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v) and v.ndim > 0)
    batch = runs["bf16"].bundle.test
    out = block.forward(Packet(x=batch.x[:8], y=batch.y[:8]))
    assert out.x.dtype == torch.bfloat16  # what crosses a hop
    assert runs["bf16"].result["early_exit"]["accuracy"] == pytest.approx(bf16, abs=0.02)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_bp_trains_in_bf16_like_single_process_bp(schedule):
    cfg = tiny_config(method="bp", threads=1, train={"epochs": 4, "precision": "bf16"},
                      runtime={"engine": schedule}, bp_pipeline={"micro_batches": 2})  # fmt: skip
    reference = train_local(cfg, progress=None).result["test_accuracy"]
    result = train(cfg, progress=None, keep_net=False).result
    assert abs(result["test_accuracy"] - reference) <= 0.03, (result["test_accuracy"], reference)


def test_an_unknown_precision_is_refused_before_anything_runs(capsys):
    assert main(["train", "--runtime", "local", "--set", "train.precision=fp8"]) == 2
    err = capsys.readouterr().err
    assert "train.precision: got 'fp8'; input should be 'fp32' or 'bf16'" in err
