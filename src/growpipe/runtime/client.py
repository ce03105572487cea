"""Talking to a running job from outside it: find its controller by run name, ask it to grow."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray

from growpipe.config import check_run_name
from growpipe.errors import InputError, PipelineError
from growpipe.runtime.cluster_record import (
    AUTH_MODE_VAR,
    choose_cluster,
    gcs_unreachable,
    read_record,
    use_token_auth,
)
from growpipe.runtime.names import controllers, run_of
from growpipe.runtime.pipeline import join_cluster
from growpipe.workdir import JOB_RESULTS_DIR, absolute

_chosen_by = "the cluster this process is connected to"
"""How the cluster asked was chosen (said when a run is not found there)."""


def connect_existing(address: str | None = None, run: str | None = None) -> str:
    """Join the cluster a job runs on: `address`, else $RAY_ADDRESS, else the address recorded when run `run`
    started (see growpipe.runtime.cluster_record), with the authentication mode recorded then; InputError when
    none of them names one (never the newest Ray on the machine, which may be somebody else's). Returns the
    line that says which cluster is asked."""
    global _chosen_by
    if not ray.is_initialized():
        workdirs = [Path(absolute("runs")), Path(JOB_RESULTS_DIR).expanduser() / "runs"]
        found = read_record(run, workdirs) if run and not address else None
        recorded = (found[0]["address"], found[1]) if found else None
        chosen = choose_cluster(address, os.environ.get("RAY_ADDRESS"), recorded)
        if chosen is None:
            where = " or ".join(str(w / "clusters" / f"{run}.json") for w in workdirs)
            raise InputError(f"--run {run}: no record of the cluster it runs on ({where}) and no --address or "
                             "RAY_ADDRESS; give the cluster's address (--address HOST:PORT, or --address auto for the "
                             "newest Ray on this machine)")  # fmt: skip
        address, _chosen_by = chosen
        from_record = found is not None and address == found[0]["address"] and _chosen_by.startswith("recorded")
        recorded_auth = found[0].get("auth") if found else None
        if from_record and recorded_auth == "token" and os.environ.get(AUTH_MODE_VAR) is None:
            use_token_auth()
        if from_record and (why := gcs_unreachable(address)):
            raise InputError(f"--run {run}: the cluster it started on ({address}, {_chosen_by}) does not answer "
                             f"({why}); the run may have ended, or give --address / RAY_ADDRESS")  # fmt: skip
        join_cluster(address, log_to_driver=False, chosen_by=_chosen_by)
    gcs = ray.get_runtime_context().gcs_address
    return f"grow   asking run {run} on cluster {gcs} ({_chosen_by})"


def running_runs() -> list[str]:
    """Names of the runs whose controllers live on this cluster."""
    return sorted({run_of(name) or name for name, _, _ in controllers()})


def find_run(name: str) -> Any:
    """The controller handle of run `name` (the one whose run has not ended, when an ended one still answers);
    InputError naming the cluster asked and the runs there are when there is none."""
    check_run_name(name, "--run")
    live = controllers(name)
    if live:
        return min(live, key=lambda found: bool(found[2] and found[2]["ended"]))[1]
    runs = running_runs()
    there = f"running: {', '.join(runs)}" if runs else "no growpipe run is running there"
    gcs = ray.get_runtime_context().gcs_address
    raise InputError(f"--run: no run named {name!r} on this cluster ({there}); asked the Ray cluster at {gcs} "
                     f"({_chosen_by}): choose another with --address ADDR or RAY_ADDRESS")  # fmt: skip


def request_growth(name: str, request: dict[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
    """Ask run `name` to append a block; returns what was added. PipelineError when it refuses."""
    controller = find_run(name)
    try:
        answer = ray.get(controller.grow.remote(request), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise PipelineError(
            f"run {name!r} did not answer within {timeout_s:g}s; the block may still be added (check its log)"
        ) from None
    except ray.exceptions.RayActorError:
        raise PipelineError(f"run {name!r} ended before it answered") from None
    if "error" in answer:
        raise InputError(answer["error"])
    return answer
