"""The preparation step every entry point (growpipe train, the Python API, sweeps, jobs/) takes once before
any actor starts (prepare_run): the config validated, paths made absolute against where results go
(growpipe.workdir.base_dir), the resume decided, every check that needs no cluster collected and reported
together; and the run's store and callbacks."""

from __future__ import annotations

import math
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from growpipe.baseline import ClassicalBar
from growpipe.checkpoint import CheckpointStore, check_uri, run_folder_problem
from growpipe.config import RunConfig, apply_overrides, config_and_problems, read_run_config
from growpipe.data.presence import data_problem
from growpipe.device import precision_problem
from growpipe.envvars import extra_overrides
from growpipe.errors import ConfigError, GrowpipeError
from growpipe.fsutil import unwritable
from growpipe.growth import preserve_config_problem
from growpipe.loop.callbacks import ProgressLog, RunCallback
from growpipe.memory import memory_problem
from growpipe.outputs import Kind, check_outputs
from growpipe.ray_metrics import RayMetrics
from growpipe.resume import continue_from, plan_resume
from growpipe.runtime.bp_checks import bp_problems
from growpipe.runtime.cluster_record import gcs_unreachable
from growpipe.tracking import MlflowTracker, default_tracking_uri
from growpipe.workdir import absolute, storage_note, storage_problem


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


EMBEDDED_CPUS_PER_CORE = 4
"""How far an embedded Ray oversubscribes this machine's cores by default (stage actors of small blocks
share a core well; dozens of them on two cores only start workers that never get to train)."""


def logical_cpus_needed(cfg: RunConfig) -> int:
    """CPUs a run's workers reserve once it has grown to its largest (stage actors or DDP workers)."""
    workers = cfg.max_blocks()
    if cfg.engine() == "ddp":
        workers = max(workers, cfg.ddp.workers or cfg.net.blocks)
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


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to start: its config (paths absolute, name chosen, the MLflow run it continues) and the
    checkpoint directory it starts from (None: a fresh start)."""

    cfg: RunConfig
    resume: str | None = None


ConfigSource = RunConfig | str | Path | dict[str, Any] | None
"""A run config as every entry point takes it: a RunConfig, a YAML path, a mapping, or None (every default)."""


def prepare_run(config: ConfigSource = None, overrides: list[str] | None = None, *, resume: str | None = None,
                resume_run: str | None = None, runtime: str = "ray", address: str | None = None,
                outputs: dict[str, tuple[str | None, Kind]] | None = None,
                say: Callable[[str], None] | None = print) -> PreparedRun:  # fmt: skip
    """The preparation step of every entry point (growpipe train, growpipe.train, sweeps, jobs/), taken once
    before any actor starts: the config validated, its relative paths resolved (see base_dir), the resume
    decided (`resume_run`: growpipe train --resume NAME|auto, see growpipe.resume.plan_resume; `resume`: a
    checkpoint directory) with the MLflow run it continues, and every problem found (the config's own
    included) reported together as one ConfigError, one line per problem. `say` gets where results go and
    what will not stop the run."""
    say = say or (lambda _line: None)
    problems: list[str] = []
    if runtime not in ("ray", "local"):
        problems.append(f"runtime: {runtime!r} is not ray or local")
    if resume_run is not None:
        if not (config is None or isinstance(config, (str, Path))):
            raise ConfigError("resume_run: give the config as a YAML path (or None: the checkpoint's own)")
        cfg, ref = plan_resume(None if config is None else str(config), list(overrides or []), resume_run, say)
        resume = ref.path if ref else None
        say(f"resume {resume or 'nothing to resume: starting run ' + repr(cfg.name)}")
    else:
        found, problems_of_config = read_config(config, overrides)
        problems = problems_of_config + problems
        if found is None:
            refuse(problems)
        assert found is not None
        cfg = found
    if note := storage_note():
        say(note)
    cfg = resolve_paths(cfg)
    if resume is not None and resume_run is None:
        resume = absolute(resume)
        cfg = continue_from(cfg, resume)
    embedded = runtime == "ray" and not (address or os.environ.get("RAY_ADDRESS"))
    ray = sys.modules.get("ray")
    connected = ray is not None and ray.is_initialized()  # a run then uses this connection, not the address
    if runtime == "ray" and not connected and (why := cluster_problem(address, os.environ.get("RAY_ADDRESS"))):
        problems.append(why)
    check_run(cfg, outputs, embedded_ray=embedded, fresh=resume is None, warn=say, problems=problems,
              on_ray=runtime == "ray")  # fmt: skip
    return PreparedRun(cfg, resume)


def cluster_problem(given: str | None, env: str | None) -> str | None:
    """Why the cluster a run would join (--address `given`, else $RAY_ADDRESS `env`) does not answer now (None:
    it does, no address is given, or the address is not HOST:PORT). Asked first because ray.init waits minutes
    for a GCS that is not there."""
    chosen = given or env
    if not chosen:
        return None
    if not (why := gcs_unreachable(chosen)):
        return None
    if given:
        return (
            f"--address {given}: no Ray cluster answers there ({why}); check the host and port (the head's GCS "
            "port, 6379 by default) and that the cluster is up, or leave --address out for an embedded local Ray"
        )
    return (f"RAY_ADDRESS={env}: no Ray cluster answers there ({why}); check the address and that the cluster is "
            "up, or unset RAY_ADDRESS for an embedded local Ray")  # fmt: skip


def read_config(config: ConfigSource, overrides: list[str] | None = None) -> tuple[RunConfig | None, list[str]]:
    """The config (`overrides` applied, then GROWPIPE_SET's) and its validation problems, one line each (see
    growpipe.config.config_and_problems); a YAML file that cannot be read raises at once."""
    overrides = [*(overrides or []), *extra_overrides()]
    if isinstance(config, RunConfig):
        if not overrides:
            return config, []
        return config_and_problems(apply_overrides(config.model_dump(mode="json"), overrides), None, overrides)
    if config is None or isinstance(config, dict):
        return config_and_problems(apply_overrides(config or {}, overrides or []), None, overrides)
    raw = read_run_config(config)  # with its base: chain
    return config_and_problems(apply_overrides(raw, overrides or []), Path(config), overrides)


def check_run(cfg: RunConfig, outputs: dict[str, tuple[str | None, Kind]] | None = None, embedded_ray: bool = False,
              fresh: bool = True, warn: Callable[[str], None] | None = None, problems: list[str] | None = None,
              on_ray: bool = False) -> None:  # fmt: skip
    """ConfigError listing `problems` found before and every run_problems, one line each (none: nothing)."""
    refuse([*(problems or []), *run_problems(cfg, outputs, embedded_ray, fresh, warn, on_ray)])


def run_problems(cfg: RunConfig, outputs: dict[str, tuple[str | None, Kind]] | None = None, embedded_ray: bool = False,
                 fresh: bool = True, warn: Callable[[str], None] | None = None, on_ray: bool = False,
                 data_here: bool | None = None) -> list[str]:  # fmt: skip
    """Everything about a run that can be checked before Ray starts, one line per problem: where results go,
    the checkpoint URI and the run's folder in it (`fresh`: a new run, not a resume), the tracking URI, the
    data (looked for here before any actor reads it: a problem when the stages read it on this machine,
    `data_here`, by default with an embedded Ray or no Ray; `warn`ed on a cluster), the files the run will
    write (`outputs`: flag -> (path, kind)), what BP on Ray needs (`on_ray`), whether the net and a batch fit
    in this machine's memory (when the workers run here; else a warning for one block: memory_problem) and, for
    an embedded Ray, whether this machine can hold the run's workers. `warn` gets what will not stop the run (an
    MLflow server that does not answer)."""
    problems = []
    if why := storage_problem():
        problems.append(why)
    if embedded_ray and (why := embedded_capacity_problem(cfg)):
        problems.append(why)
    if why := precision_problem(cfg.train.precision, cfg.device):
        problems.append(why)
    if why := preserve_config_problem(cfg):
        problems.append(why)
    here = data_here if data_here is not None else embedded_ray or not on_ray
    ddp = on_ray and cfg.method == "bp" and cfg.engine() == "ddp"
    too_big, block_too_big = memory_problem(cfg, here, (cfg.ddp.workers or cfg.net.blocks) if ddp else 1)
    problems += [too_big] if too_big else []
    if block_too_big and warn:
        warn(block_too_big)
    if on_ray and cfg.method == "bp":
        problems += bp_problems(cfg)
    if cfg.checkpoint.enabled:
        problems += checkpoint_problems(cfg, fresh)
    if cfg.tracking.mlflow and cfg.tracking.uri:
        scheme_problem, unreachable = tracking_uri_problem(cfg.tracking.uri)
        if scheme_problem:
            problems.append(scheme_problem)
        elif unreachable and warn:
            warn(
                f"warn   tracking.uri {cfg.tracking.uri}: {unreachable}; the run goes on and keeps what it cannot "
                f"send in {cfg.tracking.workdir}/mlflow-unsent-{cfg.name}-*.jsonl (growpipe mlflow replay sends it)"
            )
    if why := data_problem(cfg.data):
        if here:
            problems.append(why)
        elif warn:  # a cluster's stage 0 may run on a node that has it: that node's read says for sure
            warn(f"warn   {why} (from this node; the run's first stage looks again on its own node)")
    problems += check_outputs(outputs or {})
    return problems


def refuse(problems: list[str]) -> None:
    """ConfigError listing `problems` (one line each) when there are any."""
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) before the run\n" + "\n".join(f"  {p}" for p in problems))


def checkpoint_problems(cfg: RunConfig, fresh: bool) -> list[str]:
    """What stops a run writing its checkpoints: a URI with no filesystem, a local path that cannot be written,
    a run folder holding what growpipe did not write, or (`fresh`) an earlier run's checkpoints of its name."""
    uri = cfg.checkpoint.uri
    try:
        check_uri(uri)
    except GrowpipeError as e:
        return [str(e)]
    if "://" not in uri:
        root = Path(uri)
        if root.exists() and not root.is_dir():
            return [f"checkpoint.uri {uri}: is a file; give a folder for the run folders"]
        if why := unwritable(root / (cfg.name or "run")):
            return [f"checkpoint.uri {uri}: {why}"]
    try:
        why = run_folder_problem(CheckpointStore(uri, cfg.name or "", cfg.checkpoint.keep), fresh,
                                 cfg.checkpoint.overwrite)  # fmt: skip
    except OSError as e:  # a remote store that does not answer: said here, not as a traceback mid-run
        return [f"checkpoint.uri {uri}: cannot be read ({str(e).splitlines()[0]}); check the URI and credentials"]
    return [why] if why else []


MLFLOW_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
"""Tracking-store schemes of MLflow 3.17 (plain paths and file:// are refused by it); a plugin's scheme is
looked up in MLflow's registry."""


def tracking_uri_problem(uri: str) -> tuple[str | None, str | None]:
    """(why MLflow cannot use `uri` at all, why a tracking server does not answer now); None where fine."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        why = (f"tracking.uri {uri}: MLflow 3.17 no longer writes plain-path (file) stores; use sqlite:///PATH/"
               "mlflow.db or an http(s):// tracking server (or set MLFLOW_ALLOW_FILE_STORE=true)")  # fmt: skip
        return why, None
    if scheme not in (*MLFLOW_SCHEMES, "", "file"):
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        if scheme not in _tracking_store_registry._registry:
            return (f"tracking.uri {uri}: MLflow has no tracking store for scheme '{scheme}://'; use sqlite:///PATH, "
                    f"http(s)://HOST:PORT, postgresql://, mysql:// or mssql://"), None  # fmt: skip
    if scheme in ("http", "https"):
        return None, server_unreachable(uri)
    return None, None


def server_unreachable(uri: str, timeout_s: float = 3.0) -> str | None:
    """Why the MLflow server at `uri` does not answer its /health page (None: it answers)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):  # noqa: S310 (http(s) only)
            return None
    except urllib.error.HTTPError as e:  # it answered: a proxy or an auth wall is the server's business
        return None if e.code < 500 else f"the server answered HTTP {e.code}"
    except (OSError, ValueError) as e:
        return f"no MLflow server answered ({getattr(e, 'reason', e)})"


def checkpoint_store(cfg: RunConfig, run_name: str | None = None) -> CheckpointStore | None:
    """Where the run's restore points go (None when checkpoint.enabled is false)."""
    if not cfg.checkpoint.enabled:
        return None
    name = run_name or cfg.name
    assert name is not None, "resolve_paths names every run"
    return CheckpointStore(cfg.checkpoint.uri, name, cfg.checkpoint.keep)


def run_callbacks(cfg: RunConfig, run_name: str, say: Callable[[str], None], on_ray: bool = False) -> list[RunCallback]:
    """The callbacks of a run: its progress lines, the classical bar when eval.baseline, MLflow tracking when
    tracking.mlflow, and on Ray (the run's controller) its live Ray metrics."""
    callbacks: list[RunCallback] = [ProgressLog(say)]
    if cfg.eval.baseline:
        callbacks.append(ClassicalBar(cfg, say))
    if cfg.tracking.mlflow:
        callbacks.append(MlflowTracker(cfg, run_name, say))
    if on_ray:
        callbacks.append(RayMetrics(run_name))
    return callbacks
