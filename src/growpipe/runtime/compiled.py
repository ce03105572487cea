"""pipeline.transport: compiled: the local-learning pipeline's stages as a Ray Compiled Graph.

One graph per topology: the source stage (stage 0 with the data, or the prefix-cache holder) reads a job from
the graph's input, every later stage takes the packet the one before returned, the last returns the batch
index. A job is a training batch (`("train", b)`) or an evaluation batch
(`("eval", split, b, side_groups, threshold, last)`), so the one graph carries both. Ray moves each packet
through a shared-memory channel (across nodes, through Ray's own channels) instead of an actor call.

A compiled graph cannot change once compiled, so growth, recovery, a prefix cache and the run's end tear it
down (`CompiledChain.drop`) and the next epoch compiles the new one. Everything else (setup, freezing,
checkpoints, statistics, the cache pass) stays an ordinary actor call, which the engine makes when every
execution it started has been read. Ray runs the graph on a thread of its own in each actor, so one call does
run beside graph steps: building a grown block packed into a stage's actor (grow.on_no_capacity: pack) while
the epoch trains.

`pipeline.window` bounds the executions in flight in the whole graph (the object-store path bounds the packets
in flight per hop). A stage's statistics count its steps, samples, losses, hops and bytes as on that path;
`blocked_s` and `max_inflight` stay 0 (no stage waits on a call to the next).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import ray

from growpipe.errors import StageError
from growpipe.loop.engine import WorkerLost

COMPILED = "compiled"

Job = tuple[Any, ...]
"""("train", batch) or ("eval", split, batch, side_groups, threshold, last): what one execution does."""


def lost(e: BaseException) -> WorkerLost:
    """A closed channel: an actor of the graph died (Ray closes every channel of the graph then)."""
    return WorkerLost(f"a stage actor died (the compiled graph's channel closed: {str(e).splitlines()[0]})")


class CompiledChain:
    """The engine's side: the compiled graph over the stage actors (None until the first epoch needs it)."""

    def __init__(self, window: int, timeout_s: float):
        self.window = window  # executions in flight, as pipeline.window bounds packets in flight
        self.timeout_s = timeout_s
        self.dag: Any = None
        self.actors: list[Any] = []
        self.compiles: list[float] = []  # seconds each compile took (the first, then one per topology change)

    def ensure(self, actors: list[Any], on_error: Callable[[BaseException], BaseException]) -> None:
        """The graph over `actors` (source first), compiled now unless it is already that one; `on_error`
        turns a Ray error of the compile (an actor died between epochs) into the one to raise."""
        if self.dag is not None and self.actors == actors:
            return
        self.drop()
        from ray.dag import InputNode  # lazy: Ray's DAG package serves this transport only

        t0 = time.perf_counter()
        last = len(actors) - 1
        with InputNode() as job:
            node = actors[0].cg_first.bind(job, last == 0)
            for i, actor in enumerate(actors[1:], 1):
                node = actor.cg_next.bind(node, i == last)
        try:
            self.dag = node.experimental_compile(_max_inflight_executions=self.window + 1)
        except ray.exceptions.RayError as e:
            raise on_error(e) from None
        self.actors = list(actors)
        self.compiles.append(time.perf_counter() - t0)

    def drop(self) -> None:
        """Tear the graph down (its actors stay); the next `ensure` compiles the topology of then."""
        dag, self.dag, self.actors = self.dag, None, []
        if dag is not None:
            with contextlib.suppress(Exception):  # a dead actor's graph: Ray tore its part down already
                dag.teardown()

    def stream(self, jobs: Iterable[Job], on_error: Callable[[BaseException], BaseException]) -> int:
        """Execute every job of `jobs`, at most `window` unread; the number executed. Each result is read
        before this returns, so ordinary calls to the stages are safe after it. `on_error` turns a failed
        execution's error into the one to raise (the rest are read first, so the graph stays usable)."""
        inflight: deque[Any] = deque()
        failure: BaseException | None = None
        n = 0

        def read_oldest() -> None:
            nonlocal failure
            try:
                ray.get(inflight.popleft(), timeout=self.timeout_s)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayChannelTimeoutError):
                raise StageError(f"a compiled pipeline step took more than runtime.stage_timeout_s="
                                 f"{self.timeout_s:g}s; raise it if steps are that slow") from None  # fmt: skip
            except ray.exceptions.RayChannelError as e:  # an actor of the graph died: no later read can succeed
                raise lost(e) from None
            except Exception as e:  # noqa: BLE001 - one batch failed; read the others, then raise the first
                failure = failure or on_error(e)

        for job in jobs:
            if failure is not None:
                break
            try:
                inflight.append(self.dag.execute(job))
            except ray.exceptions.RayChannelError as e:
                raise lost(e) from None
            n += 1
            if len(inflight) >= self.window:
                read_oldest()
        while inflight:
            read_oldest()
        if failure is not None:
            raise failure
        return n

    def describe(self) -> dict[str, Any]:
        """For the result: how many graphs were compiled and how long each took."""
        return {"backend": COMPILED, "graphs_compiled": len(self.compiles),
                "compile_s": [round(s, 4) for s in self.compiles]}  # fmt: skip
