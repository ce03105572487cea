"""Progress output: a one-line bar for the running epoch in an interactive terminal, nothing otherwise
(job logs and pipes get the plain per-epoch lines only)."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


def interactive(stream: TextIO | None = None) -> bool:
    """True when `stream` (stdout) is a terminal a bar can redraw in place."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


class EpochBar:
    """Draws `epoch E/N [#####-----] b/B batches  12 s` on one line, redrawn in place; `line()` prints a log
    line above it. Inactive (a no-op bar, plain lines) when the stream is not a terminal."""

    def __init__(self, stream: TextIO | None = None, active: bool | None = None):
        self.stream = stream or sys.stdout
        self.active = interactive(self.stream) if active is None else active
        self.shown = False
        self.started: dict[int, float] = {}

    def update(self, epoch: int, epochs: int, batch: int, batches: int) -> None:
        """Redraw the bar for `batch` of `batches` done in `epoch` of `epochs`."""
        if not self.active or batches <= 0:
            return
        t0 = self.started.setdefault(epoch, time.monotonic())
        cols = shutil.get_terminal_size((80, 20)).columns
        head = f"epoch {epoch}/{epochs} "
        tail = f" {batch}/{batches} batches {time.monotonic() - t0:5.0f} s"
        width = max(10, min(40, cols - len(head) - len(tail) - 3))
        filled = round(width * min(batch, batches) / batches)
        self.stream.write("\r" + head + "[" + "#" * filled + "-" * (width - filled) + "]" + tail + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def line(self, text: str) -> None:
        """Print a log line (above the bar when one is shown)."""
        self.clear()
        print(text, file=self.stream, flush=True)

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
