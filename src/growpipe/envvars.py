"""Every user-facing environment variable growpipe reads, declared once.

The fault-injection and test-gate variables (GROWPIPE_FAULT_AT, GROWPIPE_DIE_AT, GROWPIPE_DIE_IN_EVAL,
GROWPIPE_HOLD_AT, GROWPIPE_STEP_DELAY_MS, GROWPIPE_STOP_SWEEP_AT, GROWPIPE_OWN_BLOCKS_ONLY) are declared, read and
documented in growpipe.faults; being GROWPIPE_* they are forwarded to every actor of a run like the others
(forwarded).
"""

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
a job without it writes to ~/growpipe_results (growpipe.workdir.base_dir)."""


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


FORWARDED_PREFIXES = ("GROWPIPE_", "MLFLOW_")
"""Driver environment variables with these prefixes are passed on to every actor of a run (MLflow's
credentials and settings reach the controller that logs)."""


def forwarded() -> dict[str, str]:
    """The GROWPIPE_* and MLFLOW_* variables of this process, to hand to the actors of a run."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
