"""Decisions the run loop takes, as small functions of the run's state (tested without Ray).

- failure: a lost worker -> Retry from a checkpoint, or Raise with the reason (a block's own failure, e.g. a
  non-finite loss, always raises);
- skipped batches: a block that skipped every batch of an epoch ends the run;
- checkpoints: which epoch ends and batches get a restore point;
- the grow limit (requests and planned steps alike): growpipe.growth.grow_refusal;
- no capacity for a new block: pack it into an existing worker, or fail;
- a standby actor for the next block: start one now, or not;
- an epoch boundary: grow there, or train on while a waiting request's block is placed.

When the net grows by plan is growpipe.growth.GrowthPlan's decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from growpipe.config import CheckpointSpec
from growpipe.loop.stats import StageStats


@dataclass(frozen=True)
class Retry:
    """Go on from checkpoint `path` (restart number `restart`)."""

    path: str
    restart: int


@dataclass(frozen=True)
class Raise:
    """End the run with `message`."""

    message: str


def decide_failure(what: str, lost: bool, restarts: int, limit: int, latest: str | None,
                   checkpoints: bool) -> Retry | Raise:  # fmt: skip
    """After an error: retry from the newest checkpoint when a worker was lost (not when a block failed),
    there is a checkpoint, and fewer than `limit` restarts were made."""
    if not lost:
        return Raise(what)
    if latest is None:
        why = "checkpoint.enabled is false" if not checkpoints else "none was written yet"
        return Raise(f"{what}; no checkpoint to recover from ({why})")
    if restarts >= limit:
        return Raise(f"{what}; giving up after {restarts} restart(s) (runtime.max_stage_restarts)")
    return Retry(latest, restarts + 1)


def learned_nothing(stats: list[StageStats]) -> str | None:
    """Why an epoch ends the run although train.on_nonfinite is skip_batch: a block skipped every batch its
    stage trained (None: every block learned from some batch)."""
    blocks = [(int(k.removeprefix("b")), n, s.batches) for s in stats for k, n in s.skipped.items()]
    idle = sorted((i, n, batches) for i, n, batches in blocks if batches and n >= batches)
    if not idle:
        return None
    which = ", ".join(f"block {i} ({n} of {batches})" for i, n, batches in idle)
    return f"{which} skipped every batch of the epoch (a non-finite loss or gradient each time)"


@dataclass(frozen=True)
class CheckpointTiming:
    """When restore points are written: at the start, at every growth, at the end of every
    `every_epochs`-th epoch (and the last), and every `every_batches` batches inside an epoch."""

    enabled: bool
    every_epochs: int
    every_batches: int

    @classmethod
    def from_spec(cls, spec: CheckpointSpec) -> CheckpointTiming:
        return cls(spec.enabled, spec.every_epochs, spec.every_batches)

    def at_epoch_end(self, epoch: int, total: int) -> bool:
        """A checkpoint after `epoch` finished epochs (when no growth follows: growth writes its own)."""
        every = self.every_epochs
        return self.enabled and bool(epoch) and bool(every) and (epoch % every == 0 or epoch >= total)

    def next_stop(self, start_batch: int) -> int | None:
        """The batch an epoch running from `start_batch` pauses before for a checkpoint (None: none)."""
        every = self.every_batches
        if not self.enabled or not every:
            return None
        return (start_batch // every + 1) * every


def pack_host(on_no_capacity: str, last_host: int) -> int | None:
    """Where a block goes that cannot get a worker of its own within runtime.placement_timeout_s: into the
    actor that runs the last block (`last_host`) when grow.on_no_capacity is pack; None: the growth fails."""
    return last_host if on_no_capacity == "pack" else None


def want_standby(setting: str, depth: int, max_blocks: int, bundle: dict[str, float],
                 available: dict[str, float]) -> bool:  # fmt: skip
    """Whether to start the actor of the next grown block now (grow.standby): the run can still grow, the
    setting allows a stage of this `bundle` to wait idle (auto: no GPU in it), and the cluster's `available`
    resources hold it now (a standby never waits for room, nor asks an autoscaler for a node)."""
    if setting == "never" or depth >= max_blocks:
        return False
    if setting == "auto" and bundle.get("GPU", 0) > 0:
        return False
    return all(available.get(k, 0.0) >= v for k, v in bundle.items())


def better_epoch(best_val: float | None, row: dict[str, Any]) -> bool:
    """Whether an epoch's row takes over as the best validation accuracy so far (`best_val`; None: nothing yet,
    e.g. right after a growth): at least as high, so among equals the latest epoch is selected. A small
    validation split ties often, and the earliest of a tie was an undertrained net (bench/RESULTS.md, "The
    text recipe on three text sets")."""
    val = row.get("val_accuracy")
    return val is not None and (best_val is None or val >= best_val)


def grow_at_boundary(planned: bool, placed: bool, waiting: bool, places_while_training: bool, epochs_left: int,
                     cache_due: bool) -> bool:  # fmt: skip
    """Whether an epoch boundary grows the net now: planned steps are due, a request's block placed during the
    epoch waits to be attached, or a request waits (with epochs left to train it) and cannot be placed while
    the next epoch trains: the engine places blocks only between batches, the next epoch is the last (a block
    attached late in it would hardly train), or a prefix cache is due first (a block attached mid-epoch would
    drop it). Otherwise the block is placed while the next epoch trains, so the blocks already training never
    stop for a placement."""
    if planned or placed:
        return True
    if not waiting or epochs_left <= 0:
        return False
    return not places_while_training or epochs_left == 1 or cache_due
