"""Every environment variable growpipe reads, declared once."""

import os

GROWPIPE_DATA_DIR = "GROWPIPE_DATA_DIR"
"""A directory whose subfolders (fashion-mnist/, 20newsgroups/, cifar10/...) hold the datasets."""


def data_dir() -> str | None:
    """The value of GROWPIPE_DATA_DIR, if set and non-empty."""
    return os.environ.get(GROWPIPE_DATA_DIR) or None


GROWPIPE_WORKDIR = "GROWPIPE_WORKDIR"
"""The directory a run's relative paths (tracking.workdir and the MLflow store in it, checkpoint.uri, a sweep's
output) are resolved against instead of the current directory; it must exist (a run is refused otherwise).
raylocal/up starts its head with it (the checkout by default) and every job's driver inherits it, so a job
started in Ray's temporary working directory writes where the submitter looks, whichever way it was submitted;
a job without it writes to ~/growpipe_results (growpipe.prepare.base_dir)."""


def workdir() -> str | None:
    """The value of GROWPIPE_WORKDIR, if set and non-empty."""
    return os.environ.get(GROWPIPE_WORKDIR) or None


GROWPIPE_SET = "GROWPIPE_SET"
"""Config overrides applied after every other (the config file, --set, a sweep's own), as `key=value` items
separated by semicolons, e.g. "train.epochs=1; data.limit_train=256": a smoke run of any documented command
without editing it (the documentation's tests run them so). A run, a resume, the Python API's load_config and
every trial of a sweep take them; growpipe evaluate does not (it evaluates what was trained)."""


def extra_overrides() -> list[str]:
    """The items of GROWPIPE_SET (none when unset)."""
    return _items(GROWPIPE_SET)


def _items(variable: str) -> list[str]:
    """The `key=value` items of a semicolon-separated override variable (none when unset)."""
    return [item.strip() for item in os.environ.get(variable, "").split(";") if item.strip()]


GROWPIPE_SWEEP_SET = "GROWPIPE_SWEEP_SET"
"""Sweep-file overrides applied after the file's fields and `growpipe sweep --set`, as GROWPIPE_SET's items,
e.g. "num_samples=2": with GROWPIPE_SET (small trials) a smoke run of a documented sweep on fewer trials."""


def sweep_overrides() -> list[str]:
    """The items of GROWPIPE_SWEEP_SET (none when unset)."""
    return _items(GROWPIPE_SWEEP_SET)


GROWPIPE_FAULT_AT = "GROWPIPE_FAULT_AT"
"""Fault injection for tests: "STAGE:STEP" makes that stage's block raise on its STEP-th packet (1-based)."""

FORWARDED_PREFIXES = ("GROWPIPE_", "MLFLOW_")
"""Driver environment variables with these prefixes are passed on to every actor of a run (MLflow's
credentials and settings reach the controller that logs)."""


def forwarded() -> dict[str, str]:
    """The GROWPIPE_* and MLFLOW_* variables of this process, to hand to the actors of a run."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}


def fault_at() -> tuple[int, int] | None:
    """(stage, step) from GROWPIPE_FAULT_AT, or None."""
    raw = os.environ.get(GROWPIPE_FAULT_AT)
    if not raw:
        return None
    stage, _, step = raw.partition(":")
    if not (stage.isdigit() and step.isdigit()):
        raise ValueError(f"{GROWPIPE_FAULT_AT}={raw!r}: expected STAGE:STEP, e.g. 1:3")
    return int(stage), int(step)


GROWPIPE_HOLD_AT = "GROWPIPE_HOLD_AT"
"""A gate for tests: "EPOCH:BATCH:PATH" makes the source stage wait before batch BATCH of epoch EPOCH until a
pause is asked for (a grow request is ready) or the file PATH exists. A test that needs a request to land
mid-epoch holds the epoch open this way instead of betting that placement beats the rest of the epoch."""


def hold_at() -> tuple[int, int, str] | None:
    """(epoch, batch, gate file) from GROWPIPE_HOLD_AT, or None."""
    return _two_numbers_and_a_path(GROWPIPE_HOLD_AT, "EPOCH:BATCH:PATH, e.g. 1:5:/tmp/gate")


def _two_numbers_and_a_path(name: str, expected: str) -> tuple[int, int, str] | None:
    """("N:M:PATH" of variable `name`) as (N, M, PATH), or None when it is not set."""
    raw = os.environ.get(name)
    if not raw:
        return None
    first, second, path = (raw.split(":", 2) + ["", ""])[:3]
    if not (first.isdigit() and second.isdigit() and path):
        raise ValueError(f"{name}={raw!r}: expected {expected}")
    return int(first), int(second), path


GROWPIPE_OWN_BLOCKS_ONLY = "GROWPIPE_OWN_BLOCKS_ONLY"
"""A guard for tests: "1" makes every stage actor fail (StageError) the moment it builds a block it was not
given, which any gathering of the net into one actor would (a block may be as big as its worker)."""


def own_blocks_only() -> bool:
    """Whether GROWPIPE_OWN_BLOCKS_ONLY is on."""
    return os.environ.get(GROWPIPE_OWN_BLOCKS_ONLY, "") not in ("", "0")


GROWPIPE_DIE_IN_EVAL = "GROWPIPE_DIE_IN_EVAL"
"""Fault injection for tests: "STAGE:PATH" makes that stage's process exit at its first evaluation packet,
once per run (it creates PATH first; a replacement that finds PATH goes on)."""


def die_in_eval() -> tuple[int, str] | None:
    """(stage, marker file) from GROWPIPE_DIE_IN_EVAL, or None."""
    raw = os.environ.get(GROWPIPE_DIE_IN_EVAL)
    if not raw:
        return None
    stage, _, path = raw.partition(":")
    if not (stage.isdigit() and path):
        raise ValueError(f"{GROWPIPE_DIE_IN_EVAL}={raw!r}: expected STAGE:PATH, e.g. 1:/tmp/died")
    return int(stage), path


GROWPIPE_STEP_DELAY_MS = "GROWPIPE_STEP_DELAY_MS"
"""Slows every stage's train step by this many milliseconds: for tests and demos of growing a running job
(a tiny model's epochs are otherwise over before a new stage actor has started)."""


def step_delay_s() -> float:
    """GROWPIPE_STEP_DELAY_MS in seconds (0 when unset)."""
    raw = os.environ.get(GROWPIPE_STEP_DELAY_MS, "").strip()
    try:
        return max(0.0, float(raw)) / 1000.0 if raw else 0.0
    except ValueError:
        raise ValueError(f"{GROWPIPE_STEP_DELAY_MS}={raw!r}: expected milliseconds, e.g. 50") from None


GROWPIPE_DIE_AT = "GROWPIPE_DIE_AT"
"""Fault injection for tests: "WORKER:STEP:PATH" makes DDP worker (rank) WORKER's process, or a BP engine's
stage actor WORKER, exit at its STEP-th training step (1-based) unless the file PATH exists (it is created
first: the worker dies once)."""


def die_here(worker: int, step: int) -> None:
    """End this process when GROWPIPE_DIE_AT names `worker` and `step` and its marker file is not there yet."""
    die = _two_numbers_and_a_path(GROWPIPE_DIE_AT, "WORKER:STEP:PATH, e.g. 1:3:/tmp/died")
    if die and die[:2] == (worker, step) and not os.path.exists(die[2]):
        open(die[2], "w").close()
        os._exit(1)  # a worker process lost mid-epoch
