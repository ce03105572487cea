"""Local losses equal a direct, loop-by-loop computation on a tiny hand-made batch."""

import math

import torch
import torch.nn.functional as F

from growpipe.nn.methods.al import association_loss, autoencoder_loss
from growpipe.nn.methods.scpl import supcon_loss
from growpipe.nn.packet import Packet
from tests.conftest import tiny_config


def test_association_loss_is_mean_squared_norm():
    b = torch.tensor([[0.1, 0.9], [0.5, 0.5], [1.0, 0.0]])
    t = torch.tensor([[0.0, 1.0], [0.5, 0.0], [0.0, 0.0]])
    direct = ((0.1**2 + 0.1**2) + (0.0 + 0.5**2) + (1.0**2 + 0.0)) / 3
    assert math.isclose(association_loss(b, t).item(), direct, rel_tol=1e-6)
    assert math.isclose(association_loss(b, t, "mean").item(), direct / 2, rel_tol=1e-6)  # the seeds' MSELoss


def test_al_blocks_default_to_the_seeds_activations_and_decoders_and_keep_the_old_ones_reachable():
    from growpipe.nn.methods.al import ALBlock
    from growpipe.nn.net import GrowableNet
    from growpipe.nn.specs import InputInfo

    info = InputInfo(shape=(1, 8, 8), dtype="float", num_classes=10)
    before = {"activation": "sigmoid", "decoder_activation": True, "loss_reduction": "sum", "label_lr_scale": 10}
    for al, act, top_decoder in (({}, torch.nn.Tanh, torch.nn.Linear), (before, torch.nn.Sigmoid, torch.nn.Sequential)):
        cfg = tiny_config(method="al", al=al)
        net = GrowableNet.build(cfg.rule(), cfg.net, info)
        first, second = net.blocks
        assert isinstance(first, ALBlock) and isinstance(first.modules["b"][1], act)
        assert isinstance(first.modules["g"][1], act) and isinstance(second.modules["h"], top_decoder)
        rates = [g["lr"] for g in second.optimizers["gh"].param_groups]
        assert rates == [cfg.train.lr * cfg.al.label_lr_scale]


def test_scpl_classifiers_read_a_layernormed_input_by_default_and_not_when_asked():
    """scpl.classifier_norm (default on): every DASCPL exit reads its features at unit scale, so its logits are
    the same for features 100x larger (a block whose scale drifted); off, the plain head as before."""
    from growpipe.nn.net import GrowableNet
    from growpipe.nn.specs import InputInfo

    info = InputInfo(shape=(1, 8, 8), dtype="float", num_classes=10)
    for classifier in ("linear", "mlp"):
        cfg = tiny_config(method="dascpl", scpl={"classifier": classifier})
        torch.manual_seed(0)
        heads = [b.modules["cls"].eval() for b in GrowableNet.build(cfg.rule(), cfg.net, info).blocks]
        feats = torch.randn(5, heads[0][0].normalized_shape[0])
        assert all(isinstance(h[0], torch.nn.LayerNorm) for h in heads)
        assert torch.allclose(heads[0](feats), heads[0](feats * 100), atol=1e-4)
    plain = tiny_config(method="scpl", scpl={"classifier_norm": False})
    assert isinstance(GrowableNet.build(plain.rule(), plain.net, info).blocks[-1].modules["cls"], torch.nn.Linear)


def test_autoencoder_loss_cross_entropy_on_first_block_squared_error_above():
    recon = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    y = torch.tensor([0, 1])
    ce = 0.0
    for row, label in zip(recon.tolist(), y.tolist(), strict=True):
        ce += -(row[label] - math.log(sum(math.exp(v) for v in row)))
    assert math.isclose(autoencoder_loss(recon, None, y, first=True).item(), ce / 2, rel_tol=1e-6)
    t_prev = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    se = ((1.0**2 + 0 + 1.0**2) + (0 + 1.0**2 + 1.0**2)) / 2
    assert math.isclose(autoencoder_loss(recon, t_prev, y, first=False).item(), se, rel_tol=1e-6)


def test_supcon_matches_the_definition():
    z = F.normalize(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]]), dim=1)
    y = torch.tensor([0, 0, 1, 2])  # anchors 2 and 3 have no positive and are skipped
    tau = 0.1
    total, anchors = 0.0, 0
    for i in range(4):
        pos = [p for p in range(4) if p != i and y[p] == y[i]]
        if not pos:
            continue
        denom = sum(math.exp(float(z[i] @ z[a]) / tau) for a in range(4) if a != i)
        total += -sum(math.log(math.exp(float(z[i] @ z[p]) / tau) / denom) for p in pos) / len(pos)
        anchors += 1
    assert math.isclose(supcon_loss(z, y, tau).item(), total / anchors, rel_tol=1e-5)


def test_supcon_without_positives_is_zero_and_differentiable():
    z = F.normalize(torch.randn(3, 4, requires_grad=True), dim=1)
    loss = supcon_loss(z, torch.tensor([0, 1, 2]), 0.1)
    loss.backward()
    assert loss.item() == 0.0


def test_al_block_reports_the_losses_its_modules_give():
    from growpipe.data import iterate_batches, load_data
    from growpipe.nn.backbones import head_features
    from growpipe.nn.net import GrowableNet
    from growpipe.nn.specs import InputInfo

    cfg = tiny_config(method="al")
    bundle = load_data(cfg.data)
    net = GrowableNet.build(cfg.rule(), cfg.net, InputInfo.from_bundle(bundle))
    p: Packet = next(iterate_batches(bundle.train, 16, shuffle=False))
    block = net.blocks[0]
    m = block.modules
    with torch.no_grad():
        m.train()
        s, mask, _ = block.encode(p)
        t = m["g"](F.one_hot(p.y, 10).float())
        assoc = ((m["b"](head_features(s, mask)) - t) ** 2).mean().item()  # al.loss_reduction mean
        ae = F.cross_entropy(m["h"](t), p.y).item()
    _, metrics = block.train_step(p)
    assert math.isclose(metrics["assoc"], assoc, rel_tol=1e-5)
    assert math.isclose(metrics["ae"], ae, rel_tol=1e-5)
