"""What follows a failed step of the run loop: the failure policy decides (policies.decide_failure, a function
of the error and the run's restarts and checkpoints), and this carries it out: the run ends (ERRORED, the reason
said once to the callbacks) or goes back to its newest checkpoint (RESTORING, the restart counted)."""

from __future__ import annotations

from collections.abc import Callable

from growpipe.checkpoint import CheckpointStore
from growpipe.config import RunConfig
from growpipe.errors import NonFiniteError, describe
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import WorkerLost
from growpipe.loop.policies import Raise, decide_failure
from growpipe.loop.record import RunRecord
from growpipe.loop.states import Errored, Restoring, Starting, State, Training


class Recovery:
    """The failure handling of one run, whose restore points are in `store` (None: checkpoints off)."""

    def __init__(self, cfg: RunConfig, store: CheckpointStore | None, rec: RunRecord, callbacks: list[RunCallback],
                 say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.store, self.rec, self.callbacks, self.say = cfg, store, rec, callbacks, say

    def after(self, e: BaseException, state: State, stop_reason: str | None) -> tuple[State, BaseException]:
        """The state after `e` ended a step of `state` (`stop_reason`: the run was being stopped from outside),
        and the error as the run reports it (a non-finite loss located in its epoch)."""
        if stop_reason is not None:  # its workers went away because the run was stopped
            return Errored(f"stopped: {stop_reason}"), e
        if isinstance(e, NonFiniteError) and isinstance(state, Training):  # the block knew the batch
            e = e.located(epoch=state.epoch)
        what = describe(e)
        latest = self.store.latest() if self.store else None
        lost = isinstance(e, WorkerLost) and not isinstance(state, Starting)  # a fresh start has no restore point
        limit = self.cfg.runtime.max_stage_restarts
        decision = decide_failure(what, lost, self.rec.restarts, limit, latest.path if latest else None,
                                  self.cfg.checkpoint.enabled)  # fmt: skip
        if isinstance(decision, Raise):  # said once, here; shown once, by whoever started the run
            notify(self.callbacks, "on_error", decision.message, say=self.say)
            return Errored(decision.message), e
        self.rec.restarts = decision.restart
        self.say(f"recover {what}; restart {self.rec.restarts}/{limit}: every block back to "
                 f"{decision.path.rsplit('/', 1)[-1]}")  # fmt: skip
        return Restoring(decision.path, what), e
