"""Controller: owns the topology of a run's stage actors and drives it as an explicit state machine.

States: STARTING (place and build the stages) -> TRAINING (one epoch per step) -> GROWING (append a stage)
-> TRAINING ... -> FINISHED, or ERRORED from anywhere. `_step()` runs the current state's handler and
returns (previous, next); `_set_state()` fires the callbacks. The controller is never on the per-batch path:
stage 0 streams the epoch, the controller only starts it, waits, and gathers statistics.

Controller is a plain class; `launch_controller` applies `ray.remote` (threaded, no CPU slot), so
`progress()` and `status()` answer while `run()` is busy.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from growpipe import envvars
from growpipe.callbacks import RunCallback, notify, run_callbacks
from growpipe.checkpoint_store import CheckpointRef, CheckpointStore, check_input_matches
from growpipe.config import GrowStep, RunConfig, parse_grow_request
from growpipe.errors import (
    ConfigError,
    GrowpipeError,
    PipelineError,
    ShapeError,
    StageError,
    StageLostError,
)
from growpipe.growth import FrozenWatch, GrowthPlan, growth_event, note_epoch
from growpipe.nn.net import plan_blocks, plan_growth_block
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.report import epoch_row, format_epoch, summarize
from growpipe.runtime import NAMESPACE
from growpipe.runtime.growth_orders import GrowOrder, check_input_size, merge_stage_stats
from growpipe.runtime.placement import in_bundle, make_stage_pg, stage_bundle
from growpipe.runtime.stage import Stage


class State(str, Enum):
    STARTING = "starting"
    TRAINING = "training"
    GROWING = "growing"
    FINISHED = "finished"
    ERRORED = "errored"


TERMINAL = (State.FINISHED, State.ERRORED)


class _StageSlot:
    """A launched stage: its actor handle, placement group and spec."""

    def __init__(
        self, handle: Any, pg: Any, spec: BlockSpec | None, owns_pg: bool, bundle: int = 0, host: int | None = None
    ):
        self.handle = handle
        self.pg = pg
        self.bundle = bundle
        self.host = host  # packed into the actor of stage `host` (grow.on_no_capacity: pack); None: its own
        self.spec = spec
        self.owns_pg = owns_pg
        self.block_name = "?"


class Controller:
    """Builds the stages from the config, runs the epochs and the growth schedule, evaluates every exit."""

    def __init__(
        self,
        cfg: RunConfig,
        run_name: str,
        callbacks: list[RunCallback] | None = None,
        reserved: tuple[Any, int] | None = None,
        resume: CheckpointRef | None = None,
    ):
        """`reserved` = (placement group, first bundle): place the stages in those bundles (a Tune trial's
        placement group) instead of making placement groups of its own; growth takes the next bundles.
        `resume`: start from this checkpoint (topology, weights, position, growth history, MLflow run)."""
        self.store = (
            CheckpointStore(cfg.checkpoint.uri, run_name, cfg.checkpoint.keep) if cfg.checkpoint.enabled else None
        )
        self._resume: tuple[CheckpointRef, dict[str, Any]] | None = None
        if resume is not None:
            store = self.store or CheckpointStore(cfg.checkpoint.uri, run_name, cfg.checkpoint.keep)
            manifest = store.read_manifest(resume)
            self._resume = (resume, manifest)
            if cfg.tracking.mlflow and manifest.get("mlflow_run_id") and not cfg.tracking.run_id:
                cfg = cfg.model_copy(
                    update={"tracking": cfg.tracking.model_copy(update={"run_id": manifest["mlflow_run_id"]})}
                )
        self.restarts = 0
        self.resume_batch = 0  # the batch the next epoch starts at (after a mid-epoch restore)
        self.ckpt_seq = 0
        self.cfg = cfg
        self.run_name = run_name
        self.state = State.STARTING
        self.error: str | None = None
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self.callbacks = run_callbacks(cfg, run_name, self._say) if callbacks is None else list(callbacks)
        self.slots: list[_StageSlot] = []
        self.info: InputInfo | None = None
        self.plan = GrowthPlan(cfg)
        self.due: list[GrowStep] = []
        self.orders: queue.Queue[GrowOrder] = queue.Queue()
        self.source = 0  # the stage that streams the epochs: 0 (the data) or the prefix-cache holder
        self.cache_due = False
        self.watch = FrozenWatch()
        self.caches: list[dict[str, Any]] = []
        self.epoch = 0
        self.epoch_running = False  # between an epoch's start and its logged row: the bar may be drawn
        self.history: list[dict[str, Any]] = []
        self.growth: list[dict[str, Any]] = []
        self.stage_totals: dict[int, dict[str, Any]] = {}
        self.timeline: list[dict[str, Any]] = []
        self.train_seconds = 0.0
        self.samples = 0
        self.last_eval: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        self._shared_pg: Any = None
        self._reserved_pg, self._next_bundle = reserved if reserved else (None, 0)

    # ---- the state machine ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Drive the run to FINISHED or ERRORED; return the result JSON or {'error': message}."""
        try:
            while self.state not in TERMINAL:
                self._step()
        finally:
            self._reject_pending(f"run {self.run_name!r} has {self.state.value}; nothing to grow")
            self._cleanup()
            self._notify("close")
        if self.state is State.ERRORED:
            return {"error": self.error}
        return self.result or {}

    def _step(self) -> tuple[State, State]:
        prev = self.state
        handler: dict[State, Callable[[], State]] = {
            State.STARTING: self._starting,
            State.TRAINING: self._training,
            State.GROWING: self._growing,
        }
        try:
            nxt = handler[prev]()
        except Exception as e:  # any failure ends the run as ERRORED with one line, never a hung actor
            self.error = _describe(e)
            self._say(f"error  {self.error}")
            self._notify("on_error", self.error)
            nxt = State.ERRORED
        self._set_state(nxt)
        return prev, nxt

    def _set_state(self, nxt: State) -> None:
        prev, self.state = self.state, nxt
        if prev is not nxt:
            self._notify("on_state_change", prev, nxt)

    def _starting(self) -> State:
        cfg = self.cfg
        manifest = self._resume[1] if self._resume else None
        k = len(manifest["topology"]) if manifest else cfg.net.blocks
        hosts: list[int | None] = list(manifest.get("hosts") or [None] * k) if manifest else [None] * k
        if self._reserved_pg is None:
            self._shared_pg = make_stage_pg(self.cfg, sum(h is None for h in hosts), cfg.runtime.placement)
        first = self._launch_in_shared(0)
        self.slots = [first]
        self.info, summary = self._get(first.handle.load_data.remote(), "stage 0 loading the data")
        self._say(f"data   {summary}")
        if manifest:
            check_input_matches(manifest["input"], self.info.to_dict())
            specs = [BlockSpec.from_dict(t) for t in manifest["topology"]]
        else:
            specs = plan_blocks(cfg, self.info)
        for i in range(1, k):
            self.slots.append(self._launch_in_shared(i) if hosts[i] is None else self._packed_slot(hosts[i]))
        for slot, spec in zip(self.slots, specs, strict=True):
            slot.spec = spec
        self._setup_and_wire(self.slots)
        names = ", ".join(f"{s.block_name}" for s in self.slots)
        self._say(
            f"net    {cfg.method} on {cfg.net.backbone}: {k} stage actors ({names}), window {cfg.runtime.window}, "
            f"{self._resources_text()}"
        )
        if self._resume:
            ref, manifest = self._resume
            self._restore_state(ref, manifest)
            self._say(f"resume {ref.path}: epoch {self.epoch}, batch {self.resume_batch}, {k} blocks")
            self._notify("on_start")
            return self._after_restore()
        self._notify("on_start")
        if self.store is not None and (gone := self.store.clear()):
            self._say(f"ckpt   a fresh run: removed {gone} checkpoint(s) of an earlier run {self.run_name!r} "
                      f"(growpipe train --resume {self.run_name} continues a run instead)")  # fmt: skip
        self._checkpoint(0, 0)  # a restore point from the very start
        return self._next_after(0)

    # ---- checkpoints and recovery ---------------------------------------------------------------------
    def _checkpoint(self, epoch: int, batch: int) -> None:
        """Write every stage's state (each stage its own shard) and then the manifest (the commit)."""
        if self.store is None:
            return
        assert self.info is not None
        self.ckpt_seq += 1
        path = self.store.dir_for(epoch, batch, self.ckpt_seq)
        shards = self._get_all(
            [s.handle.save_shard.remote(path, s.spec.index) for s in self.slots], "writing a checkpoint"
        )
        manifest = {
            "run": self.run_name,
            "epoch": epoch,
            "batch": batch,
            "seq": self.ckpt_seq,
            "config": self.cfg.model_dump(mode="json"),
            "input": self.info.to_dict(),
            "topology": [s.spec.to_dict() for s in self.slots],
            "hosts": [s.host for s in self.slots],
            "shards": shards,
            "history": self.history,
            "growth": self.growth,
            "frozen_checksums": {str(i): v for i, v in self.watch.at_freeze.items()},
            "train_seconds": self.train_seconds,
            "samples": self.samples,
            "caches": self.caches,
            "restarts": self.restarts,
            "mlflow_run_id": next((cb.run_id for cb in self.callbacks if getattr(cb, "run_id", None)), None),
        }
        ref = self.store.commit(path, manifest)
        self._say(f"ckpt   {ref.path.rsplit('/', 1)[-1]} (epoch {epoch}, batch {batch}) in {self.store.root}")

    def _restore_state(self, ref: CheckpointRef, manifest: dict[str, Any]) -> None:
        """Load every stage's shard and the run's bookkeeping from a checkpoint (stages already built)."""
        self._get_all(
            [s.handle.restore.remote(ref.path, manifest["shards"][i], s.spec.index) for i, s in enumerate(self.slots)],
            "restoring the blocks from the checkpoint",
        )
        self.epoch, self.resume_batch = manifest["epoch"], manifest["batch"]
        self.ckpt_seq = max(self.ckpt_seq, manifest["seq"])
        self.history, self.growth = list(manifest["history"]), list(manifest["growth"])
        self.plan = GrowthPlan(self.cfg)
        for event in self.growth:
            self.plan.grew(event["epoch"])
        self.watch = FrozenWatch()
        self.watch.note({int(i): v for i, v in manifest["frozen_checksums"].items()})
        self.train_seconds, self.samples = manifest["train_seconds"], manifest["samples"]
        self.caches = list(manifest.get("caches", []))
        self.source = 0
        self.cache_due = self.cfg.grow.cache.enabled and bool(self.watch.at_freeze)
        self.stage_totals = {}

    def _after_restore(self) -> State:
        """Where a restored run goes on: the rest of an epoch, the next epoch, or the end (a boundary
        checkpoint is written after that boundary's growth, so nothing grows twice)."""
        if self.resume_batch == 0 and self.epoch >= self.plan.total_epochs:
            self._finish()
            return State.FINISHED
        return State.TRAINING

    def _recover(self, error: BaseException) -> State:
        """A stage actor died: replace every stage actor in its bundle, roll all of them back to the
        newest complete checkpoint, and go on from there (at most runtime.max_stage_restarts times)."""
        what = _describe(error)
        limit = self.cfg.runtime.max_stage_restarts
        ref = self.store.latest() if self.store else None
        if ref is None:
            raise PipelineError(f"{what}; no checkpoint to recover from (checkpoint.enabled is false)")
        if self.restarts >= limit:
            raise PipelineError(f"{what}; giving up after {self.restarts} restart(s) (runtime.max_stage_restarts)")
        self.restarts += 1
        self._say(f"recover {what}; restart {self.restarts}/{limit}: every stage back to {ref.path.rsplit('/', 1)[-1]}")
        manifest = self.store.read_manifest(ref)  # type: ignore[union-attr]
        specs = [BlockSpec.from_dict(t) for t in manifest["topology"]]
        old = self.slots
        for slot in old:
            with contextlib.suppress(Exception):
                ray.kill(slot.handle, no_restart=True)
        for slot in old[len(specs) :]:  # grown after the checkpoint: that growth is undone
            self._discard(slot)
        for i in range(len(specs)):
            _wait_name_free(f"{self.run_name}/stage{i}")
        self.slots = []
        for i, o in enumerate(old[: len(specs)]):
            packed = o.host is not None
            self.slots.append(self._packed_slot(o.host) if packed else self._launch(i, o.pg, o.bundle, o.owns_pg))
        for slot, spec in zip(self.slots, specs, strict=True):
            slot.spec = spec
        self._get(self.slots[0].handle.load_data.remote(), "stage 0 loading the data again")
        self._setup_and_wire(self.slots)
        self._restore_state(ref, manifest)
        return self._after_restore()

    def _training(self) -> State:
        try:
            return self._train_epoch()
        except Exception as e:
            if not _stage_lost(e):
                raise
            return self._recover(e)

    def _train_epoch(self) -> State:
        served = False
        while not self.orders.empty():  # asked for between two epochs: no pause needed
            served = self._serve_order(self.orders.get()) or served
        if served:
            self._checkpoint(self.epoch, self.resume_batch)
        if self.cache_due:
            self._build_cache()
        self.epoch += 1
        self.epoch_running = True
        record = self.epoch == self.cfg.runtime.timeline_epoch
        if record:
            self._get_all([s.handle.start_recording.remote() for s in self.slots], "starting the timeline")
        start = time.perf_counter()
        parts: list[list[dict[str, Any]]] = []
        start_batch, self.resume_batch = self.resume_batch, 0
        while True:
            source = self.source
            stop_at = self._next_checkpoint_batch(start_batch)
            side = self._side_groups()
            epoch_ref = self.slots[source].handle.run_epoch.remote(self.epoch, side, start_batch, stop_at)
            first, order = self._wait_epoch(epoch_ref)
            stats = [first]
            for i, slot in enumerate(self.slots[source + 1 :], source + 1):
                if slot.host is None:  # a packed block is drained with its host
                    stats.append(self._get(slot.handle.flush.remote(), f"stage {i} draining"))
            parts.append(stats)
            if order is not None:  # prepared while the epoch ran; the pipeline is drained now
                self._attach_order(order, batch=first["paused_at"])
            if first["paused_at"] is None:
                break
            start_batch = first["paused_at"]
            if order is not None or start_batch == stop_at:  # a growth, or every_batches: a restore point
                self._checkpoint(self.epoch - 1, start_batch)
            if record:
                self._get(self.slots[-1].handle.start_recording.remote(), "starting the timeline")
        stats = merge_stage_stats(parts)
        seconds = time.perf_counter() - start
        self.train_seconds += seconds
        self.samples += stats[0]["samples"]
        self._accumulate(stats, seconds, record)
        ev = self._evaluate()
        losses = {_loss_key(s["stage"], k): v for s in stats for k, v in s["loss"].items()}
        training = sum(1 for s in stats if s["loss"])
        row = epoch_row(self.epoch, self.cfg, len(self.slots), training, losses, ev, stats[0]["samples"], seconds)
        self.history.append(row)
        self.epoch_running = False
        note_epoch(self.growth, row)
        self._say(format_epoch(row))
        self._notify("after_epoch", row)
        return self._next_after(self.epoch)

    def _next_checkpoint_batch(self, start_batch: int) -> int | None:
        every = self.cfg.checkpoint.every_batches
        if self.store is None or not every:
            return None
        return (start_batch // every + 1) * every

    def _next_after(self, epoch: int) -> State:
        """Next state after `epoch` finished epochs (0: the start): a planned growth, more epochs, or the end."""
        self.due = self.plan.due(epoch, self.history, len(self.slots))
        if self.due:
            return State.GROWING
        every = self.cfg.checkpoint.every_epochs
        if epoch and every and (epoch % every == 0 or epoch >= self.plan.total_epochs):
            self._checkpoint(epoch, 0)
        if epoch < self.plan.total_epochs:
            return State.TRAINING
        self._finish()
        return State.FINISHED

    def _growing(self) -> State:
        for step in self.due:
            slot = self._prepare_block(step)
            self._attach(slot, step, self.plan.policy, batch=None)
        return self._next_after_growth()

    def _next_after_growth(self) -> State:
        self.due = []
        self._checkpoint(self.epoch, 0)  # at each growth
        if self.epoch < self.plan.total_epochs:
            return State.TRAINING
        self._finish()
        return State.FINISHED

    # ---- growth ---------------------------------------------------------------------------------------
    def grow(self, request: dict[str, Any]) -> dict[str, Any]:
        """Append a block to this running job (called from outside, e.g. `growpipe grow`).

        Validated like a config; the block is placed and built while training goes on, then the pipeline
        pauses before its next batch, drains, freezes the earlier stages (cfg.grow.freeze), wires the new
        stage in and resumes. Requests are served one at a time, in arrival order. Returns what was added,
        or {'error': message}: a bad request never disturbs the run.
        """
        try:
            ask = parse_grow_request(request)
            self.cfg.check_feature_group(ask.as_step(), "group")
        except (ConfigError, ValueError) as e:
            return {"error": str(e)}
        if self.state in TERMINAL:
            return {"error": f"run {self.run_name!r} has {self.state.value}; nothing to grow"}
        limit = self.cfg.grow.max_blocks
        if limit is not None and len(self.slots) + self.orders.qsize() >= limit:
            return {"error": f"run {self.run_name!r} is at grow.max_blocks={limit} blocks (counting queued requests)"}
        if self.info is not None and self.slots and self.slots[-1].spec is not None:
            try:  # fail fast; checked again against the topology the block really lands on
                check_input_size(ask, self.info, self.slots[-1].spec)
            except ShapeError as e:
                return {"error": str(e)}
        order = GrowOrder(ask)
        self.orders.put(order)
        order.done.wait()
        return order.answer if order.answer is not None else {"error": order.error}

    def _serve_order(self, order: GrowOrder) -> bool:
        """Prepare and attach a request between epochs (the pipeline is idle); True when it grew."""
        if self._prepare_order(order):
            self._attach_order(order, batch=None)
            return True
        return False

    def _prepare_order(self, order: GrowOrder) -> bool:
        """Place and build the requested block; on failure answer the caller and leave the run as it is."""
        assert self.info is not None
        try:
            check_input_size(order.ask, self.info, self._last_spec())
            order.slot = self._prepare_block(order.ask.as_step())
        except (GrowpipeError, ValueError, ray.exceptions.RayError) as e:
            order.fail(_describe(e))
            self._say(f"grow   request refused: {order.error}")
            return False
        return True

    def _attach_order(self, order: GrowOrder, batch: int | None) -> None:
        assert order.slot is not None
        event = self._attach(order.slot, order.ask.as_step(), "request", batch)
        actor = order.slot.spec.index if order.slot.host is None else order.slot.host
        order.succeed({**event, "stage": f"{self.run_name}/stage{actor}", "packed": order.slot.host is not None})

    def _prepare_block(self, step: GrowStep) -> _StageSlot:
        """Place a new stage actor and build the block `step` asks for on top of the current last block."""
        assert self.info is not None
        spec = plan_growth_block(self.cfg, self.info, self._last_spec(), step)
        try:
            if self._reserved_pg is not None:
                slot = self._launch_in_shared(spec.index)
            else:
                slot = self._launch(spec.index, make_stage_pg(self.cfg, 1, "PACK"), 0, owns_pg=True)
        except PipelineError as e:
            if self.cfg.grow.on_no_capacity != "pack":
                raise
            host = self._host_of(len(self.slots) - 1)
            self._say(f"grow   {e}; grow.on_no_capacity=pack: block {spec.index} goes into stage actor {host}")
            slot = self._packed_slot(host)
        slot.spec = spec
        try:
            self._setup_and_wire([slot])
        except Exception:
            self._discard(slot)
            raise
        return slot

    def _attach(self, slot: _StageSlot, step: GrowStep, source: str, batch: int | None) -> dict[str, Any]:
        """Freeze the current stages (cfg.grow.freeze), wire `slot` after the last one and record the event.
        The pipeline must be drained."""
        assert slot.spec is not None
        last = self.slots[-1]
        if self.cfg.grow.freeze:
            self._get_all([s.handle.freeze.remote(s.spec.index) for s in self.slots], "freezing the earlier stages")
            sums = self._checksums("checksumming frozen blocks")
            self.watch.note(dict(enumerate(sums)))
            # a packed block streams through its host: no prefix cache for it
            self.cache_due = self.cfg.grow.cache.enabled and slot.host is None
        if self.source:  # the rest of this epoch streams from the data again; the next one from a new cache
            self._get(self.slots[self.source].handle.drop_cache.remote(), "dropping the old prefix cache")
            self.source = 0
        done_epochs = self.epoch if batch is None else self.epoch - 1
        event = growth_event(done_epochs, step, len(self.slots) + 1, self.history, source, batch)
        event["block"] = slot.spec.index
        self.slots.append(slot)
        if slot.host is None:
            self._get(last.handle.set_downstream.remote(slot.handle), "rewiring the last stage")
        self.plan.grew(done_epochs)
        self.last_eval = None
        self.growth.append(event)
        where = f" at epoch {self.epoch} batch {batch}" if batch is not None else ""
        actor = f"stage actor {slot.spec.index}" if slot.host is None else f"packed into stage actor {slot.host}"
        self._say(
            f"grow   +{step.kind} block {slot.spec.index} ({slot.spec.encoder.family}) -> {len(self.slots)} blocks, "
            f"{actor} ({slot.block_name}){where}"
        )
        self._notify("on_growth", event)
        return event

    def _build_cache(self) -> None:
        """Send every training sample once through the frozen stages into the last stage's cache; from
        now on the last stage streams the epochs from it and the frozen stages stop computing."""
        k = len(self.slots) - 1
        target = self.slots[k]
        n = self._get(self.slots[0].handle.train_size.remote(), "counting the training samples")
        self._get(target.handle.start_cache.remote(n), "preparing the prefix cache")
        start = time.perf_counter()
        self._wait_long(self.slots[0].handle.cache_pass.remote(self._side_groups()))
        for i, slot in enumerate(self.slots[1:k], 1):
            if slot.host is None:
                self._get(slot.handle.flush.remote(), f"stage {i} draining the cache pass")
        where = self._get(target.handle.cache_info.remote(), "checking the prefix cache")
        self.source = k
        self.cache_due = False
        seconds = time.perf_counter() - start
        self.caches.append({"epoch": self.epoch, "block": k, "samples": n, "where": where, "seconds": seconds})
        self._say(
            f"cache  block {k} trains from the frozen prefix's outputs ({where}, computed in {seconds:.1f}s); "
            f"stages 0-{k - 1} stop computing"
        )

    def _wait_long(self, ref: Any) -> Any:
        """Wait for work of no fixed length; a dead stage fails `ref` at once, a stuck packet times out
        inside the stages (runtime.stage_timeout_s)."""
        while True:
            ready, _ = ray.wait([ref], timeout=1.0)
            if ready:
                return ray.get(ref)

    def _last_spec(self) -> BlockSpec:
        spec = self.slots[-1].spec
        assert spec is not None
        return spec

    def _side_groups(self) -> tuple[str, ...]:
        return tuple(
            s.spec.encoder.params["group"] for s in self.slots if s.spec and s.spec.encoder.family == "feature"
        )

    def _reject_pending(self, why: str) -> None:
        while not self.orders.empty():
            order = self.orders.get()
            if order.slot is not None:
                self._discard(order.slot)
            order.fail(why)

    def _discard(self, slot: _StageSlot) -> None:
        if slot.host is not None:  # the host actor serves other blocks
            return
        with contextlib.suppress(Exception):  # already dead
            ray.kill(slot.handle, no_restart=True)
        if slot.owns_pg:
            with contextlib.suppress(Exception):
                remove_placement_group(slot.pg)

    def _finish(self) -> None:
        ev = self.last_eval or self._evaluate()
        summary = summarize(self.cfg, len(self.slots), self.history, self.growth, ev, self.train_seconds, self.samples)
        summary["runtime"] = "ray"
        summary["stages"] = self._stage_table()
        hops = [s["hop_ms_median"] for s in summary["stages"] if s["hop_ms_median"] is not None]
        summary["hop_overhead_ms"] = sorted(hops)[len(hops) // 2] if hops else None
        summary["timeline"] = {"traceEvents": self.timeline, "displayTimeUnit": "ms"}
        sums = self._checksums("checksumming the blocks")
        summary["frozen_unchanged"] = self.watch.unchanged(dict(enumerate(sums)))
        summary["prefix_caches"] = self.caches
        summary["restarts"] = self.restarts
        summary["checkpoints"] = self.store.root if self.store else None
        summary["placement"] = [
            {"stage": i, "placement_group": s.pg.id.hex() if s.pg else None, "bundle": s.bundle, "packed_into": s.host}
            for i, s in enumerate(self.slots)
        ]
        self.final = {
            "topology": [s.spec.to_dict() for s in self.slots],
            "info": self.info,
            "states": self._get_all(
                [s.handle.state_dict.remote(s.spec.index) for s in self.slots], "collecting the weights"
            ),
        }
        self.result = summary
        self._notify("on_finish", summary)
        if self.callbacks:
            self._notify("on_final_net", self._final_net(), summary)

    def _final_net(self) -> Any:
        from growpipe.nn.net import GrowableNet

        assert self.final is not None
        return GrowableNet.from_states(self.cfg, self.final["info"], self.final["topology"], self.final["states"])

    def _notify(self, method: str, *args: Any) -> None:
        notify(self.callbacks, method, *args, say=self._say)

    # ---- stages -------------------------------------------------------------------------------------
    def _bundle(self) -> dict[str, float]:
        return stage_bundle(self.cfg, ray.cluster_resources().get("GPU", 0) > 0)

    def _launch_in_shared(self, index: int) -> _StageSlot:
        """Launch stage `index` in the next bundle of the run's shared placement group: its own, or the
        reserved one it was given."""
        if self._reserved_pg is None:
            self._next_bundle += 1
            return self._launch(index, self._shared_pg, self._next_bundle - 1, owns_pg=False)
        bundles = len(self._reserved_pg.bundle_specs)
        if self._next_bundle >= bundles:
            raise PipelineError(
                f"no reserved bundle left for block {index}: the placement group this run was given has "
                f"{bundles} bundles; raise grow.max_blocks so the sweep reserves one per block"
            )
        self._next_bundle += 1
        return self._launch(index, self._reserved_pg, self._next_bundle - 1, owns_pg=False)

    def _resources_text(self) -> str:
        b = self._bundle()
        return ", ".join(f"{v:g} {k}" for k, v in b.items()) + " per stage"

    def _launch(self, index: int, pg: Any, bundle_index: int, owns_pg: bool) -> _StageSlot:
        actor = ray.remote(concurrency_groups={"control": 1})(Stage)
        opts = in_bundle(actor, self.cfg, pg, bundle_index, name=f"{self.run_name}/stage{index}", max_concurrency=1)
        return _StageSlot(opts.remote(index, self.cfg), pg, None, owns_pg, bundle_index)

    def _setup_and_wire(self, slots: list[_StageSlot]) -> None:
        names = self._get_all([s.handle.setup.remote(s.spec, self.info) for s in slots], "building the blocks")
        for slot, name in zip(slots, names, strict=True):
            slot.block_name = name
        for up, down in zip(slots, slots[1:], strict=False):
            if down.host is None:
                self._get(up.handle.set_downstream.remote(down.handle), "wiring the stages")

    def _checksums(self, what: str) -> list[str]:
        return self._get_all([s.handle.checksum.remote(s.spec.index) for s in self.slots], what)

    def _host_of(self, i: int) -> int:
        """The stage whose actor runs block i."""
        return self.slots[i].host if self.slots[i].host is not None else i

    def _packed_slot(self, host: int) -> _StageSlot:
        """A block that runs in stage `host`'s actor, after that stage's own block."""
        return _StageSlot(self.slots[host].handle, None, None, owns_pg=False, host=host)

    def _wait_epoch(self, ref: Any) -> tuple[dict[str, Any], GrowOrder | None]:
        """Stage 0's stats for this run_epoch call, and the grow request prepared meanwhile (if any), for
        which stage 0 was asked to pause.

        An epoch has no fixed length; the wait still ends: a dead stage fails this ref at once, and every
        stage gives up on a packet after runtime.stage_timeout_s."""
        order: GrowOrder | None = None
        while True:
            ready, _ = ray.wait([ref], timeout=0.2)
            if ready:
                return ray.get(ref), order
            if order is None and not self.orders.empty():
                nxt = self.orders.get()
                if self._prepare_order(nxt):  # training goes on while the block is placed and built
                    order = nxt
                    self.slots[self.source].handle.request_pause.remote()

    def _evaluate(self) -> dict[str, Any]:
        topology = [s.spec.to_dict() for s in self.slots]
        states = [s.handle.state_dict.remote(s.spec.index) for s in self.slots]
        ev = self._get(self.slots[0].handle.evaluate.remote(topology, self.info, *states), "evaluating")
        self.last_eval = ev
        return ev

    def _accumulate(self, stats: list[dict[str, Any]], seconds: float, record: bool) -> None:
        for s in stats:
            t = self.stage_totals.setdefault(
                s["stage"],
                {"stage": s["stage"], "block": s["block"], "samples": 0, "busy_s": 0.0, "wait_input_s": 0.0,
                 "blocked_s": 0.0, "wall_s": 0.0, "hops": [], "max_inflight": 0},
            )  # fmt: skip
            for k in ("samples", "busy_s", "wait_input_s", "blocked_s"):
                t[k] += s[k]
            t["wall_s"] += seconds
            t["max_inflight"] = max(t["max_inflight"], s["max_inflight"])
            if s["hop_ms_median"] is not None:
                t["hops"].append(s["hop_ms_median"])
            if record:
                self.timeline.extend(s["events"])

    def _stage_table(self) -> list[dict[str, Any]]:
        rows = []
        for i in sorted(self.stage_totals):
            t = self.stage_totals[i]
            hops = sorted(t["hops"])
            rows.append(
                {
                    "stage": i,
                    "block": t["block"],
                    "samples": t["samples"],
                    "samples_per_second": t["samples"] / t["busy_s"] if t["busy_s"] else 0.0,
                    "busy_s": round(t["busy_s"], 3),
                    "wait_input_s": round(t["wait_input_s"], 3),
                    "blocked_s": round(t["blocked_s"], 3),
                    "utilisation": t["busy_s"] / t["wall_s"] if t["wall_s"] else 0.0,
                    "hop_ms_median": hops[len(hops) // 2] if hops else None,
                    "max_inflight": t["max_inflight"],
                }
            )
        return rows

    def _get(self, ref: Any, what: str) -> Any:
        return self._get_all([ref], what)[0]

    def _get_all(self, refs: list[Any], what: str) -> list[Any]:
        timeout = self.cfg.runtime.stage_timeout_s
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise PipelineError(f"{what} took more than runtime.stage_timeout_s={timeout:g}s") from None

    def shutdown(self) -> None:
        """Release every stage actor and placement group now (the driver calls this before killing the
        controller: placement groups outlive the actor that made them)."""
        self._reject_pending(f"run {self.run_name!r} was stopped")
        self._cleanup()

    def _cleanup(self) -> None:
        if self.source and self.source < len(self.slots):  # a spilled cache's files go with it
            with contextlib.suppress(Exception):
                ray.get(self.slots[self.source].handle.drop_cache.remote(), timeout=10)
        for slot in self.slots:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(slot.handle, no_restart=True)
        for pg in [s.pg for s in self.slots if s.owns_pg] + ([self._shared_pg] if self._shared_pg else []):
            with contextlib.suppress(Exception):  # already gone with a dead node: nothing left to release
                remove_placement_group(pg)

    # ---- read by the driver while run() is busy ---------------------------------------------------------
    def _say(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def progress(self, since: int = 0) -> tuple[list[str], str]:
        """Progress lines from index `since` on, and the current state."""
        with self._lock:
            return self._lines[since:], self.state.value

    def rows(self, since: int = 0) -> list[dict[str, Any]]:
        """Epoch result rows from index `since` on (for reporting to Tune)."""
        with self._lock:
            return list(self.history[since:])

    def epoch_position(self) -> dict[str, int] | None:
        """Where the running epoch is: {epoch, epochs, batch, batches}; None outside an epoch."""
        if self.state is not State.TRAINING or not self.epoch_running or not self.slots:
            return None
        try:
            done, total = ray.get(self.slots[self.source].handle.position.remote(), timeout=5)
        except (ray.exceptions.RayError, IndexError):
            return None
        return {"epoch": self.epoch, "epochs": self.plan.total_epochs, "batch": done, "batches": total}

    def final_state(self) -> dict[str, Any] | None:
        """After FINISHED: the topology, input description and every block's state (for checkpoints)."""
        return self.final

    def status(self) -> dict[str, Any]:
        """A small snapshot: state, epoch, stages."""
        return {
            "run": self.run_name,
            "state": self.state.value,
            "epoch": self.epoch,
            "stages": [{"index": s.spec.index if s.spec else None, "block": s.block_name} for s in self.slots],
            "error": self.error,
        }


def _loss_key(stage: int, key: str) -> str:
    """`b{block}.{loss}`: a stage reports its own block's losses plainly and a packed block's as @N.loss."""
    return f"b{key[1:]}" if key.startswith("@") else f"b{stage}.{key}"


def _stage_lost(e: BaseException) -> bool:
    """Did this error come from a stage actor (or its node) going away, rather than from the block?"""
    if isinstance(e, ray.exceptions.RayActorError | StageLostError):
        return True
    return isinstance(e, ray.exceptions.RayTaskError) and isinstance(getattr(e, "cause", None), StageLostError)


def _wait_name_free(name: str, timeout_s: float = 30.0) -> None:
    """Wait until a killed actor's name can be taken again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.1)


def _describe(e: BaseException) -> str:
    """A one-line description of an error raised anywhere in the pipeline."""
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, GrowpipeError | ValueError | RuntimeError):
            return str(cause)
    if isinstance(e, ray.exceptions.RayActorError):
        return f"a stage actor died ({str(e).splitlines()[0]})"
    if isinstance(e, StageError | GrowpipeError):
        return str(e)
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def launch_controller(
    cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None = None, resume: CheckpointRef | None = None
) -> Any:
    """Start a run's controller actor: named (found by run name in the growpipe namespace), threaded, no CPU.
    `reserved`: (placement group, first bundle) to place the stages in; `resume`: a checkpoint to start
    from (see Controller)."""
    return (
        ray.remote(Controller)
        .options(
            name=run_name,
            namespace=NAMESPACE,
            num_cpus=0,
            max_concurrency=16,  # run() + progress polls + grow() calls waiting for their turn
            runtime_env={"env_vars": envvars.forwarded()},
        )
        .remote(cfg, run_name, None, reserved, resume)
    )


def logical_cpus_needed(cfg: RunConfig) -> int:
    """CPUs an embedded Ray needs so every stage of the run (after growth) can be placed."""
    return math.ceil(cfg.max_blocks() * cfg.runtime.cpus_per_stage)
