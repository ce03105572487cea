"""A run's events as its controller hands them to the driver: pushed by the loop (through its callbacks) into
a log guarded by a condition, and followed by the controller's streaming method; nothing polls.

Events, in order: {kind: line, line}, {kind: state, state}, {kind: epoch, row, checkpoint} (a finished epoch's
row with the restore point written at its boundary, or None) and {kind: position, epoch, epochs, batch,
batches} (the newest one only, and only while no event came after it: a follower that lags skips older
positions, and none is drawn again after the line that ended its epoch)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

from growpipe.loop.callbacks import RunCallback


class RunEvents(RunCallback):
    """The event log of one run: the loop's thread writes, any number of followers read (each from the
    start). An epoch is handed on once its boundary is done (`settled`); with `paced`, the loop then waits
    until the follower has taken it (`take`), so a Tune trial never trains past an epoch Tune stops it at."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self._position: dict[str, int] | None = None
        self._position_seq = 0
        self._position_after = 0  # how many events came before it: one that came after makes it stale
        self._row: dict[str, Any] | None = None  # the epoch row waiting for its boundary to be done
        self._checkpoint: str | None = None  # the restore point written at that boundary
        self._taken = 0
        self._ended = False
        self._released = False  # the run is being stopped: nobody waits for a follower any more
        self.paced = False

    @property
    def reports_checkpoints(self) -> bool:  # type: ignore[override]
        """A paced run's follower takes each epoch's checkpoint with its row (a Tune report)."""
        return self.paced

    # ---- written by the loop (its thread) -----------------------------------------------------------------
    def say(self, line: str) -> None:
        """A progress line (the loop's and the engine's `say`)."""
        self._put({"kind": "line", "line": line})

    def on_state_change(self, prev: Any, nxt: Any) -> None:
        self._put({"kind": "state", "state": nxt.name})

    def after_epoch(self, row: dict[str, Any]) -> None:
        with self._cond:
            self._row, self._checkpoint = row, None

    def on_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        with self._cond:
            row = self._row
            if row is not None and checkpoint["batch"] == 0 and checkpoint["epoch"] == row["epoch"]:
                self._checkpoint = checkpoint["path"]  # the last one at the boundary: after its growth

    def on_position(self, position: dict[str, int]) -> None:
        with self._cond:
            self._position = position
            self._position_seq += 1
            self._position_after = len(self._events)
            self._cond.notify_all()

    def settled(self, epoch: int) -> None:
        """The boundary after `epoch` is done (the loop's epoch gate): hand on its row and checkpoint, and when
        paced wait until the follower took them or the run is stopped."""
        self._flush_row()
        if self.paced:
            with self._cond:
                self._cond.wait_for(lambda: self._taken >= epoch or self._released)

    def end(self) -> None:
        """The run returned: a row still waiting goes out, then the followers' streams end."""
        self._flush_row()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def release(self) -> None:
        """The run is being stopped: the loop waits for no follower from now on."""
        with self._cond:
            self._released = True
            self._cond.notify_all()

    # ---- the follower's side ------------------------------------------------------------------------------
    def take(self, epoch: int) -> None:
        """The follower has handled the epoch rows up to `epoch` (the run may train the next one)."""
        with self._cond:
            self._taken = max(self._taken, epoch)
            self._cond.notify_all()

    def follow(self) -> Iterator[dict[str, Any]]:
        """Every event from the start, as it comes (blocking between them), until the run has returned."""
        sent, position_seen = 0, 0
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._news, sent, position_seen))
                batch = self._events[sent:]
                fresh = self._position_seq != position_seen and self._position_after == len(self._events)
                position = self._position if fresh else None  # not after the epoch's line: it is over
                position_seen = self._position_seq
                done = self._ended
            sent += len(batch)
            for event in batch:  # noqa: UP028 (Ray resumes an actor's generator with send(), which a list refuses)
                yield event
            if done:
                return
            if position is not None:
                yield {"kind": "position", **position}

    # ---- inside ---------------------------------------------------------------------------------------
    def _news(self, sent: int, position_seen: int) -> bool:
        return len(self._events) > sent or self._position_seq != position_seen or self._ended

    def _put(self, event: dict[str, Any]) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def _flush_row(self) -> None:
        with self._cond:
            row, checkpoint, self._row, self._checkpoint = self._row, self._checkpoint, None, None
            if row is not None:
                self._events.append({"kind": "epoch", "row": row, "checkpoint": checkpoint})
                self._cond.notify_all()
