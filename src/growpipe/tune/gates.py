"""The test gates that act in a sweep's own process (see growpipe.faults), as a Tune callback."""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from growpipe import faults


class SweepGates(Callback):
    """GROWPIPE_STOP_SWEEP_AT (read once by the sweep: `epoch`, `marker`) on a trial's result: Tune records the
    result (its rows, the trial's last result) in this step of its loop and registers the checkpoint it carries
    in a later one, so the stop, which Tune notices at the step's end, falls between them."""

    def __init__(self, epoch: int, marker: str):
        self.epoch, self.marker = epoch, marker

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        if int(result.get("training_iteration", 0)) == self.epoch:
            faults.stop_sweep_once(self.marker)
