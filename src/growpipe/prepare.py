"""The preparation step every entry point (growpipe train, the Python API, sweeps) takes before any actor
starts: paths made absolute where the run is started, every check that needs no cluster collected and
reported together, and the run's store and callbacks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from growpipe.checkpoint import CheckpointStore, check_uri
from growpipe.config import RunConfig
from growpipe.errors import ConfigError, GrowpipeError
from growpipe.loop.callbacks import ProgressLog, RunCallback
from growpipe.tracking import default_tracking_uri


def resolve_paths(cfg: RunConfig) -> RunConfig:
    """The config with tracking.uri filled in (an absolute sqlite path unless $MLFLOW_TRACKING_URI) and a
    local checkpoint.uri made absolute, here where the run is started: actors may run elsewhere."""
    tracking, checkpoint = cfg.tracking, cfg.checkpoint
    if tracking.mlflow and not tracking.uri:
        tracking = tracking.model_copy(update={"uri": default_tracking_uri(tracking.workdir)})
    if "://" not in checkpoint.uri and not Path(checkpoint.uri).is_absolute():
        checkpoint = checkpoint.model_copy(update={"uri": str(Path(checkpoint.uri).expanduser().resolve())})
    return cfg.model_copy(update={"tracking": tracking, "checkpoint": checkpoint})


def check_run(cfg: RunConfig, outputs: dict[str, str | None] | None = None) -> None:
    """Everything about a run that can be checked before Ray starts, reported together (ConfigError, one
    line per problem): the checkpoint URI's filesystem and the files the run will write (`outputs`: flag
    -> path)."""
    problems = []
    if cfg.checkpoint.enabled:
        try:
            check_uri(cfg.checkpoint.uri)
        except GrowpipeError as e:
            problems.append(str(e))
    for flag, path in (outputs or {}).items():
        if path and (why := unwritable(path)):
            problems.append(f"{flag} {path}: {why}")
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) before the run\n" + "\n".join(f"  {p}" for p in problems))


def unwritable(path: str | Path) -> str | None:
    """Why a file or directory cannot be created at `path` (None: it can): the nearest existing parent
    must be a writable directory."""
    p = Path(path).expanduser().absolute()
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory; choose another path"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable; choose another path"
    if p.is_dir() and not os.access(p, os.W_OK):
        return f"{p} is not writable; choose another path"
    return None


def checkpoint_store(cfg: RunConfig, run_name: str | None = None) -> CheckpointStore | None:
    """Where the run's restore points go (None when checkpoint.enabled is false)."""
    if not cfg.checkpoint.enabled:
        return None
    return CheckpointStore(cfg.checkpoint.uri, run_name or cfg.name, cfg.checkpoint.keep)


def run_callbacks(cfg: RunConfig, run_name: str, say: Callable[[str], None]) -> list[RunCallback]:
    """The callbacks of a run: its progress lines, and MLflow tracking when tracking.mlflow."""
    callbacks: list[RunCallback] = [ProgressLog(say)]
    if cfg.tracking.mlflow:
        from growpipe.tracking import MlflowTracker

        callbacks.append(MlflowTracker(cfg, run_name, say))
    return callbacks
