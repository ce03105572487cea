"""Named actors: a run's controller and stage actors' names (unique per attempt), and finding a run's live
controllers by its name.

A controller is named `RUN@ATTEMPT` (ATTEMPT: 8 random hex digits, new each time a run starts, a resume too) and
its stage actors `RUN@ATTEMPT/stageK`. Nothing waits for an ended actor's name to be free: Ray keeps the name of
an actor that exited on its own for as long as handles to it exist, and a new attempt never asks for it."""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import ray

from growpipe.runtime import NAMESPACE

ATTEMPT_SEP = "@"  # never in a run name (growpipe.config.names.RUN_NAME)
STATUS_TIMEOUT_S = 10.0  # how long a live controller may take to answer status()


def controller_name(run_name: str) -> str:
    """A new name for a controller of run `run_name`: `RUN@ATTEMPT`, unique per attempt."""
    return f"{run_name}{ATTEMPT_SEP}{secrets.token_hex(4)}"


def run_of(actor_name: str) -> str | None:
    """The run a controller's actor name belongs to; None for any other name (a stage actor's included)."""
    run, sep, attempt = actor_name.rpartition(ATTEMPT_SEP)
    return run if sep and run and attempt.isalnum() else None


def stage_actor_name(controller: str, index: int, launch: int = 0) -> str:
    """The name of the stage actor of block `index` started by controller `controller` (its attempt's name, in
    the growpipe namespace): `RUN@ATTEMPT/stageK` for its first actor, `RUN@ATTEMPT/stageK.N` for the N-th after
    it (a replacement, a standby started again), so that no launch asks for the name of an actor it replaces."""
    return f"{controller}/stage{index}" + (f".{launch}" if launch else "")


def controllers(run_name: str | None = None) -> list[tuple[str, Any, dict[str, Any] | None]]:
    """The live controllers on this cluster (of run `run_name` only, when given), each as (its actor's name, its
    handle, its status: None when it did not answer within STATUS_TIMEOUT_S). A controller that has exited does
    not answer, even while Ray still knows its name."""
    named = ray.util.list_named_actors(all_namespaces=True)
    asked = []
    for entry in named:
        name = entry.get("name", "")
        run = run_of(name) if entry.get("namespace") == NAMESPACE else None
        if run is None or (run_name is not None and run != run_name):
            continue
        with contextlib.suppress(ValueError):  # gone since it was listed
            handle = ray.get_actor(name, namespace=NAMESPACE)
            asked.append((name, handle, handle.status.remote()))
    found = []
    for name, handle, ref in asked:
        try:
            status = ray.get(ref, timeout=STATUS_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            status = None  # alive (or starting), busy: counted as running
        except ray.exceptions.RayError:  # exited, or died
            continue
        found.append((name, handle, status))
    return found
