"""The running epoch's position (a driver's progress bar), pushed to the run's callbacks as the epoch runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine

SHORTEST_S = 0.01
"""The shortest period between two pushes (an `every_s` of 0 would keep a core busy)."""


class PositionFeed:
    """While the engine trains (`running`), a thread of the feed's own asks it where the epoch is
    (Engine.position, from that thread) every `every_s` seconds (None: never) and pushes that to the callbacks'
    `on_position`, only while an epoch is open (between its start and its line). The first push comes one period
    after the engine started; none comes after `running` has ended."""

    def __init__(self, engine: Engine, callbacks: list[RunCallback], say: Callable[[str], None]):
        self.engine, self.callbacks, self.say = engine, callbacks, say
        self.every_s: float | None = None
        self.open = False

    def position(self, epoch: int | None, epochs: int) -> dict[str, int] | None:
        """{epoch, epochs, batch, batches} of epoch `epoch` (None: not training), None outside an open epoch."""
        if epoch is None or not self.open or (pos := self.engine.position()) is None:
            return None
        return {"epoch": epoch, "epochs": epochs, "batch": pos[0], "batches": pos[1]}

    @contextlib.contextmanager
    def running(self, epoch: int, epochs: int) -> Iterator[None]:
        """Push epoch `epoch`'s position every `every_s` seconds while inside."""
        if self.every_s is None:
            yield
            return
        ended = threading.Event()
        thread = threading.Thread(target=self._push_until, args=(ended, max(self.every_s, SHORTEST_S), epoch, epochs),
                                  name="growpipe-position", daemon=True)  # fmt: skip
        thread.start()
        try:
            yield
        finally:
            ended.set()
            thread.join()

    def _push_until(self, ended: threading.Event, every_s: float, epoch: int, epochs: int) -> None:
        while not ended.wait(every_s):
            if (pos := self.position(epoch, epochs)) is not None:
                notify(self.callbacks, "on_position", pos, say=self.say)
