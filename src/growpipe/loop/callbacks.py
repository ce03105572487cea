"""Hooks the run loop calls as it goes: progress lines here, MLflow in growpipe.tracking."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from growpipe.report import format_epoch


class RunCallback:
    """Every method is optional. A callback must never raise into the run: errors are its own business."""

    reports_checkpoints = False
    """True while it hands each epoch's boundary checkpoint on with the epoch's row before the next epoch trains
    (a paced run's events: a Tune report): that checkpoint is then complete before the boundary ends, also
    with checkpoint.asynchronous."""

    def on_data(self, data: dict[str, Any]) -> None:
        """The data the run reads: DataBundle.describe() (summary, name, source, rows and digest per split)."""

    def on_start(self) -> None: ...

    def on_state_change(self, prev: Any, nxt: Any) -> None: ...

    def after_epoch(self, row: dict[str, Any]) -> None: ...

    def after_epoch_stages(self, epoch: int, stages: list[dict[str, Any]]) -> None:
        """The epoch's per-stage rows (StageStats.row(): samples/s, utilisation, hops, packets in flight), just
        before after_epoch; stage-actor engines only."""

    def on_growth(self, event: dict[str, Any]) -> None: ...

    def on_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A restore point is complete: {path, epoch, batch, seq} (`epoch` finished epochs, `batch` batches
        into the next; at an epoch's boundary the last one is written after that boundary's growth). With
        checkpoint.asynchronous it comes from the thread that wrote it, once its manifest is in place."""

    def on_position(self, position: dict[str, int]) -> None:
        """Where the running epoch is ({epoch, epochs, batch, batches}), while batches run and only when the
        loop's feed.every_s is set (loop.progress.PositionFeed)."""

    def on_topology(self, event: dict[str, Any]) -> None:
        """Where the blocks run changed (replace, shrink, expand): growpipe.loop.elastic.Topology.record."""

    def result_fields(self) -> dict[str, Any]:
        """Fields this callback adds to the result JSON, asked for once the run finished (before on_finish)."""
        return {}

    def on_finish(self, summary: dict[str, Any]) -> None: ...

    def on_final_net(self, net: Any, summary: dict[str, Any]) -> None:
        """The trained net, built in the loop's process only when a callback overrides this (building one
        costs a process seconds of first-time imports)."""

    def on_error(self, message: str) -> None: ...

    def on_stop(self, reason: str) -> None:
        """The run is being stopped from outside (Ctrl-C, SIGTERM, `ray job stop`, a Tune scheduler): from
        another thread, possibly while the run's thread still works; the process may end soon after."""

    def close(self) -> Any: ...


def notify(callbacks: Sequence[RunCallback], method: str, *args: Any, say: Callable[[str], None] = print) -> list[Any]:
    """Call `method` on every callback; what each returned (None from one that failed: a failing callback is
    reported and skipped, the run goes on)."""
    answers = []
    for cb in callbacks:
        try:
            answers.append(getattr(cb, method)(*args))
        except Exception as e:  # tracking and other side work must never end a run
            say(f"warn   {type(cb).__name__}.{method} failed ({type(e).__name__}: {str(e)[:160]}); the run goes on")
            answers.append(None)
    return answers


class ProgressLog(RunCallback):
    """The per-epoch line and the growth line of a run."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say

    def after_epoch(self, row: dict[str, Any]) -> None:
        self.say(format_epoch(row))

    def on_growth(self, event: dict[str, Any]) -> None:
        at = f" at epoch {event['epoch'] + 1} batch {event['batch']}" if event["batch"] is not None else ""
        where = f", {event['where']}" if event.get("where") else ""
        before, after = event.get("acc_just_before"), event.get("acc_just_after")
        acc = f", test accuracy {before:.4f} -> {after:.4f}" if before is not None and after is not None else ""
        self.say(f"grow   +{event['kind']} block {event['block']} ({event['family']}) -> {event['blocks']} blocks"
                 f"{where}{at}{acc}")  # fmt: skip


def reports_checkpoints(callbacks: Sequence[RunCallback]) -> bool:
    """Whether one of `callbacks` hands each epoch's boundary checkpoint on with its row (RunCallback's
    reports_checkpoints)."""
    return any(getattr(cb, "reports_checkpoints", False) for cb in callbacks)


def wants_final_net(callback: RunCallback) -> bool:
    """Whether `callback` does something with the trained net (overrides on_final_net)."""
    return getattr(type(callback), "on_final_net", RunCallback.on_final_net) is not RunCallback.on_final_net
