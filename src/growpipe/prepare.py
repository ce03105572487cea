"""The preparation step every entry point (growpipe train, the Python API, sweeps) takes before any actor
starts: paths made absolute where the run is started, every check that needs no cluster collected and
reported together, and the run's store and callbacks."""

from __future__ import annotations

import math
import os
import tempfile
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


EMBEDDED_CPUS_PER_CORE = 4
"""How far an embedded Ray oversubscribes this machine's cores by default (stage actors of small blocks
share a core well; dozens of them on two cores only start workers that never get to train)."""


def logical_cpus_needed(cfg: RunConfig) -> int:
    """CPUs a run's workers reserve once it has grown to its largest (stage actors or DDP workers)."""
    workers = cfg.max_blocks()
    if cfg.method == "bp" and cfg.runtime.bp_schedule == "ddp":
        workers = max(workers, cfg.runtime.ddp_workers or cfg.net.blocks)
    return math.ceil(workers * cfg.runtime.cpus_per_stage)


def embedded_capacity_problem(cfg: RunConfig) -> str | None:
    """Why an embedded local Ray could not place the run's workers (None: it can)."""
    need = logical_cpus_needed(cfg)
    cores = os.cpu_count() or 1
    have = cfg.runtime.num_cpus or EMBEDDED_CPUS_PER_CORE * cores
    if need <= have:
        return None
    limit = f"runtime.num_cpus={have}" if cfg.runtime.num_cpus else f"{have} ({EMBEDDED_CPUS_PER_CORE} per core)"
    return (f"net.blocks: the run's {cfg.max_blocks()} block(s) need {need} CPUs (runtime.cpus_per_stage="
            f"{cfg.runtime.cpus_per_stage:g} each); an embedded Ray on this {cores}-core machine offers {limit}: "
            "lower net.blocks / grow.max_blocks or runtime.cpus_per_stage, raise runtime.num_cpus, or join a "
            "cluster with --address")  # fmt: skip


def check_run(cfg: RunConfig, outputs: dict[str, str | None] | None = None, embedded_ray: bool = False) -> None:
    """Everything about a run that can be checked before Ray starts, reported together (ConfigError, one
    line per problem): the checkpoint URI's filesystem, the files the run will write (`outputs`: flag ->
    path) and, for an embedded Ray, whether this machine can hold the run's workers."""
    problems = []
    if embedded_ray and (why := embedded_capacity_problem(cfg)):
        problems.append(why)
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
    """Why a file or directory cannot be created at `path` (None: it can): a probe file is created (and
    removed at once) in the nearest directory that exists, as root's permission bits say little."""
    p = Path(path).expanduser().absolute()
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory; choose another path"
    try:
        fd, probe = tempfile.mkstemp(prefix=".growpipe-probe-", dir=parent)
    except OSError as e:
        return f"{parent} is not writable ({e.strerror}); choose another path"
    os.close(fd)
    os.unlink(probe)
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
