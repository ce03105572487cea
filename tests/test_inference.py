"""Exits, adaptive inference and its compute accounting on hand-made predictions."""

import math

import pytest
import torch

from growpipe.local import train_local
from growpipe.nn.inference import ExitPredictions, adaptive_exit, confidence, evaluate_exits
from tests.conftest import tiny_config


def _preds() -> ExitPredictions:
    probs = {
        1: torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.55, 0.45]]),
        2: torch.tensor([[0.2, 0.8], [0.1, 0.9], [0.3, 0.7]]),
    }
    return ExitPredictions([1, 2], probs, torch.tensor([0, 1, 1]))


def test_adaptive_exits_at_first_confident_depth():
    pred, taken = adaptive_exit(_preds(), 0.58, "max_prob")
    assert taken.tolist() == [0, 0, 1] and pred.tolist() == [0, 0, 1]
    pred, taken = adaptive_exit(_preds(), 0.95, "max_prob")
    assert taken.tolist() == [1, 1, 1]


def test_entropy_confidence_is_one_minus_normalised_entropy():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    c = confidence(p, "entropy")
    assert math.isclose(c[0].item(), 0.0, abs_tol=1e-6) and math.isclose(c[1].item(), 1.0, abs_tol=1e-6)


def test_threshold_outside_unit_interval():
    with pytest.raises(ValueError, match=r"threshold 1.2 is outside \[0, 1\]"):
        adaptive_exit(_preds(), 1.2, "max_prob")


def test_evaluate_exits_accounts_compute():
    costs = {1: (100, 10), 2: (300, 10)}
    ev = evaluate_exits(_preds(), [0.58], "max_prob", costs)
    assert ev["exit_accuracy"] == pytest.approx([1 / 3, 2 / 3])
    assert ev["macs_per_exit"] == [110, 310]
    row = ev["adaptive"][0]
    # two samples leave at depth 1 (110 MACs), one goes on and pays both heads (300 + 20)
    assert row["macs_per_sample"] == pytest.approx((2 * 110 + 320) / 3)
    assert row["mean_depth"] == pytest.approx(4 / 3)
    assert row["accuracy"] == pytest.approx(2 / 3)  # predictions 0, 0, 1 against labels 0, 1, 1
    assert row["macs_saved_fraction"] == pytest.approx(1 - (540 / 3) / 310)


def test_shortcut_and_full_path_predictions_of_a_trained_net():
    r = train_local(tiny_config(method="al", train={"epochs": 3}), progress=None)
    x = r.bundle.test.x[:50]
    full = r.net.predict(x)
    short = r.net.predict(x, depth=1)
    assert full.shape == short.shape == (50, 10)
    with pytest.raises(ValueError, match="has no exit"):
        r.net.predict(x, depth=5)


def test_the_automatic_exit_threshold_never_costs_more_than_the_full_path():
    from growpipe.nn.inference import chosen_threshold

    def table(*rows: tuple[float, float, float]) -> dict:
        adaptive = [{"threshold": t, "accuracy": a, "macs_saved_fraction": s} for t, a, s in rows]
        return {"full_accuracy": 0.90, "adaptive": adaptive}

    # the lowest threshold within half a point that saves compute; 0.5 loses accuracy, 0.99 costs more
    assert chosen_threshold(table((0.5, 0.80, 0.7), (0.9, 0.899, 0.3), (0.99, 0.90, -0.39)), None) == 0.9
    # accurate enough only where it costs more than the full path (an AL run of 3 epochs): the full path
    assert chosen_threshold(table((0.5, 0.70, 0.7), (0.99, 0.90, -0.394)), None) is None
    assert chosen_threshold(table(), None) is None
    assert chosen_threshold(table((0.99, 0.90, -0.39)), 0.99) == 0.99  # eval.exit_threshold is the user's


def test_early_exit_at_the_full_path_is_reported_as_such():
    from growpipe.report import format_exits

    early = {"threshold": None, "accuracy": 0.9, "full_path_seconds_per_sample": 1e-5}
    ev = {"exit_depths": [1, 2], "exit_accuracy": [0.5, 0.9], "macs_per_exit": [10, 20], "confidence": "max_prob",
          "adaptive": [], "early_exit": early}  # fmt: skip
    assert "the full path answers (0.9000, 10.0 us/sample)" in format_exits(ev)
