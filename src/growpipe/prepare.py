"""The preparation step every entry point (growpipe train, the Python API, sweeps) takes before any actor
starts: paths made absolute where the run is started, every check that needs no cluster collected and
reported together, and the run's store and callbacks."""

from __future__ import annotations

import math
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from growpipe import envvars
from growpipe.checkpoint import CheckpointStore, check_uri
from growpipe.config import RunConfig
from growpipe.errors import ConfigError, GrowpipeError
from growpipe.loop.callbacks import ProgressLog, RunCallback
from growpipe.tracking import default_tracking_uri


def base_dir() -> Path:
    """What a run's relative paths mean: $GROWPIPE_WORKDIR, else the current directory."""
    return Path(envvars.workdir() or Path.cwd()).expanduser().resolve()


def absolute(path: str) -> str:
    """A local path made absolute against base_dir() (a URI stays as it is)."""
    if "://" in path:
        return path
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base_dir() / p)


def resolve_paths(cfg: RunConfig) -> RunConfig:
    """The config with tracking.workdir and a local checkpoint.uri made absolute and tracking.uri filled in
    (a sqlite store in the workdir unless $MLFLOW_TRACKING_URI), here where the run is started: actors
    may run elsewhere, a job in a temporary directory."""
    experiment = cfg.tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "growpipe"
    tracking = cfg.tracking.model_copy(update={"workdir": absolute(cfg.tracking.workdir), "experiment": experiment})
    if tracking.mlflow and not tracking.uri:
        tracking = tracking.model_copy(update={"uri": default_tracking_uri(tracking.workdir)})
    checkpoint = cfg.checkpoint.model_copy(update={"uri": absolute(cfg.checkpoint.uri)})
    return cfg.model_copy(update={"name": cfg.name or default_run_name(cfg), "tracking": tracking,
                                  "checkpoint": checkpoint})  # fmt: skip


def default_run_name(cfg: RunConfig) -> str:
    """METHOD-DATASET-TIME for a run without a name (e.g. al-digits-20261124-101500-3fa2)."""
    dataset = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.data.name.split(":", 1)[0]).strip("-") or "data"
    return f"{cfg.method}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def temporary_workdir_warning(cfg: RunConfig) -> str | None:
    """A warning when this is a Ray job in Ray's temporary copy of its working directory and the run's
    results would go there (and vanish with it): the settings that keep them."""
    if envvars.workdir() or "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ or "working_dir" not in str(Path.cwd()):
        return None
    lost = []
    if cfg.tracking.mlflow and not (cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")):
        lost.append(f"the MLflow store ({cfg.tracking.workdir}/mlflow.db; set MLFLOW_TRACKING_URI)")
    if cfg.checkpoint.enabled and "://" not in cfg.checkpoint.uri and not Path(cfg.checkpoint.uri).is_absolute():
        lost.append(f"the checkpoints ({cfg.checkpoint.uri}; --set checkpoint.uri=/absolute/path)")
    if not lost:
        return None
    return (f"warn   this job runs in Ray's temporary copy of its working directory ({Path.cwd()}): "
            f"{' and '.join(lost)} would vanish with it; set those, or GROWPIPE_WORKDIR=/a/durable/dir in the "
            "job's runtime_env env_vars (raylocal/submit does)")  # fmt: skip


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
