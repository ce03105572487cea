"""`growpipe serve`: check the source and the port, connect to (or start) Ray, deploy the application, then
serve until stopped, following the run when asked."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray
from ray import serve

from growpipe import signals
from growpipe.config import build_config
from growpipe.errors import InputError
from growpipe.quiet import drop_serve_teardown
from growpipe.runtime.pipeline import connect
from growpipe.serve.deploy import (
    APP,
    Claims,
    DeployFailed,
    ServeOptions,
    deploy,
    follow,
    port_problem,
    serve_config,
    wait_until_serving,
)
from growpipe.serve.source import Source, newest_whole


def start(source: Source, options: ServeOptions, attempts: int = 3, timeout_s: float = 300.0,
          claims: Claims | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Deploy the application on the connected Ray and wait until it answers; the served version. With
    `claims`, a run's checkpoint is held before it is deployed, so the run cannot prune it while the replicas
    start: the one `source` names, or when the run pruned it already, its newest whole one. Without, a
    checkpoint pruned before the first replica loaded it is replaced by the newest whole one (up to
    `attempts` times)."""
    for attempt in range(attempts):
        if claims is not None and source.run_store is not None and (attempt or not claims.hold(source.ref)):
            source = replace(source, ref=newest_whole(source.run_store, claims, say))
        deploy(serve_config(source, options))
        try:
            status = wait_until_serving(source.ref, timeout_s)
        except DeployFailed:
            if source.run_store is None or attempt == attempts - 1:
                raise
            if claims is None:
                source = replace(source, ref=newest_whole(source.run_store))
            continue
        if claims is not None:
            claims.keep_only(status["source"])
        return status
    raise AssertionError("unreachable")


def run(source: Source, options: ServeOptions, *, follow_run: bool, address: str | None = None,
        say: Callable[[str], None] = print, stop: threading.Event | None = None) -> int:  # fmt: skip
    """Serve until `stop` is set (or a signal): the command's body. Everything the user gave is checked before Ray
    starts (the source by `resolve`, the options and the port here)."""
    stop = stop or threading.Event()
    options.check()
    joining = bool(address or os.environ.get("RAY_ADDRESS"))
    if not joining and (problem := port_problem(options.host, options.port)):  # on a cluster: the head's port
        raise InputError(problem)
    owns, _ = connect(build_config({}), address, cpus=None)
    claims = Claims(source.run_store) if source.run_store is not None else None  # what the replicas load stays
    try:
        status = start(source, options, claims=claims, say=say)
        v = status["version"]
        url = f"http://{options.host}:{options.port}{options.route_prefix.rstrip('/')}/predict"
        say(f"serve  {url}  run {v['run'] or '-'}, {v['checkpoint']} (epoch {v['epoch']}, {v['blocks']} blocks)")
        if follow_run:
            say(f"follow run {source.run_store.run_name if source.run_store else '?'}: a new checkpoint is served "
                "once complete and whole")  # fmt: skip
            follow(replace(source, ref=status["source"]), options, say, stop=stop.is_set, claims=claims)
        else:
            signals.check()  # a stop whose KeyboardInterrupt was swallowed before this wait
            stop.wait()  # a signal's KeyboardInterrupt ends the wait: the handler runs in this (main) thread
        return 0
    finally:
        if claims is not None:
            claims.close()

        if joining:  # the cluster stays; this command's application goes (asked, not waited for: a stopped
            with contextlib.suppress(Exception):  # job has seconds before it is killed)
                serve.delete(APP, _blocking=False)
        if owns:  # an embedded Ray takes Serve with it; a joined one is only disconnected from
            # a Serve handle still polling would start a new local Ray (ray.init from its thread) after this
            ray._private.auto_init_hook.enable_auto_connect = False
            drop_serve_teardown()
            ray.shutdown()
