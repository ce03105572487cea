"""Probe Ray Compiled Graphs (Ray 2.60, beta) against the object-ref path for growpipe's stage hand-offs (issue 40).

Two and three Ray actors (1 CPU each), each holding one growpipe SCPL MLP block (w -> w -> w, built with
build_config and build_block as bench/pipeline.py does, so every block costs the same). Stage 0 holds its batch
itself (as growpipe's stage 0 holds the data): what enters the chain is the batch index. Cases: `noop` (the steps
only pass the packets on, at their real size: the overhead alone), and blocks whose train_step takes about 5 ms
and 20 ms (the width calibrated at the start). Arms, --window batches in flight (growpipe's pipeline.window):

  objref           the driver chains `a.source.remote(i)` -> `b.step.remote(ref)` -> ...
  push             stage 0 calls `b.sink.remote(packet)` itself: growpipe's path today (runtime/stage.py)
  compiled         the same chain as a Compiled Graph (`InputNode`, `bind`, `experimental_compile`: shared-memory
                   channels on one node, `_max_inflight_executions`), executed by the driver
  compiled_owner   the same, compiled and executed by an actor (0 CPUs, threaded: growpipe's Controller)
  compiled_stage0  stage 0 compiles the stages after it and feeds the graph its output packets
In the noop case also one batch at a time (window 1) through 2 and 3 actors, objref and compiled: the per-hop
overhead is what the third actor adds, (3-actor - 2-actor) ms per batch. Then:

  (c) compile a 2-actor graph, run it, tear it down, compile the 3-actor one (a growth), run it, tear it down
  (d) ordinary calls to a compiled actor: the graph idle, between executions, during one (a gated step); a
      second graph over the same actors; the actors' CPU use while their graph waits for input
  (e) an exception inside a compiled method (first, last stage); the last actor killed, a new graph over the
      survivor and another actor (a recovery)

Figures are medians of --repeats interleaved repeats (each repeat starts one arm later) with [min-max]; the
answers of (d) and (e) are what happened, as booleans and error strings. Ray is started here with
`ray.init(address="local", num_cpus=4, include_dashboard=False)` and shut down at the end; every wait has a
deadline. Run with PYTHONPATH=src:

    PYTHONPATH=src .venv/bin/python bench/compiled_probe.py --json-out /tmp/compiled_probe.json   # ~10 min loaded
    PYTHONPATH=src .venv/bin/python bench/compiled_probe.py --quick   # noop and width 128, 20 batches, 1 repeat
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
import torch
from ray.dag import InputNode

from growpipe.config import build_config
from growpipe.fsutil import atomic_write_json
from growpipe.nn.block import Block
from growpipe.nn.methods import build_block
from growpipe.nn.net import plan_blocks
from growpipe.nn.packet import Packet
from growpipe.nn.specs import InputInfo

BATCH = 64
CLASSES = 10
WAIT_S = 30.0  # the deadline of every wait on Ray (a step is milliseconds: 30 s means stuck)
GATE_S = 15.0  # how long a gated step waits for its release before giving up (no hang if calls cannot reach it)


# ---- the blocks ----------------------------------------------------------------------------------------
def make_block(width: int, index: int) -> Block:
    """Block `index` of an SCPL MLP whose every block maps width -> width (2 layers) on `width` inputs."""
    cfg = build_config(
        {
            "name": f"compiled-probe-{width}",
            "method": "scpl",
            "seed": 0,
            "threads": 1,
            "data": {"name": "fashion-mnist", "batch_size": BATCH},
            "net": {"backbone": "mlp", "blocks": 3, "widths": [width] * 3, "layers_per_block": 2},
            "scpl": {"projector": "linear", "proj_dim": 128},
            "tracking": {"mlflow": False},
            "checkpoint": {"enabled": False},
        }
    )
    info = InputInfo(shape=(width,), dtype="float", num_classes=CLASSES)
    return build_block(cfg.rule(), plan_blocks(cfg.net, cfg.rule(), info)[index], info)


def step_ms(width: int, steps: int = 10) -> float:
    """Median milliseconds of one train_step of a middle block of `width`, 1 torch thread, in this process."""
    torch.set_num_threads(1)
    block = make_block(width, 1)
    x, y = torch.randn(BATCH, width), torch.arange(BATCH) % CLASSES
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        block.train_step(Packet(x=x, y=y, index=i))
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[2:])


def calibrate(target_ms: float) -> tuple[int, float]:
    """A width (a multiple of 64) whose block step takes about target_ms here, and that step's ms."""
    width, ms = 256, step_ms(256)
    for _ in range(6):
        if abs(ms - target_ms) <= 0.15 * target_ms:
            break
        width = max(64, round(width * (target_ms / ms) ** 0.5 / 64) * 64)
        ms = step_ms(width)
    return width, ms


# ---- the stage actor -----------------------------------------------------------------------------------
class ProbeStage:
    """One block in an actor. `source` (stage 0: makes its own batch), `step` (trains, hands the output
    on) and `sink` (the last stage: trains, returns the batch index) are the per-batch methods; the rest are
    control calls, as growpipe's stages have (`request_pause` in a concurrency group of its own, as there)."""

    def __init__(self, index: int):
        torch.set_num_threads(1)
        self.index = index
        self.compute = False
        self.block: Block | None = None
        self.x = self.y = torch.zeros(0)
        self.busy_s = 0.0
        self.calls = 0
        self.fail_at = -1
        self.gate_at = -1
        self.in_step = False
        self.gated = threading.Event()
        self.release = threading.Event()
        self.pause_asked = False

    def configure(self, width: int, compute: bool) -> int:
        """A fresh block of `width` and stage 0's batch; `compute` False: the steps only pass the packets on.
        Returns this process's nice value (Ray runs its workers niced)."""
        self.block = make_block(width, min(self.index, 2))
        self.x = torch.randn(BATCH, width, generator=torch.Generator().manual_seed(self.index))
        self.y = torch.arange(BATCH) % CLASSES
        self.compute = compute
        return os.nice(0)

    def source(self, i: int) -> Packet:
        """Stage 0: batch `i` of its own data, trained on; the output packet."""
        return self._train(Packet(x=self.x, y=self.y, index=i))

    def step(self, p: Packet) -> Packet:
        """A middle stage: train on `p`, hand the output on."""
        return self._train(p)

    def sink(self, p: Packet) -> int:
        """The last stage: train on `p`; only the batch index goes back."""
        return self._train(p).index

    def push_stream(self, downstream: Any, first: int, n: int, window: int) -> float:
        """growpipe's object-ref path (runtime/stage.py): stage 0 trains batches first..first+n-1 and hands each
        output to the next stage itself (`sink.remote`), at most `window` unanswered; the seconds it took."""
        return stream(lambda i: downstream.sink.remote(self.source(i)), first, n, window)

    def compiled_push_stream(self, rest: list[Any], first: int, n: int, window: int, warm: int) -> dict[str, float]:
        """Stage 0 owns a compiled graph of the stages after it and feeds it its outputs (the graph's input is the
        packet): warm-up batches, then batches first..first+n-1 timed; seconds and the compile's seconds."""
        logging.getLogger("ray.dag").setLevel(logging.WARNING)
        t0 = time.perf_counter()
        dag = compile_chain(rest, window, tail=True)
        compile_s = time.perf_counter() - t0
        try:
            submit = lambda i: dag.execute(self.source(i))  # noqa: E731
            stream(submit, first - warm, warm, window)
            self.reset()
            ray.get([x.reset.remote() for x in rest], timeout=WAIT_S)
            seconds = stream(submit, first, n, window)
        finally:
            dag.teardown()
        return {"seconds": seconds, "compile_s": compile_s}

    def _train(self, p: Packet) -> Packet:
        self.in_step = True
        t0 = time.perf_counter()
        try:
            self.calls += 1
            if p.index == self.fail_at:
                raise ValueError(f"probe stage {self.index}: injected failure at batch {p.index}")
            if p.index == self.gate_at:
                self.gated.set()
                self.release.wait(GATE_S)
            if self.compute and self.block is not None:
                out, _ = self.block.train_step(p)
                return out
            return Packet(x=p.x, y=p.y, index=p.index)  # no compute: the same tensors travel on
        finally:
            self.busy_s += time.perf_counter() - t0
            self.in_step = False

    # ---- control calls --------------------------------------------------------------------------------
    def reset(self) -> None:
        self.busy_s, self.calls, self.fail_at, self.gate_at = 0.0, 0, -1, -1
        self.gated.clear()
        self.release.clear()

    def stats(self) -> dict[str, Any]:
        return {"busy_s": self.busy_s, "calls": self.calls}

    def checksum(self) -> tuple[str, bool]:
        """The block's weights' SHA-256, and whether a per-batch method was running meanwhile."""
        return self._block().checksum(), self.in_step

    def save_bytes(self) -> int:
        """What a checkpoint's shard copies: the block's state, in bytes."""
        buf = io.BytesIO()
        torch.save(self._block().state_dict(), buf)
        return buf.tell()

    def freeze(self) -> bool:
        self._block().freeze()
        return bool(self._block().frozen)

    def _block(self) -> Block:
        if self.block is None:
            raise RuntimeError(f"probe stage {self.index}: configure was not called")
        return self.block

    def set_fail(self, i: int) -> None:
        self.fail_at = i

    def set_gate(self, i: int) -> None:
        self.gate_at = i
        self.gated.clear()
        self.release.clear()

    def gate_reached(self) -> bool:
        return self.gated.is_set()

    def open_gate(self) -> None:
        self.release.set()

    @ray.method(concurrency_group="control")
    def request_pause(self) -> bool:
        """As growpipe's Stage.request_pause: answered in its own concurrency group; whether a step ran."""
        self.pause_asked = True
        return self.in_step

    def cpu_s(self) -> float:
        """CPU seconds this process used so far (all its threads)."""
        t = os.times()
        return t.user + t.system


def launch(index: int) -> Any:
    """A ProbeStage actor with 1 CPU, concurrency groups as growpipe's Stage (max_concurrency 1 otherwise)."""
    cls = ray.remote(concurrency_groups={"control": 1})(ProbeStage)
    return cls.options(num_cpus=1, max_concurrency=1).remote(index)


def configure(actors: list[Any], width: int, compute: bool) -> list[int]:
    """Give every actor a fresh block of `width`; their nice values."""
    return ray.get([a.configure.remote(width, compute) for a in actors], timeout=120)


# ---- the two paths -------------------------------------------------------------------------------------
def chain_refs(actors: list[Any], i: int) -> Any:
    """Batch i through the actors by ordinary calls: the driver passes each ref on."""
    ref = actors[0].source.remote(i)
    for a in actors[1:-1]:
        ref = a.step.remote(ref)
    return actors[-1].sink.remote(ref)


def compile_chain(actors: list[Any], window: int, tail: bool = False) -> Any:
    """The actors' chain as a compiled graph, `window` executions in flight (shared-memory channels on one node).
    Its input is a batch index for actors[0].source, or with `tail` a packet for actors[0].step."""
    with InputNode() as inp:
        node = inp if tail else actors[0].source.bind(inp)
        for a in actors[0 if tail else 1 : -1]:
            node = a.step.bind(node)
        dag = actors[-1].sink.bind(node)
    return dag.experimental_compile(_max_inflight_executions=window + 1)


def stream(submit: Callable[[int], Any], first: int, n: int, window: int) -> float:
    """Submit batches first..first+n-1, at most `window` unanswered; seconds until all are answered."""
    inflight: deque[tuple[int, Any]] = deque()
    t0 = time.perf_counter()
    for i in range(first, first + n):
        inflight.append((i, submit(i)))
        if len(inflight) >= window:
            expect(*inflight.popleft())
    while inflight:
        expect(*inflight.popleft())
    return time.perf_counter() - t0


def expect(i: int, ref: Any) -> None:
    got = ray.get(ref, timeout=WAIT_S)
    if got != i:
        raise RuntimeError(f"batch {i} came back as {got}")


def run_arm(actors: list[Any], path: str, batches: int, window: int, warm: int) -> dict[str, float]:
    """One measurement from this process: warm-up batches, then `batches` timed (see `figures`); the caller's CPU
    seconds per second (a compiled graph's caller polls its output channel)."""
    ray.get([a.reset.remote() for a in actors], timeout=WAIT_S)
    dag, out = None, {}
    if path == "push":
        return run_push(actors, batches, window, warm)
    if path == "compiled_stage0":
        timing = get(actors[0].compiled_push_stream.remote(actors[1:], warm, batches, window, warm), WAIT_S + batches)
        return {"compile_s": timing["compile_s"], **figures(actors, batches, timing["seconds"], 0.0)}
    if path == "compiled":
        t0 = time.perf_counter()
        dag = compile_chain(actors, window)
        out["compile_s"] = time.perf_counter() - t0
        submit: Callable[[int], Any] = dag.execute
    else:
        submit = lambda i: chain_refs(actors, i)  # noqa: E731
    try:
        stream(submit, 0, warm, window)
        ray.get([a.reset.remote() for a in actors], timeout=WAIT_S)
        cpu0 = os.times()
        seconds = stream(submit, warm, batches, window)
        cpu1 = os.times()
    finally:
        if dag is not None:
            dag.teardown()
    return out | figures(actors, batches, seconds, (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / seconds)


def run_push(actors: list[Any], batches: int, window: int, warm: int) -> dict[str, float]:
    """The push arm (2 actors): stage 0 streams and hands on by itself; the driver only waits."""
    a, b = actors
    get(a.push_stream.remote(b, 0, warm, window), WAIT_S + warm)
    get([x.reset.remote() for x in actors])
    seconds = get(a.push_stream.remote(b, warm, batches, window), WAIT_S + batches)
    return figures(actors, batches, seconds, 0.0)


def figures(actors: list[Any], batches: int, seconds: float, caller_cpu_per_s: float) -> dict[str, float]:
    """ms per batch, samples/s, the stages' mean step ms (the busiest) and what a batch costs beyond it."""
    stats = get([a.stats.remote() for a in actors])
    busiest = max(s["busy_s"] / max(1, s["calls"]) * 1000 for s in stats)
    return {"ms_per_batch": 1000 * seconds / batches, "samples_per_second": batches * BATCH / seconds,
            "busiest_stage_ms": busiest, "overhead_ms_per_batch": 1000 * seconds / batches - busiest,
            "caller_cpu_per_s": caller_cpu_per_s}  # fmt: skip


class GraphOwner:
    """Stands in for growpipe's Controller actor (0 CPUs, threaded): compiles the stages' graph and drives it."""

    def __init__(self) -> None:
        logging.getLogger("ray.dag").setLevel(logging.WARNING)

    def run(self, actors: list[Any], batches: int, window: int, warm: int) -> dict[str, float]:
        return run_arm(actors, "compiled", batches, window, warm)


ARMS = {"objref": "driver chains ordinary calls", "push": "stage 0 calls the next stage itself (growpipe today)",
        "compiled": "compiled graph driven by the driver",
        "compiled_owner": "compiled graph driven by an actor (as growpipe's Controller would)",
        "compiled_stage0": "stage 0 owns a compiled graph of the stages after it and feeds it"}  # fmt: skip


def measure_arm(actors: list[Any], owner: Any, path: str, batches: int, window: int) -> dict[str, float]:
    warm = max(5, batches // 10)
    if path == "compiled_owner":
        return ray.get(owner.run.remote(actors, batches, window, warm), timeout=WAIT_S + batches * 5)
    return run_arm(actors, path, batches, window, warm)


def arms_of(case: str) -> list[tuple[str, int, int]]:
    """(path, actors, window: 0 the default) of every arm a case measures; noop adds one-at-a-time latencies."""
    arms = [(p, 2, 0) for p in ARMS]
    if case == "noop":
        arms += [(p, k, 1) for p in ("objref", "compiled") for k in (2, 3)]
    return arms


def arm_key(path: str, k: int, window: int) -> str:
    return f"{path}_{k}" + ("_w1" if window == 1 else "")


def measure_case(actors: list[Any], owner: Any, case: str, width: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every arm of one case, args.repeats times, interleaved (each repeat starts one arm later)."""
    nice = configure(actors, width, case != "noop")
    arms = arms_of(case)
    runs = []
    for r in range(args.repeats):
        run = {}
        for path, k, w in arms[r % len(arms) :] + arms[: r % len(arms)]:
            run[arm_key(path, k, w)] = measure_arm(actors[:k], owner, path, args.batches, w or args.window)
        runs.append(run)
        print(f"   {case} repeat {r + 1}/{args.repeats}: " + "  ".join(f"{key} {fig['ms_per_batch']:.2f}"
              for key, fig in run.items()) + " ms/batch", flush=True)  # fmt: skip
    keys = [arm_key(*arm) for arm in arms]
    figures = {key: {name: spread([run[key][name] for run in runs]) for name in runs[0][key]} for key in keys}
    out: dict[str, Any] = {"width": width, "packet_kb": BATCH * width * 4 / 1024, "actor_nice": nice,
                           "figures": figures, "runs": runs}  # fmt: skip
    if case == "noop":
        hop = {p: [run[f"{p}_3_w1"]["ms_per_batch"] - run[f"{p}_2_w1"]["ms_per_batch"] for run in runs]
               for p in ("objref", "compiled")}  # fmt: skip
        out["per_hop_ms"] = {p: spread(v) for p, v in hop.items()}
        out["latency_per_transfer_ms"] = {p: figures[f"{p}_2_w1"]["ms_per_batch"]["median"] / 3
                                          for p in ("objref", "compiled")}  # fmt: skip
    return out


def spread(values: list[float]) -> dict[str, float | int]:
    """{median, min, max, n} of the values."""
    s = sorted(values)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "n": len(s)}


# ---- (c) recompiling after a growth --------------------------------------------------------------------
RECOMPILE = ("compile_2_s", "first_batches_2_s", "teardown_2_s", "compile_3_s", "first_batches_3_s",
             "teardown_3_s", "recompile_s")  # fmt: skip


def measure_recompile(actors: list[Any], width: int, window: int, repeats: int) -> dict[str, Any]:
    """Compile a 2-actor graph, run 3 batches, tear it down and compile the 3-actor one (the third actor is
    already running, as a standby is), run 3 batches, tear it down: `repeats` times, seconds of each step.
    recompile_s, what a growth costs: the 2-actor teardown plus the 3-actor compile."""
    configure(actors, width, False)
    rows: list[dict[str, float]] = []
    for _ in range(repeats):
        row: dict[str, float] = {}
        for k in (2, 3):
            t0 = time.perf_counter()
            dag = compile_chain(actors[:k], window)
            t1 = time.perf_counter()
            stream(dag.execute, 0, 3, window)
            t2 = time.perf_counter()
            dag.teardown()
            t3 = time.perf_counter()
            row |= {f"compile_{k}_s": t1 - t0, f"first_batches_{k}_s": t2 - t1, f"teardown_{k}_s": t3 - t2}
        row["recompile_s"] = row["teardown_2_s"] + row["compile_3_s"]
        rows.append(row)
    return {"runs": rows, **{n: spread([r[n] for r in rows]) for n in RECOMPILE}}


# ---- (d) control calls ----------------------------------------------------------------------------------
def attempt(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, fn()) or (False, the error's type and first line)."""
    try:
        return True, fn()
    except Exception as e:  # the probe records every failure as an answer
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def timed(fn: Callable[[], Any]) -> tuple[bool, Any, float]:
    t0 = time.perf_counter()
    ok, value = attempt(fn)
    return ok, value, 1000 * (time.perf_counter() - t0)


def get(ref: Any, timeout: float = 10.0) -> Any:
    return ray.get(ref, timeout=timeout)


def probe_control(actors: list[Any], window: int, idle_s: float, stuck_s: float) -> dict[str, Any]:
    """(d): which calls a compiled actor answers: with the graph idle, between executions, during one; and what
    a second graph over the same actors does."""
    a, b = actors[:2]
    configure([a, b], 128, True)
    before = get(a.checksum.remote())[0]
    dag = compile_chain([a, b], window)
    out: dict[str, Any] = {}
    ok, val, ms = timed(lambda: get(a.checksum.remote()))
    out["idle_checksum"] = {"answered": ok, "ms": ms, "error": None if ok else val}
    out["idle_cpu_per_s"] = {"compiled": idle_cpu([a, b], idle_s)}
    out["between"] = between_executions(dag, a, before, window)
    out["during"] = during_execution(dag, a, window)
    out["second_graph_while_compiled"] = second_graph(dag, a, b, window, stuck_s)  # tears `dag` down
    ok, val, ms = timed(lambda: get(a.checksum.remote()))
    out["after_teardown_checksum"] = {"answered": ok, "ms": ms}
    out["idle_cpu_per_s"]["no_graph"] = idle_cpu([a, b], idle_s)
    return out


def idle_cpu(actors: list[Any], seconds: float) -> list[float]:
    """CPU seconds per wall second each actor process used over `seconds` with nothing to do."""
    start = get([x.cpu_s.remote() for x in actors])
    time.sleep(seconds)
    end = get([x.cpu_s.remote() for x in actors])
    return [round((e - s) / seconds, 3) for s, e in zip(start, end, strict=True)]


def between_executions(dag: Any, a: Any, before: str, window: int) -> dict[str, Any]:
    """Every result taken: the control calls growpipe makes between epochs, then executions again."""
    stream(dag.execute, 0, 5, window)
    ok1, sum1, ms1 = timed(lambda: get(a.checksum.remote())[0])
    ok2, size, ms2 = timed(lambda: get(a.save_bytes.remote()))
    ok3, frozen, ms3 = timed(lambda: get(a.freeze.remote()))
    ok4, after, _ = timed(lambda: stream(dag.execute, 5, 5, window))
    ok5, sum2, _ = timed(lambda: get(a.checksum.remote())[0])
    errors = [v for ok, v in ((ok1, sum1), (ok2, size), (ok3, frozen), (ok4, after), (ok5, sum2)) if not ok]
    return {"checksum": ok1, "checksum_ms": ms1, "trained_before": ok1 and sum1 != before, "save_state": ok2,
            "save_ms": ms2, "freeze": ok3 and frozen is True, "freeze_ms": ms3, "executes_after": ok4,
            "frozen_block_bit_identical_after": ok5 and sum2 == sum1, "errors": errors}  # fmt: skip


def during_execution(dag: Any, a: Any, window: int) -> dict[str, Any]:
    """Hold batch 100 inside stage 0's compiled step (a gate) and call the actor meanwhile."""
    get(a.set_gate.remote(100))
    ref = dag.execute(100)
    deadline, reached, err = time.monotonic() + 10, False, None
    while time.monotonic() < deadline and not reached:
        ok, got = attempt(lambda: get(a.gate_reached.remote(), 5))
        reached, err = ok and bool(got), None if ok else got
        time.sleep(0.02)
    ok1, val1, ms1 = timed(lambda: get(a.checksum.remote(), 5))
    ok2, val2, ms2 = timed(lambda: get(a.request_pause.remote(), 5))
    ok3, _, _ = timed(lambda: get(a.open_gate.remote(), 5))
    ok4, val4, _ = timed(lambda: get(ref, GATE_S + WAIT_S))
    get(a.set_gate.remote(-1))
    return {"gate_seen_by_an_ordinary_call": reached, "poll_error": err,
            "checksum": ok1, "checksum_ms": ms1, "checksum_ran_during_the_step": ok1 and bool(val1[1]),
            "request_pause_control_group": ok2, "request_pause_ms": ms2, "pause_ran_during_the_step": ok2 and val2,
            "release_call": ok3, "held_batch_completed": ok4 and val4 == 100}  # fmt: skip


def second_graph(dag: Any, a: Any, b: Any, window: int, stuck_s: float) -> dict[str, Any]:
    """Compile another graph (say, evaluation) over the same actors while `dag` is compiled, execute it; then tear
    `dag` down (first: the other order hangs, the new graph's loop waits behind the old one's) and execute again."""
    t0 = time.perf_counter()
    ok, new = attempt(lambda: compile_chain([a, b], window))
    out: dict[str, Any] = {"compiles": ok, "compile_s": time.perf_counter() - t0, "error": None if ok else new}
    if ok:
        ok2, err = attempt(lambda: get(new.execute(200), stuck_s))
        out |= {"executes_while_first_compiled": ok2, "execute_error": None if ok2 else err}
    dag.teardown()
    if ok:
        ok3, got = attempt(lambda: get(new.execute(201), WAIT_S))
        out |= {"executes_after_first_torn_down": ok3 and got == 201, "after_error": None if ok3 else got}
        new.teardown()
    return out


# ---- (e) failures --------------------------------------------------------------------------------------
def error_summary(e: BaseException) -> dict[str, Any]:
    """What the caller of ray.get sees of a failure."""
    cause = getattr(e, "cause", None)
    text = str(e).strip()
    return {"type": type(e).__name__, "is_RayTaskError": isinstance(e, ray.exceptions.RayTaskError),
            "is_the_raised_ValueError": isinstance(e, ValueError), "cause": type(cause).__name__ if cause else None,
            "names_the_stage": "probe stage" in text,
            "first_line": text.splitlines()[0][:200] if text else ""}  # fmt: skip


def probe_failures(actors: list[Any], window: int) -> dict[str, Any]:
    """(e): an exception in stage 0 and in the last stage, then the last actor killed, under a compiled graph.
    Kills actors[1]; actors[2] stands in for its replacement."""
    a, b, c = actors
    configure(actors, 128, False)
    dag = compile_chain([a, b], window)
    out: dict[str, Any] = {}
    for name, actor, at in (("exception_in_first", a, 3), ("exception_in_last", b, 13)):
        get([a.reset.remote(), b.reset.remote()])
        get(actor.set_fail.remote(at))
        out[name] = failed_batch(dag, at)
        ok, err = attempt(lambda at=at: stream(dag.execute, 20 + at, 5, window))
        out[name] |= {"graph_survives": ok, "after_error": None if ok else err,
                      "last_stage_calls": get(b.stats.remote())["calls"]}  # fmt: skip
    out["actor_killed"] = killed_actor(dag, a, b, c, window)
    return out


def failed_batch(dag: Any, at: int) -> dict[str, Any]:
    """Batches at-1, at, at+1 in flight, batch `at` failing: what each get says."""
    refs = [(i, dag.execute(i)) for i in range(at - 1, at + 2)]
    row: dict[str, Any] = {"failed_batch_raises": False, "other_batches_ok": True}
    for i, ref in refs:
        try:
            row["other_batches_ok"] &= get(ref, WAIT_S) == i
        except Exception as e:  # the failure the caller sees, recorded
            if i == at:
                row |= {"failed_batch_raises": True, "error": error_summary(e)}
            else:
                row["other_batches_ok"] = False
                row.setdefault("other_errors", []).append(error_summary(e))
    return row


def killed_actor(dag: Any, a: Any, b: Any, c: Any, window: int) -> dict[str, Any]:
    """Kill the last actor under the compiled graph: what execute / get say, whether teardown returns, and whether
    a new graph over the survivor and a replacement compiles and runs (growpipe's recovery)."""
    ray.kill(b, no_restart=True)
    logging.getLogger("ray.dag").setLevel(logging.CRITICAL)  # the teardown logs the dead actor's error in full
    time.sleep(1.0)
    ok, err = attempt(lambda: get(dag.execute(300), WAIT_S))
    ok2, err2 = attempt(lambda: get(dag.execute(301), WAIT_S))
    t0 = time.perf_counter()
    ok3, err3 = attempt(dag.teardown)
    teardown_s = time.perf_counter() - t0
    logging.getLogger("ray.dag").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    ok4, new = attempt(lambda: compile_chain([a, c], window))
    compile_s = time.perf_counter() - t0
    ok5, err5 = attempt(lambda: stream(new.execute, 0, 5, window)) if ok4 else (False, new)
    if ok4:
        new.teardown()
    return {"execute_after_kill_ok": ok, "error": None if ok else err, "next_execute_ok": ok2,
            "next_error": None if ok2 else err2, "teardown_ok": ok3, "teardown_error": None if ok3 else err3,
            "teardown_s": teardown_s, "recompile_with_replacement_ok": ok4 and ok5,
            "recompile_error": None if ok4 and ok5 else err5, "recompile_s": compile_s}  # fmt: skip


# ---- driver --------------------------------------------------------------------------------------------
def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A part's answers, or the error that ended it (the other parts still run); with its seconds."""
    print(f"-- {name}", flush=True)
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # a probe records what broke and goes on
        traceback.print_exc()
        out = {"part_failed": f"{type(e).__name__}: {e}"}
    return out | {"part_seconds": round(time.perf_counter() - t0, 1)}


def fmt(s: dict[str, Any] | None, digits: int = 2) -> str:
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def print_table(out: dict[str, Any]) -> None:
    print(f"\n{'case':<10} {'width':>5} {'KB':>4}  {'arm':<19} {'ms/batch':<22} {'samples/s':<19} "
          f"{'busiest step ms':<22} {'beyond the step ms':<22} caller CPU/s")  # fmt: skip
    for case, row in out["cases"].items():
        for key, f in row.get("figures", {}).items():
            print(f"{case:<10} {row['width']:>5} {row['packet_kb']:>4.0f}  {key:<19} {fmt(f['ms_per_batch']):<22} "
                  f"{fmt(f['samples_per_second'], 0):<19} {fmt(f['busiest_stage_ms']):<22} "
                  f"{fmt(f['overhead_ms_per_batch']):<22} {f['caller_cpu_per_s']['median']:.2f}")  # fmt: skip
    noop = out["cases"].get("noop", {})
    for p, s in noop.get("per_hop_ms", {}).items():
        print(f"per-hop overhead, {p}: one more actor in the chain adds {fmt(s, 3)} ms per batch (noop, one at a time)")
    rc = out.get("recompile", {})
    for key in RECOMPILE:
        if key in rc:
            print(f"{key:<18} {fmt(rc[key], 3)} s")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Ray Compiled Graphs against the object-ref path for growpipe's "
                                 "stage hand-offs: samples/s, per-hop overhead, recompile cost, control calls, "
                                 "failures")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="tiny: the noop case and width 128, 20 batches, 1 repeat")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures and answers as JSON")
    ap.add_argument("--batches", type=int, help="timed batches per measurement (default 200; --quick 20)")
    ap.add_argument("--repeats", type=int, help="interleaved repeats (default 5; --quick 1)")
    ap.add_argument("--window", type=int, default=4, help="batches in flight (default 4, growpipe's pipeline.window)")
    ap.add_argument("--inline-kb", type=int, help="Ray's max_direct_call_object_size in KB (default: Ray's own, "
                    "100; growpipe's embedded Ray uses runtime.inline_kb 2048)")  # fmt: skip
    ap.add_argument("--target-ms", type=float, action="append",
                    help="block step ms to calibrate a case for, repeatable (default 5 and 20)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.inline_kb is not None and args.inline_kb < 0:
        ap.error(f"--inline-kb must be 0 or more, got {args.inline_kb}")
    for name in ("batches", "repeats", "window"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name} must be at least 1, got {value}")
    if args.target_ms and min(args.target_ms) <= 0:
        ap.error("--target-ms must be positive, e.g. --target-ms 20")
    args.batches = args.batches or (20 if args.quick else 200)
    args.repeats = args.repeats or (1 if args.quick else 5)
    return args


def plan_cases(args: argparse.Namespace) -> dict[str, tuple[int, float | None]]:
    """Case name -> (width, its block step ms alone in this process; None for noop)."""
    cases: dict[str, tuple[int, float | None]] = {"noop": (256 if args.quick else 1280, None)}
    if args.quick:
        return cases | {"mlp_w128": (128, step_ms(128, 5))}
    for t in args.target_ms or [5.0, 20.0]:
        width, ms = calibrate(t)
        cases[f"mlp_{t:g}ms"] = (width, ms)
        print(f"-- calibrated {t:g} ms: width {width}, step {ms:.2f} ms in this process", flush=True)
    return cases


def run_parts(args: argparse.Namespace, cases: dict[str, tuple[int, float | None]]) -> dict[str, Any]:
    """Every part on one set of three stage actors and one graph-owning actor."""
    t0 = time.perf_counter()
    actors = [launch(i) for i in range(3)]
    owner = ray.remote(GraphOwner).options(num_cpus=0, max_concurrency=4).remote()
    get([x.__ray_ready__.remote() for x in (*actors, owner)], 120)
    out: dict[str, Any] = {"arms": ARMS, "actors_start_s": round(time.perf_counter() - t0, 1), "cases": {}}
    for case, (width, ms) in cases.items():
        row = guarded(f"case {case} (width {width})", lambda c=case, w=width: measure_case(actors, owner, c, w, args))
        out["cases"][case] = {**row, "step_ms_alone": ms, "width": width, "packet_kb": BATCH * width * 4 / 1024}
    width, times = cases["noop"][0], 2 if args.quick else max(args.repeats, 5)
    out["recompile"] = guarded("(c) recompile", lambda: measure_recompile(actors, width, args.window, times))
    idle_s, stuck_s = (0.5, 2.0) if args.quick else (2.0, 5.0)
    out["control"] = guarded("(d) control calls", lambda: probe_control(actors, args.window, idle_s, stuck_s))
    out["failures"] = guarded("(e) failures", lambda: probe_failures(actors, args.window))
    for x in (*actors, owner):
        ray.kill(x, no_restart=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start, load_before = time.perf_counter(), os.getloadavg()
    print(f"-- load average {load_before}", flush=True)
    if __name__ != "__main__":  # imported (a test): the actors' class travels by value, bench/ is not on their path
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cases = plan_cases(args)
    t0 = time.perf_counter()
    inline = {} if args.inline_kb is None else {"max_direct_call_object_size": args.inline_kb * 1024}
    ray.init(address="local", num_cpus=4, include_dashboard=False, _system_config=inline or None)
    ray_start_s = round(time.perf_counter() - t0, 1)
    logging.getLogger("ray.dag").setLevel(logging.WARNING)  # a line per actor at every teardown otherwise
    try:
        out = run_parts(args, cases)
    finally:
        ray.shutdown()
    out["ray_start_s"] = ray_start_s
    out["settings"] = {"batch_size": BATCH, "inline_kb": args.inline_kb, "batches": args.batches,
                       "repeats": args.repeats, "window": args.window,
                       "quick": args.quick, "cpus": os.cpu_count(), "ray": ray.__version__, "torch": torch.__version__,
                       "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    out["seconds"] = round(time.perf_counter() - start, 1)
    print_table(out)
    print(json.dumps({k: out[k] for k in ("control", "failures")}, indent=1, default=str))
    print(f"done in {out['seconds']} s; load {out['settings']['load_before']} -> {out['settings']['load_after']}")
    if args.json_out:
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
