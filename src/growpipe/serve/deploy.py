"""Deploying the growpipe Serve application and following a running job (the driver's side).

The application is deployed from a Serve config (`serve_config`, the same document `serve deploy` and a
KubeRay RayService's serveConfigV2 take): import path growpipe.serve.app:build_app, one deployment whose
user_config names the version to serve. Deploying the config again with only the user_config changed is a
lightweight update: Serve calls `reconfigure` on the running replicas, a few at a time, and restarts none.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from growpipe.checkpoint import CLAIM_TTL_S, CheckpointStore
from growpipe.errors import CheckpointError, ConfigError, PipelineError
from growpipe.serve.app import INGRESS, group_name
from growpipe.serve.follow import next_checkpoint
from growpipe.serve.source import Source

APP = "growpipe"


class DeployFailed(PipelineError):
    """Serve could not bring the application up (a replica failed to load its first net)."""


class Claims:
    """The checkpoints of a run this server holds, so the run's pruning leaves them while replicas (a slow
    first start, a restart, autoscaling) may still load them: a claim file in each (CheckpointStore.claim),
    refreshed by a thread every `refresh_s`, withdrawn on release and at close. A server killed before it
    withdraws them stops holding at once on this machine (its process is gone), elsewhere after CLAIM_TTL_S."""

    def __init__(self, store: CheckpointStore, refresh_s: float = CLAIM_TTL_S / 4):
        self.store, self.holder = store, uuid.uuid4().hex
        self.held: set[str] = set()
        self._lock = threading.Lock()  # a refresh never rewrites a claim just released
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._refresh, args=(refresh_s,), daemon=True, name="growpipe-claims")
        self._thread.start()

    def hold(self, path: str) -> bool:
        """Claim checkpoint `path`; whether it is held (False: the run removed it first)."""
        with self._lock:
            if path in self.held:
                return True
            if held := self.store.claim(path, self.holder):
                self.held.add(path)
            return held

    def release(self, path: str) -> None:
        with self._lock:
            self.held.discard(path)
            self.store.unclaim(path, self.holder)

    def keep_only(self, path: str) -> None:
        """Release every held checkpoint but `path`."""
        for other in sorted(self.held - {path}):
            self.release(other)

    def _refresh(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            with self._lock:
                for path in sorted(self.held):
                    self.store.claim(path, self.holder, check=False)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
        for path in sorted(self.held):
            self.release(path)

    def __enter__(self) -> Claims:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ServeOptions:
    """Where the HTTP API listens and how many replicas answer (a fixed count, or autoscaling between two)."""

    host: str = "127.0.0.1"
    port: int = 8000
    min_replicas: int = 1
    max_replicas: int = 1
    cpus_per_replica: float = 1.0
    route_prefix: str = "/"
    stages: int = 1
    """Block groups: 1 serves the whole net in each replica; S > 1 one deployment per group, chained."""

    def check(self) -> None:
        """ConfigError naming the option when one is out of range."""
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"--port: {self.port} is not a TCP port (1-65535)")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ConfigError(f"--replicas: {self.min_replicas}-{self.max_replicas} is not MIN-MAX, 1 <= MIN <= MAX")
        if self.cpus_per_replica <= 0:
            raise ConfigError(f"--cpus: {self.cpus_per_replica} must be > 0")
        if self.stages < 1:
            raise ConfigError(f"--stages: {self.stages} must be >= 1 (1: the whole net in each replica)")


def port_problem(host: str, port: int) -> str | None:
    """Why Serve could not listen on host:port (in use, or an address this machine lacks); None when free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            what = "is in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror})"
            return f"--port: {host}:{port} {what}; choose another port with --port N (or --host)"
    return None


def serve_config(source: Source, options: ServeOptions) -> dict[str, Any]:
    """The Serve config of the application serving `source`: the ingress and, with stages > 1, one deployment
    per block group, each with the same user_config (the version) and replica settings."""
    replicas: dict[str, Any] = {"num_replicas": options.min_replicas}
    if options.min_replicas != options.max_replicas:
        replicas = {"autoscaling_config": {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                                           "target_ongoing_requests": 4}}  # fmt: skip
    names = [INGRESS] + ([group_name(i) for i in range(options.stages)] if options.stages > 1 else [])
    deployments = [{"name": name, "user_config": source.user_config(), **replicas,
                    "ray_actor_options": {"num_cpus": options.cpus_per_replica}} for name in names]  # fmt: skip
    return {
        "proxy_location": "HeadOnly",
        "logging_config": {"log_level": "WARNING"},  # Serve's own INFO lines (deploying, adding replicas) are not news
        "http_options": {"host": options.host, "port": options.port},
        "applications": [{"name": APP, "route_prefix": options.route_prefix,
                          "import_path": "growpipe.serve.app:build_app", "args": {"stages": options.stages},
                          "deployments": deployments}],
    }  # fmt: skip


def deploy(config: dict[str, Any]) -> None:
    """Apply a Serve config on the connected Ray cluster (what `serve run CONFIG` does: start Serve with its
    HTTP options, then hand the applications to the Serve controller)."""
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "connecting to Serve" lines
    schema = ServeDeploySchema.model_validate(config)
    client = serve_start(http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location,
                         global_logging_config=schema.logging_config)  # fmt: skip
    client.deploy_apps(schema)


def replica_status() -> dict[str, Any]:
    """What a replica of the application serves: {source, version, refused}."""
    from ray import serve

    response = serve.get_deployment_handle(INGRESS, APP).status.remote()
    try:
        return response.result(timeout_s=60)
    except BaseException:  # a stop (SIGTERM, Ctrl-C) while it waits: nothing is left in flight for the shutdown
        response.cancel()
        raise


def wait_until_serving(source: str, timeout_s: float = 300.0, poll_s: float = 0.2) -> dict[str, Any]:
    """Block until the application is RUNNING and its replicas serve `source` (or refused it); the status."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(APP)
        if app is not None and app.status == "DEPLOY_FAILED":
            raise DeployFailed(f"serve: the application failed to deploy: {app.message.strip()[:500]}")
        if app is not None and app.status == "RUNNING":
            status = replica_status()
            if status["source"] == source or source in status["refused"]:
                return status
        if time.monotonic() > deadline:
            state = app.status if app is not None else "not deployed"
            raise PipelineError(f"serve: no replica served {source} within {timeout_s:.0f} s (the application is "
                                f"{state}: replicas waiting for CPUs, or a slow load; compare --cpus x --replicas "
                                "with the cluster's free CPUs)")  # fmt: skip
        time.sleep(poll_s)


def follow(source: Source, options: ServeOptions, say: Callable[[str], None] = print, poll_s: float = 1.0,
           stop: Callable[[], bool] = lambda: False, claims: Claims | None = None) -> None:  # fmt: skip
    """Serve the run's newest whole checkpoint until `stop()`: each new complete checkpoint is held (`claims`,
    else claims of its own), checked (every shard's hash) and deployed as the new user_config; one the run
    pruned before it was held, a damaged one, or one the replicas refuse is skipped with a line, the served
    version stays. The served version stays held until the next one is served."""
    store = source.run_store
    assert store is not None
    mine = claims is None
    claims = claims or Claims(store)
    serving, refused = source.ref, set[str]()
    claims.hold(serving)
    try:
        while not stop():
            candidate = next_checkpoint([c.path for c in store.complete()], serving, refused)
            if candidate is None:
                time.sleep(poll_s)
                continue
            name, served = candidate.rpartition("/")[2], serving.rpartition("/")[2]
            if not claims.hold(candidate):
                refused.add(candidate)
                say(f"skip   {name}: pruned by the run before it could be held; still serving {served}")
                continue
            try:
                store.verify(candidate)
            except CheckpointError as e:
                refused.add(candidate)
                claims.release(candidate)
                say(f"skip   {e}; still serving {served}")
                continue
            t0 = time.perf_counter()
            deploy(serve_config(Source(source.kind, candidate, source.tracking_uri, store), options))
            status = wait_until_serving(candidate)
            if candidate in status["refused"]:
                refused.add(candidate)
                say(f"skip   {name}: {status['refused'][candidate]}; still serving {served}")
                deploy(serve_config(Source(source.kind, serving, source.tracking_uri, store), options))
                claims.release(candidate)
                continue
            claims.release(serving)
            serving = candidate
            v = status["version"]
            say(f"serve  {v['checkpoint']} (epoch {v['epoch']}, {v['blocks']} blocks) in "
                f"{time.perf_counter() - t0:.2f} s")  # fmt: skip
    finally:
        if mine:
            claims.close()
