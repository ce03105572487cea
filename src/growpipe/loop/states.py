"""The run loop's states. Each carries the data its step needs, so a step is a function of its state.

STARTING -> TRAINING <-> GROWING / CACHING -> FINISHED, with RESTORING after a lost worker and ERRORED from
anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from growpipe.config import GrowStep
from growpipe.loop.orders import GrowOrder
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout


class State:
    name: ClassVar[str] = "?"
    terminal: ClassVar[bool] = False


@dataclass(frozen=True)
class Starting(State):
    """Open the data, build the blocks; from checkpoint `resume` (its directory) when given."""

    name: ClassVar[str] = "starting"
    resume: str | None = None


@dataclass(frozen=True)
class Training(State):
    """Train epoch `epoch` (1-based) from batch `start_batch`; `parts`, `samples` and `seconds` are what
    this epoch already trained before a pause."""

    name: ClassVar[str] = "training"
    epoch: int
    start_batch: int = 0
    parts: tuple[StageStats, ...] = ()
    samples: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Growing(State):
    """Append blocks after `epoch` finished epochs (and `batch` batches of the next, when an epoch paused):
    the planned `steps` (from policy `source`), a request prepared while the epoch ran (`order`), and the
    requests waiting between epochs. Then go on with `resume` (the paused epoch) or the next epoch."""

    name: ClassVar[str] = "growing"
    epoch: int
    batch: int | None = None
    steps: tuple[GrowStep, ...] = ()
    source: str = "request"
    order: GrowOrder | None = None
    resume: Training | None = None


@dataclass(frozen=True)
class Caching(State):
    """Let the newest block train from the frozen blocks' stored outputs, then go on with `then`."""

    name: ClassVar[str] = "caching"
    then: Training


@dataclass(frozen=True)
class Restoring(State):
    """Replace what was lost and go on from checkpoint `path`; `layout`: where the blocks go (None: the
    topology policy decides from the cluster as it is)."""

    name: ClassVar[str] = "restoring"
    path: str
    reason: str
    layout: Layout | None = None


@dataclass(frozen=True)
class Finished(State):
    name: ClassVar[str] = "finished"
    terminal: ClassVar[bool] = True


@dataclass(frozen=True)
class Errored(State):
    name: ClassVar[str] = "errored"
    terminal: ClassVar[bool] = True
    message: str
