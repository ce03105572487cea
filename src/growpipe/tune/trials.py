"""The functions Ray Tune runs, one call per trial (inside the trial's placement group)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from growpipe.tune.predictions import StoredExits
from growpipe.tune.spec import trial_config


def trial_run_name(sweep: str, trial_id: str) -> str:
    """The run name (controller actor and MLflow run) of one trial."""
    return f"{sweep}-{trial_id}"


def train_trial(
    params: dict[str, Any],
    *,
    base: dict[str, Any],
    sweep: str,
    metric: str,
    parent_run_id: str | None,
    save_checkpoint: bool,
) -> None:
    """Train one net on Ray with the trial's `params`: its stages go into the bundles 1.. of the trial's
    placement group (bundle 0 is this function's), every epoch is reported to Tune (so ASHA can stop it),
    and the last report carries the final metrics and, with `save_checkpoint`, the trained net."""
    from ray import tune
    from ray.util import get_current_placement_group

    from growpipe.runtime.pipeline import Pipeline
    from growpipe.tracking import epoch_metrics

    ctx = tune.get_context()
    name = trial_run_name(sweep, ctx.get_trial_id())
    # Tune keeps the trained net (the last report's checkpoint); run checkpoints would only be copied
    # along with the trial's directory
    base = {**base, "name": name, "checkpoint": {**base.get("checkpoint", {}), "enabled": False}}
    if parent_run_id:
        base["tracking"] = {**base.get("tracking", {}), "parent_run_id": parent_run_id}
    cfg = trial_config(base, params, f"trial {ctx.get_trial_name()}")
    last_epoch = cfg.total_epochs()
    held: list[dict[str, Any]] = []

    def to_tune(row: dict[str, Any]) -> dict[str, float]:  # losses go to MLflow; Tune's table shows accuracy
        return {k: v for k, v in epoch_metrics(row).items() if not k.startswith("loss.") or k == metric}

    def report(row: dict[str, Any]) -> None:
        if row["epoch"] >= last_epoch:  # reported below, with the final metrics and the checkpoint
            held.append(row)
        else:
            tune.report(to_tune(row))

    pg = get_current_placement_group()
    with Pipeline(cfg, run_name=name, reserved=(pg, 1) if pg else None) as p:
        summary = p.train(progress=None, on_epoch=report)
        final = to_tune(held[-1]) if held else {}
        final.update(final_test_accuracy=summary["test_accuracy"], epochs_run=summary["epochs"])
        if not save_checkpoint:
            tune.report(final)
            return
        from growpipe.checkpoint import save_net

        with tempfile.TemporaryDirectory() as tmp:
            save_net(Path(tmp) / "net", p.final_net(), cfg, summary)
            tune.report(final, checkpoint=tune.Checkpoint.from_directory(str(Path(tmp) / "net")))


def threshold_trial(
    params: dict[str, Any],
    *,
    stored: StoredExits,
    cost_weight: float,
    confidence: str,
    tracking: dict[str, Any] | None,
    sweep: str,
) -> None:
    """Score one exit threshold (and confidence measure) on stored per-exit predictions: no training."""
    from ray import tune

    th = float(params["threshold"])
    kind = params.get("eval.confidence", confidence)
    metrics = stored.trade_off(th, kind, cost_weight)
    if tracking:
        _log_child_run(tracking, trial_run_name(sweep, tune.get_context().get_trial_id()), th, kind, metrics)
    tune.report(metrics)


def _log_child_run(tracking: dict[str, Any], name: str, th: float, kind: str, metrics: dict[str, float]) -> None:
    """One MLflow run per threshold trial, under the sweep's run; tracking never fails a trial."""
    with contextlib.suppress(Exception):
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking["uri"])
        tags = {"mlflow.parentRunId": tracking["parent_run_id"], "growpipe.sweep": tracking["sweep"]}
        run = client.create_run(tracking["experiment_id"], run_name=name, tags=tags)
        client.log_param(run.info.run_id, "threshold", th)
        client.log_param(run.info.run_id, "eval.confidence", kind)
        for k, v in metrics.items():
            client.log_metric(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id)
