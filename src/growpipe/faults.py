"""Fault injection and test gates, all in one place: every one is off unless its variable is set.

Tests (and demos of growing a running job) set these in the driver's environment; like every GROWPIPE_*
variable they reach each actor of a run (envvars.forwarded). Production code calls the small functions below,
each a no-op when its variable is unset; a malformed value raises ValueError naming the variable and its form.

GROWPIPE_FAULT_AT="STAGE:STEP"
    That stage's block raises on its STEP-th packet (1-based), reported as the stage's StageError.
    Acts in runtime/stage.py (Stage._train, via maybe_crash).
GROWPIPE_DIE_AT="WORKER:STEP:PATH"
    DDP worker (rank) WORKER's process, or a BP engine's stage actor WORKER, exits at its STEP-th training
    step (1-based) unless the file PATH exists (it is created first: the worker dies once).
    Acts in runtime/ddp_worker.py (the epoch's steps), bp_stage.py and async_bp.py (backward), via maybe_die_at.
GROWPIPE_DIE_IN_EVAL="STAGE:PATH"
    That stage's process exits at its first evaluation packet, once per run (it creates PATH first; a
    replacement that finds PATH goes on). Acts in runtime/stage_base.py (eval_packet, via maybe_die_in_eval).
GROWPIPE_HOLD_AT="EPOCH:BATCH:PATH"
    The source stage (every DDP worker) waits before batch BATCH of epoch EPOCH until a pause is asked for (a
    grow request is ready) or the file PATH exists: a test that needs a request to land mid-epoch holds the
    epoch open this way instead of betting that placement beats the rest of the epoch. A hold creates
    PATH.held as it starts waiting (a test that must act while the run is held waits for it).
    Acts in runtime/stage.py (Stage.run_epoch), runtime/pipeline_engine.py (pipeline.transport compiled: the
    engine submits the batches) and, on every DDP worker, runtime/ddp_worker.py (via hold_before).
GROWPIPE_STEP_DELAY_MS="N"
    Every local-learning stage's train step sleeps N milliseconds more: for tests and demos of growing a
    running job (a tiny model's epochs are otherwise over before a new stage actor has started).
    Acts in runtime/stage.py (Stage._train, via step_delay).
GROWPIPE_STOP_SWEEP_AT="EPOCH:PATH"
    A sweep's process stops itself as Ctrl-C does (SIGINT, which Tune handles: it saves its state and ends the
    trials) the moment Tune has recorded a trial's report of epoch EPOCH, before Tune registers the checkpoint
    that report carries, once (it creates PATH first; a sweep that finds PATH goes on): the one point where
    Tune's saved state has a report without its checkpoint. Acts in the sweep's process, in a Tune callback's
    on_trial_result (tune/gates.py, via stop_sweep_once); a malformed value stops the sweep before it starts.
GROWPIPE_OWN_BLOCKS_ONLY="1"
    Every stage actor fails (StageError) the moment it builds a block it was not given, which any gathering
    of the net into one actor would (a block may be as big as its worker). A stage claims its process
    (guard_own_blocks, runtime/stage_base.py), builds its blocks inside `building`, and every Block checks
    itself when it is built (check_own_block, nn/block.py). Any value but "" and "0" turns it on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Protocol

from growpipe.errors import StageError

GROWPIPE_FAULT_AT = "GROWPIPE_FAULT_AT"
GROWPIPE_DIE_AT = "GROWPIPE_DIE_AT"
GROWPIPE_DIE_IN_EVAL = "GROWPIPE_DIE_IN_EVAL"
GROWPIPE_HOLD_AT = "GROWPIPE_HOLD_AT"
GROWPIPE_STEP_DELAY_MS = "GROWPIPE_STEP_DELAY_MS"
GROWPIPE_STOP_SWEEP_AT = "GROWPIPE_STOP_SWEEP_AT"
GROWPIPE_OWN_BLOCKS_ONLY = "GROWPIPE_OWN_BLOCKS_ONLY"

VARIABLES = (GROWPIPE_FAULT_AT, GROWPIPE_DIE_AT, GROWPIPE_DIE_IN_EVAL, GROWPIPE_HOLD_AT, GROWPIPE_STEP_DELAY_MS,
             GROWPIPE_STOP_SWEEP_AT, GROWPIPE_OWN_BLOCKS_ONLY)  # fmt: skip
"""Every fault-injection and test-gate variable (see the module docstring)."""


# ---- reading the variables ----------------------------------------------------------------------------


def fault_at() -> tuple[int, int] | None:
    """(stage, step) from GROWPIPE_FAULT_AT, or None."""
    raw = os.environ.get(GROWPIPE_FAULT_AT)
    if not raw:
        return None
    stage, _, step = raw.partition(":")
    if not (stage.isdigit() and step.isdigit()):
        raise ValueError(f"{GROWPIPE_FAULT_AT}={raw!r}: expected STAGE:STEP, e.g. 1:3")
    return int(stage), int(step)


def die_at() -> tuple[int, int, str] | None:
    """(worker, step, marker file) from GROWPIPE_DIE_AT, or None."""
    return _two_numbers_and_a_path(GROWPIPE_DIE_AT, "WORKER:STEP:PATH, e.g. 1:3:/tmp/died")


def die_in_eval() -> tuple[int, str] | None:
    """(stage, marker file) from GROWPIPE_DIE_IN_EVAL, or None."""
    return _number_and_a_path(GROWPIPE_DIE_IN_EVAL, "STAGE:PATH, e.g. 1:/tmp/died")


def hold_at() -> tuple[int, int, str] | None:
    """(epoch, batch, gate file) from GROWPIPE_HOLD_AT, or None."""
    return _two_numbers_and_a_path(GROWPIPE_HOLD_AT, "EPOCH:BATCH:PATH, e.g. 1:5:/tmp/gate")


def step_delay_s() -> float:
    """GROWPIPE_STEP_DELAY_MS in seconds (0 when unset)."""
    raw = os.environ.get(GROWPIPE_STEP_DELAY_MS, "").strip()
    try:
        return max(0.0, float(raw)) / 1000.0 if raw else 0.0
    except ValueError:
        raise ValueError(f"{GROWPIPE_STEP_DELAY_MS}={raw!r}: expected milliseconds, e.g. 50") from None


def stop_sweep_at() -> tuple[int, str] | None:
    """(epoch, marker file) from GROWPIPE_STOP_SWEEP_AT, or None."""
    return _number_and_a_path(GROWPIPE_STOP_SWEEP_AT, "EPOCH:PATH, e.g. 1:/tmp/stopped")


def own_blocks_only() -> bool:
    """Whether GROWPIPE_OWN_BLOCKS_ONLY is on."""
    return os.environ.get(GROWPIPE_OWN_BLOCKS_ONLY, "") not in ("", "0")


def _number_and_a_path(name: str, expected: str) -> tuple[int, str] | None:
    """(N, path) from variable `name` set to N:PATH, or None when unset."""
    raw = os.environ.get(name)
    if not raw:
        return None
    number, _, path = raw.partition(":")
    if not (number.isdigit() and path):
        raise ValueError(f"{name}={raw!r}: expected {expected}")
    return int(number), path


def _two_numbers_and_a_path(name: str, expected: str) -> tuple[int, int, str] | None:
    """("N:M:PATH" of variable `name`) as (N, M, PATH), or None when it is not set."""
    raw = os.environ.get(name)
    if not raw:
        return None
    first, second, path = (raw.split(":", 2) + ["", ""])[:3]
    if not (first.isdigit() and second.isdigit() and path):
        raise ValueError(f"{name}={raw!r}: expected {expected}")
    return int(first), int(second), path


def check_stage_values() -> None:
    """Raise ValueError for a malformed GROWPIPE_FAULT_AT, GROWPIPE_HOLD_AT or GROWPIPE_STEP_DELAY_MS: a
    local-learning stage reads them when it starts, so a bad value fails it there, not at some packet."""
    fault_at()
    hold_at()
    step_delay_s()


# ---- where they act -----------------------------------------------------------------------------------


def maybe_crash(stage: int, packet: int) -> None:
    """GROWPIPE_FAULT_AT: raise when it names `stage` and this is its `packet`-th packet (1-based)."""
    if (fault := fault_at()) and fault == (stage, packet):
        raise RuntimeError(f"injected failure ({GROWPIPE_FAULT_AT})")


def maybe_die_at(worker: int, step: int) -> None:
    """GROWPIPE_DIE_AT: end this process when it names `worker` and `step` and its marker file is not there yet."""
    die = die_at()
    if die and die[:2] == (worker, step) and not os.path.exists(die[2]):
        open(die[2], "w").close()
        os._exit(1)  # a worker process lost mid-epoch


def maybe_die_in_eval(stage: int) -> None:
    """GROWPIPE_DIE_IN_EVAL: end this process when it names `stage` and its marker file is not there yet."""
    if (die := die_in_eval()) and die[0] == stage and not os.path.exists(die[1]):
        open(die[1], "w").close()
        os._exit(1)  # a stage lost during the evaluation


def stop_sweep_once(marker: str) -> None:
    """GROWPIPE_STOP_SWEEP_AT, at its epoch: interrupt this process (SIGINT) unless its `marker` file is there
    (then create it: once)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        signal.raise_signal(signal.SIGINT)


class Released(Protocol):
    """What a hold waits on besides its gate file (a threading.Event does)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


def hold_before(epoch: int, batch: int, pause: Released) -> None:
    """GROWPIPE_HOLD_AT: before batch `batch` of epoch `epoch` it names, wait until `pause` is set (a pause is
    asked for) or the gate file exists."""
    hold = hold_at()
    if hold is None or hold[:2] != (epoch, batch):
        return
    if not os.path.exists(hold[2]):
        open(f"{hold[2]}.held", "w").close()  # a test may wait for this: the run is inside its hold now
    while not pause.is_set() and not os.path.exists(hold[2]):
        pause.wait(0.05)


def step_delay() -> None:
    """GROWPIPE_STEP_DELAY_MS: sleep that long (nothing when unset)."""
    if delay := step_delay_s():
        time.sleep(delay)


# ---- GROWPIPE_OWN_BLOCKS_ONLY -------------------------------------------------------------------------

guarded_stage: int | None = None
"""The stage this process hosts when GROWPIPE_OWN_BLOCKS_ONLY is on (set by guard_own_blocks; None: no guard)."""
_building: int | None = None
"""The block that stage is building now (inside `building`)."""


def guard_own_blocks(stage: int) -> None:
    """A stage actor starts in this process: with GROWPIPE_OWN_BLOCKS_ONLY on, every block built here from now
    on must be one `stage` builds in `building`."""
    global guarded_stage
    if own_blocks_only():
        guarded_stage = stage


@contextlib.contextmanager
def building(index: int) -> Iterator[None]:
    """The guarded stage builds block `index`, one it was given, in the body."""
    global _building
    _building = index
    try:
        yield
    finally:
        _building = None


def check_own_block(index: int) -> None:
    """Called for every block built: under the guard, a block the stage was not given is a StageError."""
    if guarded_stage is not None and index != _building:
        raise StageError(f"stage {guarded_stage} built block {index}, which it does not hold "
                         f"({GROWPIPE_OWN_BLOCKS_ONLY}: no actor may gather another block)")  # fmt: skip
