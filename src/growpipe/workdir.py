"""What a run's relative paths mean (base_dir): $GROWPIPE_WORKDIR; else, in a Ray job's temporary working
directory, JOB_RESULTS_DIR; else the current directory. Every entry point resolves them here, before any actor
starts (growpipe.prepare.resolve_paths)."""

from __future__ import annotations

import os
from pathlib import Path

from growpipe import envvars

JOB_RESULTS_DIR = "~/growpipe_results"
"""Where a Ray job's results go when it runs in Ray's temporary copy of its working directory and
GROWPIPE_WORKDIR is not set: a durable place outside that copy (as Ray Train's ~/ray_results), created as
needed, on the node the job's driver runs on."""


def in_temporary_job_dir() -> bool:
    """Whether this process is a Ray job running in Ray's temporary copy of its working directory
    (.../runtime_resources/working_dir_files/_ray_pkg_*), which goes away with the job."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ and "working_dir_files" in Path.cwd().parts


def base_dir() -> Path:
    """What a run's relative paths mean: $GROWPIPE_WORKDIR; else, in a Ray job's temporary working directory,
    JOB_RESULTS_DIR (~/growpipe_results); else the current directory."""
    if given := envvars.workdir():
        return Path(given).expanduser().resolve()
    if in_temporary_job_dir():
        return Path(JOB_RESULTS_DIR).expanduser().resolve()
    return Path.cwd().resolve()


def storage_problem() -> str | None:
    """Why the place given for results cannot be used (None: it can): a GROWPIPE_WORKDIR that is not an
    existing directory is refused (a typo would otherwise scatter results into a new tree)."""
    given = envvars.workdir()
    if given and not Path(given).expanduser().is_dir():
        what = "is a file" if Path(given).expanduser().exists() else "does not exist"
        return (f"{envvars.GROWPIPE_WORKDIR}={given}: {what}; give an existing directory for the run's results "
                "(mkdir it) or unset it")  # fmt: skip
    return None


def storage_note() -> str | None:
    """The line that says where results go when it is not where the command was started: a Ray job in its
    temporary working directory without GROWPIPE_WORKDIR."""
    if envvars.workdir() or not in_temporary_job_dir():
        return None
    return f"store  results in {base_dir()} (Ray job working dir is temporary; set GROWPIPE_WORKDIR for another place)"


def absolute(path: str) -> str:
    """A local path made absolute against base_dir() (a URI stays as it is)."""
    if "://" in path:
        return path
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base_dir() / p)
