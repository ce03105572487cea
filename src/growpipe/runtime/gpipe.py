"""Pipelined end-to-end backprop on the stage actors (method bp, --runtime ray) as an Engine: GPipe, or
asynchronous 1F1B with weight stashing or SpecTrain (runtime.engine gpipe / 1f1b, see async_bp.py).

GPipe: per mini-batch the engine submits every micro-batch's forward through the stages (stage 0 cuts the
micro-batches from its own data), the backwards in reverse order (each stage hands the gradient of its input
upstream), then one optimizer step per stage: one synchronous update per mini-batch, so the weights follow
single-process BP on the same mini-batches up to float rounding. A pause stops it before the next mini-batch.

1F1B submits the epoch's stretch of mini-batches (to its end, or to a batch checkpoint) in 1F1B order with no
flush inside it, a few mini-batches ahead of the oldest one not done (async_bp.Stretch); a pause ends the stretch
after the mini-batches already given to stage 0: their backwards drain, then the epoch stops there.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, cast

from growpipe.config import RunConfig
from growpipe.data.batches import micro_slices
from growpipe.errors import ConfigError
from growpipe.loop.engine import EpochPart, Pause, Prepared
from growpipe.loop.topology import Layout
from growpipe.nn.specs import BlockSpec
from growpipe.runtime.async_bp import AsyncBPStage, Stretch, check_1f1b
from growpipe.runtime.bp_checks import bp_problems
from growpipe.runtime.bp_stage import BPStage
from growpipe.runtime.stage_engine import Slot, StageEngine

BATCHES_AHEAD = 2
"""Mini-batches GPipe submits before waiting for the oldest one's optimizer steps; 1F1B submits as many past
the stages in flight (a pause drains what was submitted)."""


def schedule_name(cfg: RunConfig) -> str:
    if cfg.engine() == "gpipe":
        return "GPipe"
    if cfg.engine() == "ddp":
        return "data-parallel (Ray Train DDP)"
    return "1F1B + SpecTrain" if cfg.bp_pipeline.spectrain else "1F1B + weight stashing"


def check_bp(cfg: RunConfig) -> None:
    """Raise ConfigError when BP on Ray cannot train this config (see bp_problems)."""
    if problems := bp_problems(cfg):
        raise ConfigError("\n".join(problems))


class BPPipelineEngine(StageEngine):
    """Method bp pipelined over one stage actor per block; see the module docstring."""

    def __init__(self, cfg: RunConfig, *args: Any, **kwargs: Any):
        super().__init__(cfg, *args, **kwargs)
        self.one_f_one_b = cfg.engine() == "1f1b"
        self.actor_class = AsyncBPStage if self.one_f_one_b else BPStage
        self.name = f"ray-{cfg.engine()}"
        self.n = 0
        self._position: tuple[int, int] | None = None  # of the running epoch (Engine.position)

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        if any((layout or {}).get("hosts") or []):
            raise ConfigError("grow.on_no_capacity: pack is for the local-learning pipeline, not for method bp")
        for i in range(1, len(specs)):
            self.slots.append(self._stage_slot(i))
        self.n = self._get(self.slots[0].handle.train_size.remote(), "counting the training samples")
        if self.one_f_one_b:  # the dataset's own size (stage 0 read it), below data.limit_train or without it
            check_1f1b(self.cfg, math.ceil(self.n / self.cfg.data.batch_size))
        self._setup_all(specs)
        self.keep_standby()
        k, cfg = len(specs), self.cfg
        how = (f"{cfg.bp_pipeline.micro_batches} micro-batches per mini-batch" if not self.one_f_one_b
               else "an update per mini-batch, no flush")  # fmt: skip
        return f"bp ({schedule_name(cfg)}) on {cfg.net.backbone}: {k} stage actors, {how}"

    def _setup_all(self, specs: list[BlockSpec]) -> None:
        k = len(specs)
        for slot, spec in zip(self.slots, specs, strict=True):
            slot.spec = spec
        extra = (k, self.cfg.bp_pipeline.spectrain) if self.one_f_one_b else ()
        refs = [s.handle.setup.remote(s.spec, self.info, i == k - 1, *extra) for i, s in enumerate(self.slots)]
        for slot, name in zip(self.slots, self._get_all(refs, "building the blocks"), strict=True):
            slot.block_name = name

    # ---- epochs ---------------------------------------------------------------------------------------
    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        bs = self.cfg.data.batch_size
        total = math.ceil(self.n / bs)
        end = total if stop_at is None else min(stop_at, total)
        self._position = (start_batch, total)
        if self.one_f_one_b:
            end = self._1f1b(epoch, start_batch, end, total, pause)
            paused_at = None if end >= total else end
        else:
            paused_at = self._gpipe(epoch, start_batch, end, total, pause)
        self._position = None  # no epoch runs: no position for a progress bar to show
        stats = self._get_all([s.handle.epoch_stats.remote() for s in self.slots], "collecting the stage statistics")
        done = (total if paused_at is None else paused_at) - start_batch
        samples = min(self.n, (start_batch + done) * bs) - start_batch * bs
        return EpochPart(stats, samples, paused_at)

    def _1f1b(self, epoch: int, start: int, end: int, total: int, pause: Pause) -> int:
        """Train mini-batches `start`..`end` - 1 in 1F1B order, waiting for each one's last call in turn (the
        error of the earliest one that failed is raised) and submitting the next ones as each is done; a pause
        ends the stretch after those stage 0 has been given. The batch it stopped before."""
        stretch = Stretch([s.handle for s in self.slots], epoch, start, end - start)
        ahead = len(self.slots) + BATCHES_AHEAD
        stretch.submit(ahead)
        done = 0
        while done < stretch.batches:
            if stretch.batches > stretch.submitted and pause.check():
                stretch.end_before(stretch.submitted)
            stretch.submit(done + ahead)
            self._get(stretch.last_call(done), "a 1F1B mini-batch")
            done += 1
            self._position = (start + done, total)
        return start + stretch.batches

    def _gpipe(self, epoch: int, start: int, end: int, total: int, pause: Pause) -> int | None:
        bs, m_batches = self.cfg.data.batch_size, self.cfg.bp_pipeline.micro_batches
        stages = [s.handle for s in self.slots]
        pending: deque[list[Any]] = deque()
        paused_at = None
        for b in range(start, end):
            if pause.check():
                paused_at = b
                break
            size = min(bs, self.n - b * bs)
            shares = [len(part) / size for part in micro_slices(size, m_batches)]
            for m, share in enumerate(shares):
                ref = stages[0].forward.remote(epoch, b, m, share)
                for st in stages[1:]:
                    ref = st.forward.remote(epoch, b, m, share, ref)
            for m in reversed(range(len(shares))):
                grad = stages[-1].backward.remote(m, None)
                for st in reversed(stages[:-1]):
                    grad = st.backward.remote(m, grad)
            verdicts = [st.verdict.remote(b) for st in reversed(stages)]  # the loss's own verdict first
            pending.append([st.step.remote(b, *verdicts) for st in stages])  # no stage steps unless all may
            if len(pending) > BATCHES_AHEAD:
                self._settle(pending.popleft())
            self._position = (b, total)
        while pending:
            self._settle(pending.popleft())
        if paused_at is None and end < total:
            paused_at = end
        self._position = (paused_at if paused_at is not None else total, total)
        return paused_at

    def _settle(self, steps: list[Any]) -> None:
        """Wait for a mini-batch's optimizer steps; a non-finite one ends the run under train.on_nonfinite: stop
        (no stage stepped on it; under skip_batch the stages counted it)."""
        verdict = self._get_all(steps, "an optimizer step")[0]
        if verdict is not None and self.cfg.train.on_nonfinite == "stop":
            raise verdict

    def position(self) -> tuple[int, int] | None:
        return self._position

    # ---- growth ---------------------------------------------------------------------------------------
    def prepare_block(self, spec: BlockSpec) -> Prepared:
        slot = self._launch_for_growth(spec.index)
        slot.spec = spec
        extra = (len(self.slots) + 1, self.cfg.bp_pipeline.spectrain) if self.one_f_one_b else ()
        try:
            slot.block_name = self._get(slot.handle.setup.remote(spec, self.info, True, *extra), "building the block")
        except Exception:
            self._discard(slot)
            raise
        return Prepared(spec, f"stage actor {spec.index} ({slot.block_name})", slot, cacheable=False,
                        extra={"stage": slot.name, "packed": False,
                               "standby": slot.ahead})  # fmt: skip

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        if freeze:
            self._get_all([s.handle.freeze.remote(s.index) for s in self.slots], "freezing the earlier stages")
        self.slots.append(cast(Slot, block.handle))  # what prepare_block made
        k = len(self.slots)
        if self.one_f_one_b:  # every stage now runs one more forward ahead
            refs = [s.handle.set_depth.remote(k, i == k - 1) for i, s in enumerate(self.slots)]
        else:
            refs = [self.slots[-2].handle.set_last.remote(False)]
        self._get_all(refs, "rewiring the stages")
        self._start_preserved()
        self.keep_standby()

    def cache_prefix(self) -> dict[str, Any] | None:
        return None  # BP's frozen stages forward every batch (no prefix cache for pipelined BP)

    def topology(self) -> None:
        return None  # the BP stages are replaced in their bundles as they were: no packing, no shrinking

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        old = self.slots
        self.drop_standby()
        self._kill_all()
        for slot in old[len(specs) :]:
            self._discard(slot)
        self.slots = [self._launch(i, o.pg, o.bundle, o.owns_pg) for i, o in enumerate(old[: len(specs)])]
        self._get(self.slots[0].handle.load_data.remote(), "stage 0 loading the data again")
        self._setup_all(specs)
        self.keep_standby()
        return f"{len(specs)} stage actors"

    def extras(self) -> dict[str, Any]:
        staleness = None
        if self.one_f_one_b:
            staleness = self._get_all([s.handle.staleness.remote() for s in self.slots], "reading the staleness")
        micro = self.cfg.bp_pipeline.micro_batches
        return {**super().extras(), "schedule": schedule_name(self.cfg), "micro_batches": micro, "staleness": staleness}
