"""Every backbone family builds, cuts into blocks that chain, trains one step, grows, and counts MACs."""

import pytest
import torch

from growpipe.config import GrowStep
from growpipe.errors import ConfigError
from growpipe.nn.net import GrowableNet
from growpipe.nn.packet import Packet
from growpipe.nn.specs import InputInfo
from tests.conftest import tiny_config

CASES = {
    "mlp": (InputInfo((10,), "float", 3), {"blocks": 3, "width": 16}),
    "cnn": (InputInfo((3, 16, 16), "float", 3), {"blocks": 3, "widths": [4, 8, 8]}),
    "resnet18": (InputInfo((3, 16, 16), "float", 3), {"blocks": 4}),
    "embedding": (InputInfo((12,), "long", 3, vocab_size=50), {"blocks": 3, "width": 16, "embed_dim": 8}),
    "lstm": (InputInfo((12,), "long", 3, vocab_size=50), {"blocks": 3, "width": 8, "embed_dim": 8}),
    "transformer": (InputInfo((12,), "long", 3, vocab_size=50), {"blocks": 3, "width": 16, "heads": 2}),
}


def _packet(info: InputInfo, n: int = 6) -> Packet:
    g = torch.Generator().manual_seed(0)
    if info.dtype == "long":
        x = torch.randint(2, info.vocab_size, (n, *info.shape), generator=g)
        x[0, 6:] = 0  # one shorter document: padding
    else:
        x = torch.randn((n, *info.shape), generator=g)
    return Packet(x=x, y=torch.arange(n) % info.num_classes)


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
@pytest.mark.parametrize("backbone", list(CASES))
def test_backbone_blocks_chain_and_train(backbone, method):
    info, net_params = CASES[backbone]
    cfg = tiny_config(method=method, net={"backbone": backbone, **net_params})
    torch.manual_seed(0)
    net = GrowableNet.build(cfg.rule(), cfg.net, info)
    assert net.depth == net_params["blocks"]
    for prev, nxt in zip(net.blocks, net.blocks[1:], strict=False):
        assert tuple(nxt.in_shape) == tuple(prev.out_shape)
    p = _packet(info)
    before = [prm.detach().clone() for prm in net.blocks[-1].parameters()]
    metrics = net.train_step(p)
    assert metrics and all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, net.blocks[-1].parameters(), strict=True))
    logits = net.exit_logits(p)
    assert logits[net.depth].shape == (6, 3)
    costs = net.exit_costs()
    encoders = [enc for enc, _ in costs.values()]
    assert encoders[-1] > 0 and encoders == sorted(encoders)  # embedding lookups count 0, the rest add up
    net.grow(cfg.net, GrowStep(kind="layer", epochs=1))
    net.train_step(p)
    assert net.exit_logits(p)[net.depth].shape == (6, 3)


def test_resnet18_cut_covers_all_eight_units():
    info, _ = CASES["resnet18"]
    for k in (1, 2, 3, 8):
        cfg = tiny_config(net={"backbone": "resnet18", "blocks": k})
        net = GrowableNet.build(cfg.rule(), cfg.net, info)
        units = [(b.spec.encoder.params["start"], b.spec.encoder.params["end"]) for b in net.blocks]
        assert units[0][0] == 0 and units[-1][1] == 8
        assert all(a[1] == b[0] for a, b in zip(units, units[1:], strict=False))


def test_mlp_macs_are_exact():
    info = InputInfo((10,), "float", 3)
    cfg = tiny_config(method="dascpl", net={"backbone": "mlp", "blocks": 2, "width": 16})
    net = GrowableNet.build(cfg.rule(), cfg.net, info)
    costs = net.exit_costs()
    assert costs[1] == (10 * 16, 16 * 3)
    assert costs[2] == (10 * 16 + 16 * 16, 16 * 3)


@pytest.mark.parametrize(
    ("backbone", "info", "needle"),
    [
        ("cnn", InputInfo((12,), "long", 3, vocab_size=50), "cnn needs images"),
        ("lstm", InputInfo((3, 8, 8), "float", 3), "lstm needs text"),
        ("mlp", InputInfo((12,), "long", 3, vocab_size=50), "mlp cannot read token ids"),
    ],
)
def test_backbone_that_does_not_fit_the_data_is_refused(backbone, info, needle):
    with pytest.raises(ConfigError, match=needle):
        cfg = tiny_config(net={"backbone": backbone})
        GrowableNet.build(cfg.rule(), cfg.net, info)
