"""Run names: what may name a run (a folder, a Ray actor, an MLflow run)."""

from __future__ import annotations

import re

from growpipe.errors import ConfigError

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A run's name becomes a folder, a Ray actor name and an MLflow run name: letters, digits, '_', '.', '-'."""


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run (None: it can)."""
    if RUN_NAME.fullmatch(name) and ".." not in name:
        return None
    return (
        f"{name!r} is not a run name: use letters, digits, '_', '.' and '-', starting with a letter or digit, "
        "no '..', at most 128 characters (it names the run's checkpoint folder, Ray actor and MLflow run)"
    )


def check_run_name(name: str, field: str) -> str:
    """`name`, or ConfigError naming `field` (--run, --resume, name) when it cannot name a run."""
    if why := run_name_problem(name):
        raise ConfigError(f"{field}: {why}")
    return name
