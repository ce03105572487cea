"""Evaluation of a whole net on a dataset's test split: every exit and the adaptive trade-off."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from growpipe.checkpoint import load_net
from growpipe.config import EvalSpec, RunConfig, apply_overrides, config_and_problems
from growpipe.data import DataBundle, iterate_batches, load_data
from growpipe.data.presence import data_problem
from growpipe.errors import ConfigError, GrowpipeError
from growpipe.nn.inference import (
    Exited,
    ExitPredictions,
    chosen_threshold,
    collect_exits,
    early_exit_report,
    evaluate_exits,
)
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from growpipe.outputs import Kind, check_outputs
from growpipe.prepare import refuse
from growpipe.saved_config import check_input_matches

EVAL_BATCH = 512


EVAL_OVERRIDES = ("eval.", "data.root", "data.download", "data.limit_test")
"""What may change when a checkpoint is evaluated again; the rest is fixed by the checkpoint."""


def load_for_evaluation(
    checkpoint: str | Path,
    overrides: list[str] | None = None,
    outputs: dict[str, tuple[str | None, Kind]] | None = None,
) -> tuple[GrowableNet, DataBundle, RunConfig]:
    """A checkpoint's net, its data and its config with `overrides` applied (eval.* and where the data is);
    refused when the data's shape, classes or vocabulary differ from what the net was trained on. Any
    checkpoint directory: `--save` output, a run checkpoint, or a run's checkpoint folder (the newest). What
    can be told before the data is read (the checkpoint, the overrides, the data's whereabouts, the files the
    caller will write: `outputs`, flag -> (path, kind)) is refused together, one line per problem."""
    allowed = [o for o in overrides or [] if o.split("=", 1)[0].strip().startswith(EVAL_OVERRIDES)]
    problems = [f"--set {o}: evaluate takes eval.* and data.root / data.download / data.limit_test only; the rest "
                "is fixed by the checkpoint" for o in overrides or [] if o not in allowed]  # fmt: skip
    try:
        net, manifest = load_net(checkpoint)
    except GrowpipeError as e:  # alone, it is raised as it is
        if others := [*problems, *check_outputs(outputs or {})]:
            refuse([str(e), *others])
        raise
    raw = apply_overrides(manifest["config"], allowed)
    if manifest["input"].get("normalize"):  # the training split's statistics, whatever data is evaluated
        raw.setdefault("data", {})["normalize"] = manifest["input"]["normalize"]
    cfg, config_problems = config_and_problems(raw)
    problems += config_problems
    if cfg is not None and (why := data_problem(cfg.data)):
        problems.append(why)
    refuse(problems + check_outputs(outputs or {}))
    assert cfg is not None
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


def evaluate_net(net: GrowableNet, bundle: DataBundle, spec: EvalSpec, early_exit: bool = False) -> dict[str, Any]:
    """Per-exit and adaptive evaluation on the test split, plus full-path `val_accuracy` when there is a
    validation split (None otherwise); with `early_exit`, also real early exit at the chosen threshold
    (`early_exit`: its accuracy and measured seconds per sample against the full path's)."""
    preds = split_predictions(net, bundle, "test")
    ev = evaluate_exits(preds, spec.thresholds, spec.confidence, net.exit_costs())
    ev["val_accuracy"] = None
    if bundle.val is not None:
        val = split_predictions(net, bundle, "val")
        ev["val_accuracy"] = val.accuracy(val.depths[-1])
    if early_exit:
        ev["early_exit"] = measure_early_exit(net, bundle, spec, chosen_threshold(ev, spec.exit_threshold))
    return ev


def measure_early_exit(net: GrowableNet, bundle: DataBundle, spec: EvalSpec, threshold: float | None) -> dict[str, Any]:
    """Real early exit on the test split at `threshold` in this process, timed against the full path (each
    the best of two passes: the first pays for warm-up)."""
    batches = list(iterate_batches(bundle.test, EVAL_BATCH, shuffle=False, side_groups=net.side_groups()))
    for i, p in enumerate(batches):
        p.rows = torch.arange(i * EVAL_BATCH, i * EVAL_BATCH + p.batch_size)

    def timed(th: float | None) -> tuple[Exited, float]:
        best, out = math.inf, None
        for _ in range(2):
            start = time.perf_counter()
            out = Exited.cat([net.early_exit(p, th, spec.confidence) for p in batches])
            best = min(best, time.perf_counter() - start)
        return out, best  # type: ignore[return-value]

    early, seconds = timed(threshold)
    _, full_seconds = timed(None)
    return early_exit_report(threshold, early, bundle.test.y, seconds, full_seconds, net.exit_costs())
