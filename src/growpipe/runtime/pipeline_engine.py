"""The local-learning pipeline (AL, SCPL, DASCPL) as an Engine: one Stage actor per block, each pushing its
detached output straight to the next; the loop is never on the per-batch path.

An epoch: the source stage (stage 0 with the data, or the stage holding a prefix cache) streams its batches
(`run_epoch`), the loop's Pause asks it to stop before its next batch the moment a grown block is ready (the
engine only waits on the epoch's ref meanwhile), then the stages after it drain in order (`flush`) and hand
back their statistics. A block that cannot get a stage of its own may be packed
into the last stage's actor (grow.on_no_capacity: pack).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, cast

import ray
from ray.util.placement_group import placement_group_table

from growpipe import faults
from growpipe.checkpoint import CheckpointStore
from growpipe.errors import PipelineError
from growpipe.loop.engine import EpochPart, Pause, Prepared
from growpipe.loop.policies import pack_host
from growpipe.loop.topology import Layout, TopologyView
from growpipe.nn.specs import BlockSpec
from growpipe.runtime.compiled import COMPILED, CompiledChain
from growpipe.runtime.stage import Stage
from growpipe.runtime.stage_engine import Slot, StageEngine, ray_error
from growpipe.runtime.transport import TransportGroup, run_backend


class PipelineEngine(StageEngine):
    """Blocks in Stage actors wired in a chain; see the module docstring."""

    actor_class = Stage
    name = "ray"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.source = 0  # the stage that streams the epochs: 0 (the data) or the prefix-cache holder
        self.timeline: list[dict[str, Any]] = []
        self.transport: TransportGroup | None = None  # made once Ray runs (the backend depends on its GPUs)
        self._calls = 0  # run_epoch calls so far: a pause names the call it is for (Stage.request_pause)
        self.chain: CompiledChain | None = None  # pipeline.transport compiled: the graph over the stages

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        hosts = (layout or {}).get("hosts") or [None] * len(specs)
        for i in range(1, len(specs)):
            self.slots.append(self._stage_slot(i) if hosts[i] is None else self._packed(hosts[i]))
        self._setup(specs)
        self.keep_standby()
        cfg = self.cfg
        names = ", ".join(s.block_name for s in self.slots)
        t = self.transport
        how = f", activations by {t.backend} (Ray Direct Transport)" if t and t.name else ""
        return (f"{cfg.method} on {cfg.net.backbone}: {len(specs)} stage actors ({names}), window "
                f"{cfg.pipeline.window}, {self._resources_text()}{how}")  # fmt: skip

    def _setup(self, specs: list[BlockSpec]) -> None:
        """Build every slot's block and wire each stage to the next one with an actor of its own."""
        for slot, spec in zip(self.slots, specs, strict=True):
            slot.spec = spec
        names = self._get_all([s.handle.setup.remote(s.spec, self.info) for s in self.slots], "building the blocks")
        for slot, name in zip(self.slots, names, strict=True):
            slot.block_name = name
        for i, slot in enumerate(self.slots):
            if slot.host is not None:
                self._get(slot.handle.attach_packed.remote(slot.index), "packing a block")
            elif i:
                self._get(self.slots[self._host(i - 1)].handle.set_downstream.remote(slot.handle), "wiring the stages")
        self._wire_transport()

    def _wire_transport(self) -> None:
        """pipeline.transport gloo / nccl: one collective group over the stage actors, made again whenever they
        change (growth, recovery); compiled: the graph is torn down, the next epoch compiles the new one;
        nothing for object_store."""
        if self.transport is None:
            backend = run_backend(self.cfg)
            self.transport = TransportGroup(backend, self.cfg.runtime.stage_timeout_s)
            if backend == COMPILED:
                self.chain = CompiledChain(self.cfg.pipeline.window, self.cfg.runtime.stage_timeout_s)
        if self.chain is not None:
            self.chain.drop()
        try:
            self.transport.wire([s.handle for s in self._own()])
        except ray.exceptions.RayError as e:
            raise ray_error(e) from None

    def _host(self, i: int) -> int:
        """The stage whose actor runs block i."""
        host = self.slots[i].host
        return i if host is None else host

    def _packed(self, host: int) -> Slot:
        slot = Slot(self.slots[host].handle, None, owns_pg=False, host=host)
        slot.name = self.slots[host].name
        return slot

    def _own(self) -> list[Slot]:
        return [s for s in self.slots if s.host is None]

    # ---- epochs ---------------------------------------------------------------------------------------
    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        if pause.requested:  # a block was ready before the epoch started: nothing to stream
            return EpochPart([], 0, start_batch)
        record = epoch == self.cfg.runtime.timeline_epoch
        if record:
            self._get_all([s.handle.start_recording.remote() for s in self._own()], "starting the timeline")
        if self.chain is not None:
            return self._run_compiled(epoch, start_batch, stop_at, pause, record)
        source = self.slots[self.source].handle
        self._calls += 1
        call = self._calls
        ref = source.run_epoch.remote(epoch, self._side_groups(), start_batch, stop_at, call)
        with pause.forwarded(lambda: source.request_pause.remote(call)):  # a block is ready: stop before the next batch
            first, paused_at = self._wait_long(ref)
        stats = [first]
        for i, slot in enumerate(self.slots[self.source + 1 :], self.source + 1):
            if slot.host is None:  # a packed block is drained with its host
                stats.append(self._get(slot.handle.flush.remote(), f"stage {i} draining"))
        if record:
            for s in stats:
                self.timeline.extend(s.events)
        return EpochPart(stats, first.samples, paused_at)

    def _run_compiled(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause, record: bool) -> EpochPart:
        """run_epoch through the compiled graph: this engine submits one job per batch (the pause is read
        before each), then every stage hands back its statistics."""
        assert self.chain is not None
        actors = self._graph_actors()
        self.chain.ensure(actors, ray_error)
        total = self._get(actors[0].cg_begin.remote(epoch, self._side_groups(), start_batch), "starting the epoch")
        paused_at: int | None = None

        def jobs() -> Iterator[tuple[Any, ...]]:
            nonlocal paused_at
            for b in range(start_batch, total):
                faults.hold_before(epoch, b, pause)  # GROWPIPE_HOLD_AT
                if pause.requested or (stop_at is not None and b >= stop_at):
                    paused_at = b
                    return
                yield ("train", b)

        self.chain.stream(jobs(), ray_error)
        stats = self._get_all([a.flush.remote() for a in actors], "collecting the stages' statistics")
        if record:
            for s in stats:
                self.timeline.extend(s.events)
        return EpochPart(stats, stats[0].samples, paused_at)

    def _graph_actors(self) -> list[Any]:
        """The actors a compiled graph runs through: the source stage's and every own actor after it."""
        return [s.handle for s in self.slots[self.source :] if s.host is None]

    def _stream_eval(self, actors: list[Any], split: str, batches: int, side: tuple[str, ...],
                     threshold: float | None, last: int) -> None:  # fmt: skip
        """With pipeline.transport compiled: through the graph over every stage, unless a prefix cache streams
        the training (that graph starts at the cache's stage; one graph for both would compile twice an epoch)."""
        if self.chain is None or self.source:
            return super()._stream_eval(actors, split, batches, side, threshold, last)
        self.chain.ensure(actors, ray_error)
        self.chain.stream((("eval", split, b, side, threshold, last) for b in range(batches)), ray_error)

    def position(self) -> tuple[int, int] | None:
        if not self.slots:
            return None
        try:
            return ray.get(self.slots[self.source].handle.position.remote(), timeout=5)
        except (ray.exceptions.RayError, IndexError):
            return None

    # ---- growth ---------------------------------------------------------------------------------------
    def prepare_block(self, spec: BlockSpec) -> Prepared:
        """A stage actor for the block (placed and built while training goes on), or, when none can be
        placed and grow.on_no_capacity is pack, a place after the last stage's block in its actor."""
        try:
            slot = self._launch_for_growth(spec.index)
        except PipelineError as e:
            host = pack_host(self.cfg.grow.on_no_capacity, self._host(len(self.slots) - 1))
            if host is None:
                raise
            self.say(f"grow   {e}; grow.on_no_capacity=pack: block {spec.index} goes into stage actor {host}")
            slot = self._packed(host)
        slot.spec = spec
        try:
            slot.block_name = self._get(slot.handle.setup.remote(spec, self.info), "building the block")
        except Exception:
            self._discard(slot)
            raise
        where = f"stage actor {spec.index}" if slot.host is None else f"packed into stage actor {slot.host}"
        extra = {"stage": slot.name, "packed": slot.host is not None,
                 "standby": slot.ahead}  # fmt: skip
        return Prepared(spec, f"{where} ({slot.block_name})", slot, cacheable=slot.host is None, extra=extra)

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        slot = cast(Slot, block.handle)
        if freeze:
            self._get_all([s.handle.freeze.remote(s.index) for s in self.slots], "freezing the earlier stages")
        self._drop_cache()  # the rest of this epoch streams from the data again; the next one from a new cache
        last = self.slots[self._host(len(self.slots) - 1)]
        self.slots.append(slot)
        if slot.host is None:
            self._get(last.handle.set_downstream.remote(slot.handle), "rewiring the last stage")
            self._wire_transport()
        else:
            self._get(slot.handle.attach_packed.remote(slot.index), "packing the block")
        self._start_preserved()
        self.keep_standby()

    def discard_block(self, block: Prepared) -> None:
        slot = cast(Slot, block.handle)
        if slot.host is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(slot.handle.drop_staged.remote(slot.index), timeout=30)
        super().discard_block(block)

    def thaw(self, lr_factor: float) -> None:
        self._drop_cache()  # the blocks below the cache learn again: every epoch streams from the data
        super().thaw(lr_factor)

    # ---- the frozen-prefix cache ----------------------------------------------------------------------
    def _drop_cache(self) -> None:
        """Stream the epochs from the data again (stage 0), dropping the prefix cache if there is one."""
        if self.source:
            self._get(self.slots[self.source].handle.drop_cache.remote(), "dropping the old prefix cache")
            self.source = 0

    def cache_prefix(self) -> dict[str, Any] | None:
        """Send every training sample once through the frozen stages into the last stage's cache; from now
        on the last stage streams the epochs from it and the frozen stages stop computing."""
        k = len(self.slots) - 1
        target = self.slots[k]
        if target.host is not None:
            return None
        n = self._get(self.slots[0].handle.train_size.remote(), "counting the training samples")
        self._get(target.handle.start_cache.remote(n), "preparing the prefix cache")
        start = time.perf_counter()
        self._wait_long(self.slots[0].handle.cache_pass.remote(self._side_groups()))
        for i, slot in enumerate(self.slots[1:k], 1):
            if slot.host is None:
                self._get(slot.handle.flush.remote(), f"stage {i} draining the cache pass")
        where = self._get(target.handle.cache_info.remote(), "checking the prefix cache")
        self.source = k
        return {"block": k, "samples": n, "where": where, "seconds": time.perf_counter() - start}

    # ---- state ----------------------------------------------------------------------------------------
    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        super().restore(store, ckpt_dir, shards)
        self.source = 0

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        """Replace every stage actor (blocks grown after the checkpoint are dropped) as `layout` says: each
        block in its own actor in its home bundle (spread), or packed after another block (shrunk: its
        home is gone); then build `specs` again."""
        old = self.slots[: len(specs)]
        self.drop_standby()
        if self.chain is not None:
            self.chain.drop()
        self._kill_all()
        for slot in self.slots[len(specs) :]:  # grown after the checkpoint: that growth is undone
            self._discard(slot)
        if layout is None:
            layout = Layout.spread([o.host if o.home is None else None for o in old])
        self.slots = []
        for i, o in enumerate(old):
            home = layout.homes[i]
            if home is None:
                slot = self._packed(layout.hosts[i])  # type: ignore[arg-type]
            else:
                pg, bundle, owns = old[home].home  # type: ignore[misc]
                slot = self._launch(i, pg, bundle, owns)
            slot.home = o.home  # where it goes back to when the run spreads out again
            self.slots.append(slot)
        self.source = 0
        self._get(self.slots[0].handle.load_data.remote(), "stage 0 loading the data again")
        self._setup(specs)
        self.keep_standby()
        return f"{layout.actors} stage actors for {len(specs)} blocks"

    def topology(self) -> TopologyView:
        """The layout now, the spread one, and whether each block's home bundle is on a live node."""
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        tables: dict[Any, dict[str, Any]] = {}

        def node_of(pg: Any, bundle: int) -> str:
            if pg.id not in tables:
                tables[pg.id] = placement_group_table(pg)
            node = tables[pg.id]["bundles_to_node_id"].get(bundle, "")
            return node if node in alive else ""

        placed = [bool(s.home and node_of(s.home[0], s.home[1])) for s in self.slots]
        hosts = [s.host for s in self.slots]
        runs_in = [self._home_index(s) for s in self.slots]
        nodes = [node_of(s.pg, s.bundle) if s.host is None else "" for s in self.slots]
        nodes = [n or nodes[h] if h is not None else n for n, h in zip(nodes, hosts, strict=True)]
        spread = Layout.spread([h if s.home is None else None for s, h in zip(self.slots, hosts, strict=True)])
        missing = {s.home[0].id: s.home[0] for s, p in zip(self.slots, placed, strict=True) if s.home and not p}
        wait = lambda timeout_s: placed_again(list(missing.values()), timeout_s)  # noqa: E731
        return TopologyView(Layout(tuple(hosts), tuple(runs_in)), spread, placed, nodes, wait)

    def _home_index(self, slot: Slot) -> int | None:
        """The block whose home bundle this slot's own actor runs in (None: packed)."""
        if slot.host is not None:
            return None
        homes = [(i, s.home) for i, s in enumerate(self.slots) if s.home]
        same = [i for i, (pg, b, _) in homes if pg.id == slot.pg.id and b == slot.bundle]
        return same[0] if same else None

    def extras(self) -> dict[str, Any]:
        out = {**super().extras(), "timeline": {"traceEvents": self.timeline, "displayTimeUnit": "ms"}}
        if self.chain is not None:
            out["transport"] = self.chain.describe()
        if self.transport is not None and self.transport.name is not None:
            calls = [s.handle.transport_received.remote() for s in self._own()]
            pushes = self._get_all(calls, "counting the direct pushes")
            out["transport"] = {**self.transport.describe(), "direct_pushes": pushes}
        return out

    def stop(self) -> None:
        if self.chain is not None:  # first: nothing steps on the cache's memory once it is dropped
            self.chain.drop()
        if self.source and self.source < len(self.slots):  # a spilled cache's files go with it
            with contextlib.suppress(Exception):
                ray.get(self.slots[self.source].handle.drop_cache.remote(), timeout=10)
        if self.transport is not None:
            self.transport.forget()
        super().stop()


def placed_again(groups: list[Any], timeout_s: float) -> bool:
    """Block until every placement group in `groups` is placed (Ray places a lost node's bundles again once a
    node has room; a removed group answers at once), at most `timeout_s` seconds; whether all were."""
    if not groups:
        return True
    refs = [pg.ready() for pg in groups]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    return len(ready) == len(refs)
