"""How a sweep's trials end in MLflow: each trial's run ends with a status and a `growpipe.end_reason`
(`finished`, `stopped_early`, `failed: ...`, `killed: ...`), written from the sweep's own process, which
knows why Tune ended a trial (a trial's process is ended with it, often before it could say)."""

from __future__ import annotations

import contextlib
from typing import Any

from ray.tune import Callback

from growpipe.tracking import STOPPED_EARLY
from growpipe.tune.spec import trial_config
from growpipe.tune.trials import trial_run_name


def trial_runs(client: Any, experiment_id: str, parent_run_id: str, name: str | None = None) -> list[Any]:
    """The MLflow runs of the sweep run `parent_run_id`'s trials (only the one named `name`, when given)."""
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'" + (f" and attributes.run_name = '{name}'" if name else "")
    return client.search_runs([experiment_id], filter_string=query)


def trial_outcome(error: str | None, epochs: int | None, planned: int | None) -> tuple[str, str]:
    """How a trial ended, as (MLflow status, growpipe.end_reason): FAILED `failed: ERROR`, FINISHED
    `stopped_early` (a scheduler stopped it before its `planned` epochs), FINISHED `finished`."""
    if error:
        return "FAILED", f"failed: {error}"[:5000]
    if planned is not None and (epochs or 0) < planned:
        return "FINISHED", STOPPED_EARLY
    return "FINISHED", "finished"


def end_trial_run(client: Any, run: Any, status: str, reason: str) -> None:
    """End a trial's MLflow run `run` as `status` with growpipe.end_reason `reason`. A stopped_early end is
    always written (the trial's own process was stopped with its trial, it may have recorded nothing); any
    other only where the trial did not end its run itself (still RUNNING, or no end reason): its own reason
    (e.g. its error line) is the more precise one."""
    own = run.data.tags.get("growpipe.end_reason")
    if reason != STOPPED_EARLY and run.info.status != "RUNNING" and own and own != "running (resumed)":
        return
    tags = {"growpipe.end_reason": reason}
    if reason == STOPPED_EARLY:
        tags["growpipe.stopped_early"] = "true"
    for k, v in tags.items():
        client.set_tag(run.info.run_id, k, v)
    client.set_terminated(run.info.run_id, status=status)


class TrialEnds(Callback):
    """Ends each trial's MLflow run as Tune records the trial's end, from the sweep's own process: a trial a
    scheduler stops is ended by Tune with its process (and the run's controller actor, which that process
    owns) before the trial could record why. Picklable (Tune saves it with the sweep's state for a resume):
    it keeps the sweep run's coordinates and makes its own client."""

    def __init__(self, tracking: dict[str, Any], base: dict[str, Any], kind: str):
        self.tracking, self.base, self.kind = tracking, base, kind
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, None)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        error = trial.get_error()
        self._end(trial, (str(error).strip().splitlines() or [type(error).__name__])[-1] if error else "error")

    def _end(self, trial: Any, error: str | None) -> None:
        """Tracking never fails the sweep: a failure here is left to the sweep's close_children at its end."""
        with contextlib.suppress(Exception):
            from mlflow.tracking import MlflowClient

            planned = trial_config(self.base, trial.config).total_epochs() if self.kind == "train" else None
            epochs = (trial.last_result or {}).get("training_iteration")
            status, reason = trial_outcome(error, epochs, planned)
            self._client = self._client or MlflowClient(tracking_uri=self.tracking["uri"])
            name = trial_run_name(self.tracking["sweep"], trial.trial_id)
            for run in trial_runs(self._client, self.tracking["experiment_id"], self.tracking["parent_run_id"], name):
                end_trial_run(self._client, run, status, reason)
