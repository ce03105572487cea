"""The Engine protocol: what the run loop asks of a runtime.

The loop (growpipe.loop.loop) owns the run's lifecycle: epochs, growth, checkpoints, recovery, the summary.
An engine owns the compute: where the blocks live and how a batch goes through them. Four engines implement
it: the reference trainer in this process (growpipe.local), the Ray local-learning pipeline, GPipe / 1F1B
on stage actors, and data-parallel BP through Ray Train (growpipe.runtime).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from growpipe.errors import GrowpipeError
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout, TopologyView
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo

if TYPE_CHECKING:
    from growpipe.checkpoint import CheckpointStore


class Pause:
    """The loop's request that one `run_epoch` call stop before its next batch (a grown block is ready to attach).

    Set once, from any thread (the thread that placed the block). An engine that steps its batches from the
    loop's thread (the reference trainer, GPipe, 1F1B) calls `check()` between two of them: it runs the loop's
    work there first (placing a waiting request's block when the engine cannot place while training), then says
    whether to stop. An engine whose batches run on their own in workers wraps its wait in `forwarded(hook)`:
    `hook` runs the moment the pause is set (it tells the workers), so nothing polls."""

    def __init__(self, between_batches: Callable[[], bool] | None = None):
        """`between_batches`: the loop's work between two batches; True when it made a block ready (pause)."""
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._between = between_batches

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        """`requested`, as a threading.Event says it (a fault hold waits on a Pause as on an Event)."""
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until the pause is set or `timeout` seconds pass; whether it is set."""
        return self._event.wait(timeout)

    def set(self) -> None:
        """Ask the epoch to stop; the hooks registered by `forwarded` run now, in this thread (once)."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def check(self) -> bool:
        """Between two batches, on the loop's thread: the loop's work there, then whether to stop."""
        if self._between is not None and not self._event.is_set() and self._between():
            self.set()
        return self._event.is_set()

    @contextlib.contextmanager
    def forwarded(self, hook: Callable[[], None]) -> Iterator[None]:
        """Run `hook` once if the pause is set while inside (at once when it already is)."""
        with self._lock:
            already = self._event.is_set()
            if not already:
                self._hooks.append(hook)
        if already:
            hook()
        try:
            yield
        finally:
            with self._lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)


class WorkerLost(GrowpipeError, RuntimeError):
    """A worker of the engine (a stage actor, a DDP worker, or their node) is gone: the run can go on from
    its newest checkpoint."""


@dataclass
class EpochPart:
    """What one `run_epoch` call did: per-stage statistics, samples that entered the net, and the batch it
    stopped before (None when the epoch ran to its end)."""

    stats: list[StageStats]
    samples: int
    paused_at: int | None = None


@dataclass
class Prepared:
    """A block placed and built by `prepare_block`, not yet part of the net."""

    spec: BlockSpec
    where: str = ""
    """Where it runs, for the progress line (e.g. "stage actor 2 (ALBlock)")."""
    handle: object = None
    """The engine's own record of it (a built block, a stage slot)."""
    cacheable: bool = True
    """Its input can be cached once the blocks below are frozen (a block packed into another's worker
    streams through it instead)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Added to the answer of a grow request (e.g. the stage actor's name)."""


class WithoutBundles:
    """What the Engine protocol asks of an engine that places no block in a bundle of its own (the reference
    trainer, Ray Train DDP): nothing to release, cache, record or watch."""

    def discard_block(self, block: Prepared) -> None:
        """Nothing was placed."""

    def cache_prefix(self) -> dict[str, Any] | None:
        return None  # every block computes where the others do: nothing to save by caching

    def layout(self) -> dict[str, Any]:
        return {}

    def topology(self) -> TopologyView | None:
        return None


class Engine(Protocol):
    """A runtime the run loop drives. Every call is made from the loop's thread except `position`, and
    `prepare_block` when `places_while_training`."""

    name: str
    """The result JSON's `runtime`: local, ray, ray-gpipe, ray-1f1b, ray-train-ddp."""
    stage_table: bool
    """True when the per-stage statistics are worth a table (one stage per worker)."""
    places_while_training: bool
    """True when `prepare_block` may run in another thread while `run_epoch` trains: a request's block is then
    placed the moment the request arrives (the stage engines: the block is built in a new actor; DDP: nothing
    is placed, the block is built when the next trainer starts (`run_epoch`)). False for the reference trainer
    (building a block reseeds this process's random generator, which training draws from): the loop then
    prepares between two batches, on its own thread (Pause.check)."""
    net: GrowableNet | None
    """The trained net when it lives in this process (the local engine); None when it is spread over
    workers (the loop rebuilds it from `final_states`)."""

    def open(self, layout: dict[str, Any] | None) -> tuple[InputInfo, dict[str, Any]]:
        """Read the data where the engine reads it (`layout`: where a checkpoint had the blocks); return the
        input description the blocks are planned from and the data's record (DataBundle.describe)."""
        ...

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        """Place and build the blocks (`layout`: where a checkpoint had them); a one-line description."""
        ...

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        """Train epoch `epoch` from batch `start_batch`, stopping before batch `stop_at`, or before the next
        batch it can once `pause` is set (see Pause: checked between batches, or forwarded to the workers);
        everything sent is trained when it returns. Raises WorkerLost when a worker is gone."""
        ...

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        """Place and build a block (see `places_while_training`); GrowpipeError when it cannot be placed."""
        ...

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        """Append a prepared block after the last one (the earlier ones frozen first when `freeze`); a block
        planned to start where the net stands (growpipe.nn.preserve.starts_preserved) takes the exit of the
        last one as it is now (start_from_exit). The engine is idle (between two run_epoch calls)."""
        ...

    def discard_block(self, block: Prepared) -> None:
        """Release a prepared block that will not be attached."""
        ...

    def thaw(self, lr_factor: float) -> None:
        """Every block learns from here on (grow.joint), at `lr_factor` times its learning rate (Block.thaw); a
        prefix cache is dropped. The engine is idle (between two run_epoch calls)."""
        ...

    def cache_prefix(self) -> dict[str, Any] | None:
        """Let the newest block train from stored outputs of the frozen blocks below it (None: the engine
        does not cache, or nothing to cache)."""
        ...

    def evaluate(self) -> dict[str, Any]:
        """Every exit and the adaptive trade-off on the test split (growpipe.evaluation)."""
        ...

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        """Real early exit on the test split at `threshold`, timed against the full path
        (growpipe.nn.inference.early_exit_report)."""
        ...

    def checksums(self) -> dict[int, str]:
        """SHA-256 of every block's weights, by block index."""
        ...

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        """Write every block's state into checkpoint directory `ckpt_dir` of the loop's `store`; return the
        manifest's shard entries ({file, sha256, blocks}). An engine that can also write in the background
        implements SavesInBackground (checkpoint.asynchronous)."""
        ...

    def layout(self) -> dict[str, Any]:
        """Where the blocks run (kept in the manifest for `build` after a resume)."""
        ...

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        """Load every block's state from checkpoint `ckpt_dir` of `store` (the blocks are built)."""
        ...

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        """Replace lost workers and build `specs` again, where `layout` says (None: as before the loss); then
        the loop restores a checkpoint."""
        ...

    def final_states(self) -> list[dict[str, Any]]:
        """Every block's state (CPU tensors), in block order."""
        ...

    def topology(self) -> TopologyView | None:
        """Where the blocks run and whether each one's home is on a live node (None: the engine does not place
        blocks in bundles of their own)."""
        ...

    def position(self) -> tuple[int, int] | None:
        """(batches done, batches in the epoch) of the running epoch, for a progress bar; any thread."""
        ...

    def extras(self) -> dict[str, Any]:
        """Engine-specific fields of the result JSON (placement, timeline, staleness, ...)."""
        ...

    def stop(self) -> None:
        """Release every worker and reservation; safe to call twice."""
        ...


@runtime_checkable
class SavesInBackground(Protocol):
    """An engine whose checkpoints can be written while it trains on (every engine growpipe ships; checkpoints
    through an engine without it are written on the loop's thread)."""

    def save_async(self, store: CheckpointStore, ckpt_dir: str) -> Callable[[], list[dict[str, Any]]]:
        """Copy every block's state as it is now (in memory) and return: the engine may train on. The answer
        writes the copies into checkpoint directory `ckpt_dir` of `store`, or waits for the workers writing
        them, from any thread; it returns the manifest's shard entries, as `save` does."""
        ...
