"""`growpipe serve`: check the source and the port, connect to (or start) Ray, deploy the application, then
serve until stopped, following the run when asked."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from growpipe.errors import InputError
from growpipe.serve.deploy import (
    APP,
    DeployFailed,
    ServeOptions,
    deploy,
    follow,
    port_problem,
    serve_config,
    wait_until_serving,
)
from growpipe.serve.source import Source, newest_whole


def start(source: Source, options: ServeOptions, attempts: int = 3, timeout_s: float = 300.0) -> dict[str, Any]:
    """Deploy the application on the connected Ray and wait until it answers; the served version. A run's
    checkpoint can be pruned by the run before the first replica has loaded it: then its newest whole one is
    deployed instead (up to `attempts` times)."""
    for attempt in range(attempts):
        deploy(serve_config(source, options))
        try:
            return wait_until_serving(source.ref, timeout_s)
        except DeployFailed:
            if source.run_store is None or attempt == attempts - 1:
                raise
            source = replace(source, ref=newest_whole(source.run_store))
    raise AssertionError("unreachable")


def run(source: Source, options: ServeOptions, *, follow_run: bool, address: str | None = None,
        say: Callable[[str], None] = print, stop: Callable[[], bool] = lambda: False) -> int:  # fmt: skip
    """Serve until `stop()` (or a signal): the command's body. Everything the user gave is checked before Ray
    starts (the source by `resolve`, the options and the port here)."""
    import os

    from growpipe.config import build_config
    from growpipe.runtime.pipeline import connect

    options.check()
    joining = bool(address or os.environ.get("RAY_ADDRESS"))
    if not joining and (problem := port_problem(options.host, options.port)):  # on a cluster: the head's port
        raise InputError(problem)
    owns, _ = connect(build_config({}), address, cpus=None)
    try:
        status = start(source, options)
        v = status["version"]
        url = f"http://{options.host}:{options.port}{options.route_prefix.rstrip('/')}/predict"
        say(f"serve  {url}  run {v['run'] or '-'}, {v['checkpoint']} (epoch {v['epoch']}, {v['blocks']} blocks)")
        if follow_run:
            say(f"follow run {source.run_store.run_name if source.run_store else '?'}: a new checkpoint is served "
                "once complete and whole")  # fmt: skip
            follow(source, options, say, stop=stop)
        else:
            while not stop():
                time.sleep(0.5)
        return 0
    finally:
        import ray
        from ray import serve

        if joining:  # the cluster stays; this command's application goes (asked, not waited for: a stopped
            with contextlib.suppress(Exception):  # job has seconds before it is killed)
                serve.delete(APP, _blocking=False)
        if owns:  # an embedded Ray takes Serve with it; a joined one is only disconnected from
            ray.shutdown()
