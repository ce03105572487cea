"""Evaluation of a whole net on a dataset's test split: every exit and the adaptive trade-off."""

from __future__ import annotations

from typing import Any

from growpipe.config import RunConfig
from growpipe.data import DataBundle, iterate_batches
from growpipe.nn.inference import collect_exits, evaluate_exits
from growpipe.nn.net import GrowableNet

EVAL_BATCH = 512


def evaluate_net(net: GrowableNet, bundle: DataBundle, cfg: RunConfig) -> dict[str, Any]:
    """Per-exit and adaptive evaluation on the test split, plus full-path `val_accuracy` when there is a
    validation split (None otherwise)."""
    batches = iterate_batches(bundle.test, EVAL_BATCH, shuffle=False, side_groups=net.side_groups())
    preds = collect_exits(net, batches)
    ev = evaluate_exits(preds, cfg.eval.thresholds, cfg.eval.confidence, net.exit_costs())
    ev["val_accuracy"] = None
    if bundle.val is not None:
        val = collect_exits(net, iterate_batches(bundle.val, EVAL_BATCH, shuffle=False, side_groups=net.side_groups()))
        ev["val_accuracy"] = val.accuracy(val.depths[-1])
    return ev
