"""Growth: appended blocks train, frozen blocks stay bit-identical (parameters and BatchNorm buffers)."""

import pytest
import torch

from growpipe.config import GrowStep
from growpipe.data import iterate_batches, load_data
from growpipe.errors import ShapeError
from growpipe.local import train_local
from growpipe.nn.methods import block_arch, build_block
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, EncoderSpec, InputInfo
from tests.conftest import tiny_config


def _snapshot(block):
    state = block.modules.state_dict()  # parameters and buffers (BatchNorm running stats, counters)
    return {k: v.clone() for k, v in state.items()}


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
def test_frozen_blocks_are_bit_identical_after_append_and_training(method):
    cfg = tiny_config(method=method, net={"backbone": "cnn", "blocks": 2, "widths": [8, 16]})
    bundle = load_data(cfg.data)
    torch.manual_seed(0)
    net = GrowableNet.build(cfg.rule(), cfg.net, InputInfo.from_bundle(bundle))
    for p in iterate_batches(bundle.train, 64, shuffle=True, epoch=0):
        net.train_step(p)
    frozen_before = [_snapshot(b) for b in net.blocks]
    net.freeze()  # the caller decides freezing (grow.freeze in a run)
    new = net.grow(cfg.net, GrowStep(kind="layer", epochs=1))
    new_before = _snapshot(new)
    for epoch in (1, 2):
        for p in iterate_batches(bundle.train, 64, shuffle=True, epoch=epoch):
            net.train_step(p)
    for b, snap in zip(net.blocks[:-1], frozen_before, strict=False):
        assert b.frozen
        now = b.modules.state_dict()
        assert snap.keys() == now.keys()
        assert all(torch.equal(snap[k], now[k]) for k in snap), f"frozen block {b.index} changed"
    assert any(not torch.equal(new_before[k], v) for k, v in new.modules.state_dict().items())


def test_growth_schedule_in_reference_trainer_records_history():
    cfg = tiny_config(method="dascpl", train={"epochs": 2}, grow={"schedule": [{"kind": "layer", "epochs": 1}]})
    r = train_local(cfg, progress=None)
    s = r.summary()
    assert s["blocks"] == 3 and s["epochs"] == 3
    assert s["exit_depths"] == [1, 2, 3]
    g = s["growth"][0]
    assert g["kind"] == "layer" and g["epoch"] == 2 and 0 <= g["acc_before"] <= 1 and 0 <= g["acc_after"] <= 1
    assert [h["training"] for h in s["history"]] == [2, 2, 1]


def test_feature_growth_adds_a_block_reading_a_new_group():
    cfg = tiny_config(
        method="al",
        data={"feature_groups": {"scheme": "bands", "count": 2, "base": 1}},
        train={"epochs": 1},
        grow={"schedule": [{"kind": "feature", "group": "band1", "epochs": 1}]},
    )
    r = train_local(cfg, progress=None)
    last = r.net.blocks[-1]
    assert last.spec.encoder.family == "feature" and last.spec.encoder.params["group"] == "band1"
    assert r.net.side_groups() == ("band1",)
    # the base input has the second band zeroed; the side group carries it
    assert r.bundle.train.x[:, :, 4:, :].abs().sum() == 0
    assert r.bundle.train.side["band1"].shape[1:] == (1, 4, 8)


def test_append_rejects_a_block_whose_input_does_not_chain():
    cfg = tiny_config(method="scpl")
    bundle = load_data(cfg.data)
    info = InputInfo.from_bundle(bundle)
    net = GrowableNet.build(cfg.rule(), cfg.net, info)
    wrong = EncoderSpec("mlp", (100,), "float", {"width": 8, "layers": 1, "dropout": 0.0})
    block = build_block(cfg.rule(), BlockSpec(2, wrong, True, 10, "scpl", block_arch(cfg.rule())), info)
    with pytest.raises(ShapeError, match=r"takes input of shape \(100,\) but block 1 produces \(64,\)"):
        net.append(block)


def test_unknown_side_group_is_refused_at_growth():
    cfg = tiny_config(method="al")
    bundle = load_data(cfg.data)
    net = GrowableNet.build(cfg.rule(), cfg.net, InputInfo.from_bundle(bundle))
    from growpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown feature group 'band7'"):
        net.grow(cfg.net, GrowStep(kind="feature", group="band7"))
