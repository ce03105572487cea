"""Pipelined end-to-end backprop on the stage actors (method bp, --runtime ray): GPipe, or asynchronous
1F1B with weight stashing or SpecTrain (runtime.bp_schedule, see async_bp.py).

GPipe:

Per mini-batch the driver submits every micro-batch's forward through the stages (stage 0 cuts the
micro-batches from its own data), the backwards in reverse order (each stage hands the gradient of its
input upstream), then one optimizer step per stage: one synchronous update per mini-batch, so the weights
follow single-process BP on the same mini-batches up to float rounding.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from growpipe.config import RunConfig
from growpipe.errors import ConfigError
from growpipe.nn.net import GrowableNet, plan_blocks
from growpipe.report import epoch_row, format_epoch, summarize
from growpipe.runtime.async_bp import AsyncBPStage, check_1f1b, run_1f1b_epoch
from growpipe.runtime.bp_stage import BPStage, micro_slices
from growpipe.runtime.placement import in_bundle, make_stage_pg

BATCHES_AHEAD = 2
"""Mini-batches the driver submits before waiting for the oldest one's optimizer steps."""


def schedule_name(cfg: RunConfig) -> str:
    if cfg.runtime.bp_schedule == "gpipe":
        return "GPipe"
    return "1F1B + SpecTrain" if cfg.runtime.spectrain else "1F1B + weight stashing"


def check_gpipe(cfg: RunConfig) -> None:
    """What BP on Ray does not run: growth (BP retrains everything) and a config that is not bp."""
    if cfg.method != "bp":
        raise ConfigError(f"method: GPipe pipelines end-to-end BP; got {cfg.method!r}")
    if cfg.grow.policy() != "none":
        raise ConfigError("grow: growth on the Ray runtime is for the local-learning rules; drop grow.* for method bp")


class GPipeRun:
    """One GPipe run: stage actors in a placement group, micro-batched epochs, evaluation on stage 0."""

    def __init__(self, cfg: RunConfig):
        check_gpipe(cfg)
        self.cfg = cfg
        self.pg: Any = None
        self.stages: list[Any] = []
        self.info: Any = None
        self.topology: list[dict[str, Any]] = []

    def start(self) -> tuple[int, str]:
        cfg = self.cfg
        k = cfg.net.blocks
        self.pg = make_stage_pg(cfg, k, cfg.runtime.placement)
        one_f_one_b = cfg.runtime.bp_schedule == "1f1b"
        actor = ray.remote(AsyncBPStage if one_f_one_b else BPStage)
        self.stages = [in_bundle(actor, cfg, self.pg, i).remote(i, cfg) for i in range(k)]
        self.info, summary = ray.get(self.stages[0].load_data.remote())
        n = ray.get(self.stages[0].train_size.remote())
        if one_f_one_b:  # the dataset's own size (stage 0 read it), below data.limit_train or without it
            check_1f1b(cfg, math.ceil(n / cfg.data.batch_size))
        specs = plan_blocks(cfg, self.info)
        self.topology = [s.to_dict() for s in specs]
        extra = (k, cfg.runtime.spectrain) if one_f_one_b else ()
        ray.get(
            [
                st.setup.remote(sp, self.info, i == k - 1, *extra)
                for i, (st, sp) in enumerate(zip(self.stages, specs, strict=True))
            ]
        )
        return n, summary

    def epoch(self, epoch: int, n: int) -> tuple[float, float]:
        """One epoch of mini-batches; returns (mean training loss, seconds)."""
        if self.cfg.runtime.bp_schedule == "1f1b":
            seconds = run_1f1b_epoch(self.stages, epoch, n, self.cfg.data.batch_size)
            return ray.get(self.stages[-1].epoch_loss.remote()), seconds
        bs, m_batches = self.cfg.data.batch_size, self.cfg.runtime.micro_batches
        pending: deque[list[Any]] = deque()
        t0 = time.perf_counter()
        for b in range(math.ceil(n / bs)):
            size = min(bs, n - b * bs)
            shares = [len(part) / size for part in micro_slices(size, m_batches)]
            for m, share in enumerate(shares):
                ref = self.stages[0].forward.remote(epoch, b, m, share)
                for st in self.stages[1:]:
                    ref = st.forward.remote(epoch, b, m, share, ref)
            for m in reversed(range(len(shares))):
                grad = self.stages[-1].backward.remote(m, None)
                for st in reversed(self.stages[:-1]):
                    grad = st.backward.remote(m, grad)
            pending.append([st.step.remote() for st in self.stages])
            if len(pending) > BATCHES_AHEAD:
                ray.get(pending.popleft())
        while pending:
            ray.get(pending.popleft())
        seconds = time.perf_counter() - t0
        return ray.get(self.stages[-1].epoch_loss.remote()), seconds

    def staleness(self) -> list[float] | None:
        """1F1B: per stage, the mean distance between the weights used and the weights updated."""
        if self.cfg.runtime.bp_schedule != "1f1b":
            return None
        return ray.get([st.staleness.remote() for st in self.stages])

    def stage_stats(self) -> list[dict[str, Any]]:
        """Per stage: busy seconds and samples so far."""
        return ray.get([st.stage_stats.remote() for st in self.stages])

    def states(self) -> list[dict[str, Any]]:
        return ray.get([st.state_dict.remote() for st in self.stages])

    def evaluate(self) -> dict[str, Any]:
        return ray.get(self.stages[0].evaluate.remote(self.topology, self.info, *self.states()))

    def final_net(self) -> GrowableNet:
        return GrowableNet.from_states(self.cfg, self.info, self.topology, self.states())

    def stop(self) -> None:
        for st in self.stages:
            with contextlib.suppress(Exception):
                ray.kill(st, no_restart=True)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)


def train_gpipe(
    cfg: RunConfig, address: str | None = None, progress: Callable[[str], None] | None = print, keep_net: bool = False
) -> tuple[dict[str, Any], GrowableNet | None]:
    """Train method bp with GPipe on stage actors; return the result JSON (and the trained net)."""
    from growpipe.callbacks import notify, run_callbacks
    from growpipe.runtime.pipeline import connect
    from growpipe.tracking import resolve_tracking

    check_gpipe(cfg)
    if cfg.runtime.bp_schedule == "ddp":
        raise ConfigError(
            "runtime.bp_schedule: ddp is data-parallel, not a pipeline; use growpipe.runtime.ddp.train_ddp"
        )
    if cfg.runtime.bp_schedule == "1f1b" and cfg.data.limit_train:  # at most this many batches: refuse before Ray
        check_1f1b(cfg, math.ceil(cfg.data.limit_train / cfg.data.batch_size))
    cfg = resolve_tracking(cfg)
    owns, dashboard = connect(cfg, address)
    run = GPipeRun(cfg)
    say = progress or (lambda _line: None)
    callbacks = run_callbacks(cfg, cfg.name, say)  # MLflow, as for the other runtimes
    try:
        if progress and dashboard:
            progress(f"ray    dashboard {dashboard}")
        n, data = run.start()
        k = cfg.net.blocks
        if progress:
            progress(f"data   {data}")
            progress(f"net    bp ({schedule_name(cfg)}) on {cfg.net.backbone}: {k} stage actors, "
                     + (f"{cfg.runtime.micro_batches} micro-batches per mini-batch" if cfg.runtime.bp_schedule ==
                        "gpipe" else "an update per mini-batch, no flush"))  # fmt: skip
        notify(callbacks, "on_start", say=say)
        history: list[dict[str, Any]] = []
        train_seconds, ev = 0.0, None
        for epoch in range(1, cfg.train.epochs + 1):
            loss, seconds = run.epoch(epoch, n)
            train_seconds += seconds
            ev = run.evaluate()
            row = epoch_row(epoch, cfg, k, k, {f"b{k - 1}.ce": loss}, ev, n, seconds)
            history.append(row)
            if progress:
                progress(format_epoch(row))
            notify(callbacks, "after_epoch", row, say=say)
        assert ev is not None
        summary = summarize(cfg, k, history, [], ev, train_seconds, n * len(history))
        summary.update(runtime=f"ray-{cfg.runtime.bp_schedule}", schedule=schedule_name(cfg),
                       micro_batches=cfg.runtime.micro_batches, staleness=run.staleness(),
                       stage_busy=run.stage_stats())  # fmt: skip
        net = run.final_net() if keep_net or callbacks else None
        notify(callbacks, "on_finish", summary, say=say)
        if net is not None:
            notify(callbacks, "on_final_net", net, summary, say=say)
        return summary, (net if keep_net else None)
    except Exception as e:
        notify(callbacks, "on_error", str(e).splitlines()[0] if str(e) else type(e).__name__, say=say)
        raise
    finally:
        notify(callbacks, "close", say=say)
        run.stop()
        if owns:
            ray.shutdown()
