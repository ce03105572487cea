"""The functions Ray Tune runs, one call per trial (inside the trial's placement group)."""

from __future__ import annotations

import contextlib
from typing import Any

from ray.util import get_current_placement_group

from growpipe.checkpoint import CheckpointStore
from growpipe.quiet import quiet_exit, quiet_libraries
from growpipe.resume import continue_from
from growpipe.runtime.pipeline import Pipeline
from growpipe.tracking import epoch_metrics
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
    runs_dir: str,
    reported: dict[str, int] | None = None,
) -> None:
    """Train one net on Ray with the trial's `params`: its stages go into the bundles 1.. of the trial's
    placement group (bundle 0 is this function's), every epoch is reported to Tune (so ASHA can stop it)
    with the run checkpoint written at that epoch's end (`save_checkpoint`), and the last report carries the
    final metrics. The run trains an epoch only once Tune has answered the report of the one before, so a
    trial Tune stops has trained (and logged to MLflow) exactly the epochs Tune saw. Tune's
    training_iteration is the epoch: a restarted trial goes on counting where its checkpoint left off.

    A trial Tune restarts (Tuner.restore, or PBT copying another trial's net) resumes from the checkpoint Tune
    hands it: topology, weights and growth history, in the same MLflow run. The trial's own
    run checkpoints live in `runs_dir`/NAME; a restarted trial whose own newest end of epoch is newer than the
    checkpoint Tune hands it (or Tune hands none: the sweep was stopped after the trial wrote it, before Tune
    registered the checkpoint of its report) goes on from that one, and first reports to Tune the epochs Tune
    has not recorded, so that Tune and MLflow keep the same epochs. `reported`: the last epoch Tune recorded of
    each trial (by trial id) when the sweep was resumed, as Tune's result rows have it: Tune saves its state
    on a stop with a report recorded whose checkpoint it has not registered yet."""
    from ray import tune

    quiet_libraries()  # this trial's process: Ray Train's line per checkpoint, MLflow's INFO lines
    quiet_exit()  # Tune ends a trial it stops with SIGTERM: no "Exception ignored ... SystemExit" traceback
    ctx = tune.get_context()
    name = trial_run_name(sweep, ctx.get_trial_id())
    # the trial's run folder is its own: a restart that Tune hands no checkpoint starts over in it
    base = {**base, "name": name, "checkpoint": {**base.get("checkpoint", {}), "enabled": save_checkpoint,
            "uri": runs_dir, "keep": 3, "every_epochs": 1, "overwrite": True}}  # fmt: skip
    if parent_run_id:
        tracking = {**base.get("tracking", {}), "parent_run_id": parent_run_id}
        tracking["run_id"] = _existing_child(tracking, name)  # one MLflow run per trial, across restarts
        base["tracking"] = tracking
    cfg = trial_config(base, params, f"trial {ctx.get_trial_name()}")
    last_epoch = cfg.total_epochs()
    store = CheckpointStore(runs_dir, name)
    held: list[tuple[dict[str, Any], str | None]] = []

    def to_tune(row: dict[str, Any]) -> dict[str, float]:
        """Losses go to MLflow, Tune's table shows accuracy; training_iteration is the epoch (Tune keeps a
        value reported for it), the step MLflow logs the row at, also after a restart or a PBT copy."""
        kept = {k: v for k, v in epoch_metrics(row).items() if not k.startswith("loss.") or k == metric}
        return {**kept, "training_iteration": row["epoch"]}

    def checkpoint_of(path: str | None) -> Any:
        return tune.Checkpoint.from_directory(path) if path else None

    done_before = 0  # epochs the checkpoint the trial starts from holds
    recorded = (reported or {}).get(ctx.get_trial_id(), 0)
    given, known = _starting_point(store, name, tune.get_checkpoint(), save_checkpoint, recorded)

    def report(row: dict[str, Any], checkpoint: str | None) -> None:
        """An epoch's row and the checkpoint written at its end (the run waits for this to return)."""
        if row["epoch"] >= last_epoch:  # reported below, with the final metrics
            held.append((row, checkpoint))
        else:
            tune.report(to_tune(row), checkpoint=checkpoint_of(checkpoint))

    with given.as_directory() if given else contextlib.nullcontext() as resume:
        if resume:
            manifest = store.read_manifest(resume)
            done_before = _note_copy(cfg, name, manifest)
            for row in manifest["history"]:  # trained (and in MLflow) before Tune recorded them
                if row["epoch"] > known:
                    report(row, resume if row["epoch"] == done_before else None)
        pg = get_current_placement_group()
        run_cfg = continue_from(cfg, resume, name) if resume else cfg  # its own checkpoint: its MLflow run
        with Pipeline(run_cfg, run_name=name, reserved=(pg, 1) if pg else None, resume=resume) as p:
            summary = p.train(progress=None, on_epoch=report, keep_net=False)
            row, path = held[-1] if held else (summary["history"][-1], None)
            final = to_tune(row)
            final.update(final_test_accuracy=summary["test_accuracy"], epochs_run=summary["epochs"])
            # nothing trained since the checkpoint Tune handed over: that one is the run's end
            checkpoint = checkpoint_of(path) or (given if summary["epochs"] <= done_before else None)
            tune.report(final, checkpoint=checkpoint)


def _starting_point(store: Any, name: str, handed: Any, enabled: bool, recorded: int = 0) -> tuple[Any, int]:
    """Where a (re)started trial goes on from, and the last epoch Tune has of it. It goes on from the checkpoint
    Tune `handed` over (Tuner.restore, or PBT's copy of another trial's net), unless the trial's own run
    checkpoints hold a newer end of epoch of its own. Tune has the epochs up to the handed checkpoint's and, of
    the trial's own line, up to `recorded` (the last of its result rows when the sweep was resumed): a stop
    that lands after Tune recorded a report and before it registered the report's checkpoint leaves Tune that
    epoch without its checkpoint, which the trial's own newest checkpoint then holds."""
    from ray import tune

    handed_epoch = 0
    if handed is not None:
        with handed.as_directory() as path:
            manifest = store.read_manifest(path)
        handed_epoch = int(manifest["epoch"])
        if manifest["run"] != name:  # PBT's copy of another trial: its net, whatever this trial wrote
            return handed, handed_epoch
    known = max(handed_epoch, recorded)
    own = store.latest() if enabled else None
    if own is not None and own.batch == 0 and own.epoch > handed_epoch:
        return tune.Checkpoint.from_directory(own.path), known
    return handed, known


def _existing_child(tracking: dict[str, Any], name: str) -> str | None:
    """The MLflow run of trial `name` under the sweep's run, when an earlier start of the trial made one."""
    with contextlib.suppress(Exception):  # tracking never fails a trial
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking["uri"])
        parent = client.get_run(tracking["parent_run_id"])
        runs = client.search_runs([parent.info.experiment_id], filter_string=(
            f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.run_name = '{name}'"))  # fmt: skip
        return runs[0].info.run_id if runs else None
    return None


def _note_copy(cfg: Any, name: str, manifest: dict[str, Any]) -> int:
    """The epochs the checkpoint a restarted trial starts from holds (its `manifest`, format-checked); when
    PBT handed it another trial's net, say so in the trial's MLflow run."""
    if manifest.get("run") == name or not cfg.tracking.mlflow or not cfg.tracking.run_id:
        return int(manifest["epoch"])
    with contextlib.suppress(Exception):
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=cfg.tracking.uri)
        client.set_tag(cfg.tracking.run_id, "growpipe.pbt.copied_from", manifest["run"])
        client.set_tag(cfg.tracking.run_id, "growpipe.pbt.at_epoch", str(manifest["epoch"]))
    return int(manifest["epoch"])


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

    quiet_libraries()
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
        client.set_tag(run.info.run_id, "growpipe.end_reason", "finished")
        client.set_terminated(run.info.run_id)
