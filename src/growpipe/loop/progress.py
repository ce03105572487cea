"""The running epoch's position (a driver's progress bar), pushed to the run's callbacks as the epoch runs."""

from __future__ import annotations

import time
from collections.abc import Callable

from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine


class PositionFeed:
    """Engines call the loop's poll between batches (or every 0.2 s while they wait for a stage), and the loop
    hands it here: the position goes out at most every `every_s` seconds (None: never), only while an epoch
    is open (between its start and its line). Nothing asks for it, nothing sleeps."""

    def __init__(self, engine: Engine, callbacks: list[RunCallback], say: Callable[[str], None]):
        self.engine, self.callbacks, self.say = engine, callbacks, say
        self.every_s: float | None = None
        self.open = False
        self._at = 0.0

    def position(self, epoch: int | None, epochs: int) -> dict[str, int] | None:
        """{epoch, epochs, batch, batches} of epoch `epoch` (None: not training), None outside an open epoch."""
        if epoch is None or not self.open or (pos := self.engine.position()) is None:
            return None
        return {"epoch": epoch, "epochs": epochs, "batch": pos[0], "batches": pos[1]}

    def push(self, epoch: int | None, epochs: int) -> None:
        now = time.monotonic()
        if self.every_s is None or now - self._at < self.every_s:
            return
        self._at = now
        if (pos := self.position(epoch, epochs)) is not None:
            notify(self.callbacks, "on_position", pos, say=self.say)
