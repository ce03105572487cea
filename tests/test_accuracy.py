"""Every rule (and BP) reaches >= 90% test accuracy on digits with MLP blocks in under 60 s."""

import time

import pytest

from growpipe.config import build_config
from growpipe.local import train_local


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
def test_rule_learns_digits(method):
    cfg = build_config(
        {"method": method, "net": {"backbone": "mlp", "blocks": 2, "width": 256}, "train": {"epochs": 12}}
    )
    start = time.perf_counter()
    result = train_local(cfg, progress=None)
    elapsed = time.perf_counter() - start
    s = result.summary()
    assert s["test_accuracy"] >= 0.90, s["exit_accuracy"]
    assert elapsed < 60, f"{method} took {elapsed:.1f}s"
    if method in ("al", "dascpl"):
        assert min(s["exit_accuracy"]) >= 0.85, "every exit is usable"


def test_same_seed_same_weights():
    import torch

    cfg = build_config({"method": "al", "net": {"width": 32}, "train": {"epochs": 1}, "al": {"code_dim": 8}})
    a = train_local(cfg, progress=None).net.state_dict()
    b = train_local(cfg, progress=None).net.state_dict()
    for sa, sb in zip(a["blocks"], b["blocks"], strict=True):
        assert all(torch.equal(sa["modules"][k], sb["modules"][k]) for k in sa["modules"])
