"""Evaluation of a whole net on a dataset's test split: every exit and the adaptive trade-off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from growpipe.config import EvalSpec, RunConfig, apply_overrides, build_config
from growpipe.data import DataBundle, iterate_batches, load_data
from growpipe.errors import ConfigError
from growpipe.nn.inference import ExitPredictions, collect_exits, evaluate_exits
from growpipe.nn.net import GrowableNet

EVAL_BATCH = 512


EVAL_OVERRIDES = ("eval.", "data.root", "data.download", "data.limit_test")
"""What may change when a checkpoint is evaluated again; the rest is fixed by the checkpoint."""


def load_for_evaluation(
    checkpoint: str | Path, overrides: list[str] | None = None
) -> tuple[GrowableNet, DataBundle, RunConfig]:
    """A checkpoint's net, its data and its config with `overrides` applied (eval.* and where the data is);
    refused when the data's shape, classes or vocabulary differ from what the net was trained on. Any
    checkpoint directory: `--save` output, a run checkpoint, or a run's checkpoint folder (the newest)."""
    from growpipe.checkpoint import check_input_matches, load_net
    from growpipe.nn.specs import InputInfo

    overrides = overrides or []
    bad = [o for o in overrides if not o.split("=", 1)[0].strip().startswith(EVAL_OVERRIDES)]
    if bad:
        raise ConfigError(
            f"--set {bad[0]}: evaluate takes eval.* and data.root / data.download / data.limit_test only; "
            "the rest is fixed by the checkpoint"
        )
    net, manifest, _ = load_net(checkpoint)
    raw = apply_overrides(manifest["config"], overrides)
    if manifest["input"].get("normalize"):  # the training split's statistics, whatever data is evaluated
        raw.setdefault("data", {})["normalize"] = manifest["input"]["normalize"]
    cfg = build_config(raw, "checkpoint config + --set")
    bundle = load_data(cfg.data)
    check_input_matches(manifest["input"], InputInfo.from_bundle(bundle).to_dict())
    return net, bundle, cfg


def split_predictions(net: GrowableNet, bundle: DataBundle, split: str = "test") -> ExitPredictions:
    """Every exit's probabilities on the `split` ("test" or "val") of `bundle`."""
    data = bundle.test if split == "test" else bundle.val
    if data is None:
        raise ConfigError(
            "split val: the net was trained without a validation split; train it with data.val_fraction > 0 "
            "or use split test"
        )
    return collect_exits(net, iterate_batches(data, EVAL_BATCH, shuffle=False, side_groups=net.side_groups()))


def evaluate_states(
    cfg: RunConfig,
    bundle: DataBundle,
    info: Any,
    topology: list[dict[str, Any]],
    states: list[dict[str, Any]],
    device: Any = "cpu",
) -> dict[str, Any]:
    """Rebuild a net from its topology and every block's state (as the stage actors hold them) and
    evaluate it like evaluate_net."""
    net = GrowableNet.from_states(cfg.rule(), info, topology, list(states), device)
    return evaluate_net(net, bundle, cfg.eval)


def evaluate_net(net: GrowableNet, bundle: DataBundle, spec: EvalSpec) -> dict[str, Any]:
    """Per-exit and adaptive evaluation on the test split, plus full-path `val_accuracy` when there is a
    validation split (None otherwise)."""
    preds = split_predictions(net, bundle, "test")
    ev = evaluate_exits(preds, spec.thresholds, spec.confidence, net.exit_costs())
    ev["val_accuracy"] = None
    if bundle.val is not None:
        val = split_predictions(net, bundle, "val")
        ev["val_accuracy"] = val.accuracy(val.depths[-1])
    return ev
