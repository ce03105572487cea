"""What both stage-actor engines share (the local-learning pipeline and pipelined BP): one actor per block in
placement-group bundles, stage 0 reading the data, evaluation on stage 0, checkpoint shards written by the
actors, and Ray's errors turned into the loop's (a dead actor is WorkerLost)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, cast

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from growpipe.checkpoint import CheckpointStore
from growpipe.config import RunConfig
from growpipe.errors import PipelineError, StageLostError
from growpipe.loop.engine import Prepared, WorkerLost
from growpipe.loop.policies import want_standby
from growpipe.nn.backbones import FEATURE_FAMILIES
from growpipe.nn.inference import Exited, ExitPredictions, early_exit_report, evaluate_exits, exit_costs
from growpipe.nn.net import GrowableNet
from growpipe.nn.preserve import starts_preserved
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.names import stage_actor_name
from growpipe.runtime.placement import in_bundle, make_stage_pg, stage_bundle
from growpipe.runtime.stage_base import ALL_EXITS
from growpipe.runtime.transport import actor_options


class Slot:
    """A block's place: the actor that runs it, the placement-group bundle that actor holds, its spec, and
    its home: the bundle its own actor uses when the cluster has room (kept while it runs packed)."""

    def __init__(self, handle: Any, pg: Any, owns_pg: bool, bundle: int = 0, host: int | None = None):
        self.handle = handle
        self.pg = pg
        self.owns_pg = owns_pg
        self.bundle = bundle
        self.host = host  # packed into the actor of block `host` (no capacity, or a lost node); None: its own
        self.home: tuple[Any, int, bool] | None = (pg, bundle, owns_pg) if host is None else None
        self.spec: BlockSpec | None = None
        self.block_name = "?"
        self.name = ""  # its actor's name (growpipe.runtime.names.stage_actor_name)
        self.ahead = False  # started before its block was asked for (grow.standby)

    @property
    def index(self) -> int:
        assert self.spec is not None
        return self.spec.index


END_STAGE_S = 5.0
"""How long stage actors asked to end (StageBase.close) may take before they are killed."""


def end_actors(handles: list[Any], timeout_s: float = END_STAGE_S) -> None:
    """End stage actors the orderly way (StageBase.close: a shard write under way and the running call complete
    first), all at once; kill those still there after `timeout_s`. One already dead is left as it is."""
    closing: list[tuple[Any, Any]] = []
    for handle in {id(h): h for h in handles}.values():
        with contextlib.suppress(Exception):  # already dead, or its actor class has no close
            closing.append((handle, handle.close.remote()))
    if not closing:
        return
    refs = [ref for _, ref in closing]
    ended, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for handle, ref in closing:
        if ref not in ended:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)


class StageEngine:
    """Base of the engines whose blocks live in stage actors (subclasses set `actor_class`)."""

    actor_class: Any = None
    stage_table = True
    places_while_training = True  # a grown block is built in an actor of its own
    net: GrowableNet | None = None

    def __init__(self, cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None = None, say: Any = None):
        """`reserved` = (placement group, first bundle): place the stages in those bundles (a Tune trial's)
        instead of placement groups of their own; growth takes the next bundles."""
        self.cfg = cfg
        self.run_name = run_name
        self.say = say or (lambda _line: None)
        self.slots: list[Slot] = []
        self.info: InputInfo | None = None
        self._shared_pg: Any = None
        self._reserved_pg: Any = reserved[0] if reserved else None
        self._next_bundle = reserved[1] if reserved else 0
        self._eval_bytes = {"activations": 0, "results": 0}
        self._early: dict[int, Slot] = {}  # stages open() started before their blocks were planned
        self._standby: tuple[int, Slot] | None = None  # (block index, slot): the next grown block's actor
        self._launches: dict[int, int] = {}  # actors started so far per block: each gets a name of its own

    # ---- placement ------------------------------------------------------------------------------------
    def open(self, layout: dict[str, Any] | None = None) -> tuple[InputInfo, dict[str, Any]]:
        """Place every stage (in a placement group with room for each one of its own) and have stage 0 read
        the data; the other stages' processes start meanwhile (each one's start-up is seconds of imports)."""
        hosts = (layout or {}).get("hosts") or [None] * self.cfg.net.blocks
        if self._reserved_pg is None:
            self._shared_pg = make_stage_pg(self.cfg, sum(h is None for h in hosts), self.cfg.runtime.placement)
        self.slots = [self._launch_in_shared(0)]
        self._early = {i: self._launch_in_shared(i) for i in range(1, len(hosts)) if hosts[i] is None}
        self.info, data = self._get(self.slots[0].handle.load_data.remote(), "stage 0 loading the data")
        return self.info, data

    def _launch_in_shared(self, index: int) -> Slot:
        """Launch stage `index` in the next bundle of the run's shared placement group: its own, or the
        reserved one it was given."""
        pg = self._reserved_pg if self._reserved_pg is not None else self._shared_pg
        if self._reserved_pg is not None and self._next_bundle >= len(pg.bundle_specs):
            raise PipelineError(
                f"no reserved bundle left for block {index}: the placement group this run was given has "
                f"{len(pg.bundle_specs)} bundles; raise grow.max_blocks so the sweep reserves one per block"
            )
        self._next_bundle += 1
        return self._launch(index, pg, self._next_bundle - 1, owns_pg=False)

    def _stage_slot(self, index: int) -> Slot:
        """Stage `index` of the initial blocks in its own bundle: the actor open() started, else a new one."""
        early = self._early.pop(index, None)
        return early if early is not None else self._launch_in_shared(index)

    def _launch_for_growth(self, index: int) -> Slot:
        """A new stage: the standby started for this block, else the next reserved bundle, or a placement group
        of its own."""
        standby = self._take_standby(index)
        if standby is not None:
            return standby
        if self._reserved_pg is not None:
            return self._launch_in_shared(index)
        return self._launch(index, make_stage_pg(self.cfg, 1, "PACK"), 0, owns_pg=True)

    def _launch(self, index: int, pg: Any, bundle_index: int, owns_pg: bool) -> Slot:
        groups = getattr(self.actor_class, "CONCURRENCY_GROUPS", None)
        remote = {**({"concurrency_groups": dict(groups)} if groups else {}), **actor_options(self.cfg)}
        actor = ray.remote(**remote)(self.actor_class) if remote else ray.remote(self.actor_class)
        launch = self._launches.get(index, 0)
        self._launches[index] = launch + 1
        name = stage_actor_name(self.run_name, index, launch)
        opts = in_bundle(actor, self.cfg, pg, bundle_index, name=name, max_concurrency=1)
        slot = Slot(opts.remote(index, self.cfg), pg, owns_pg, bundle_index)
        slot.name = name
        return slot

    def thaw(self, lr_factor: float) -> None:
        """Every stage's blocks learn again (grow.joint); no block grows after this: the standby goes."""
        self.drop_standby()
        self._get_all([s.handle.thaw.remote(s.index, lr_factor) for s in self.slots], "thawing the blocks")

    # ---- the standby: the next grown block's actor, started ahead (grow.standby) -----------------------
    def keep_standby(self) -> None:
        """Start the actor of block len(slots) now when policies.want_standby says so; nothing waits for it."""
        if self._standby is not None:
            return
        bundle = self._bundle()
        if self._reserved_pg is not None:  # a Tune trial's bundles are reserved for its growth already
            available = bundle if self._next_bundle < len(self._reserved_pg.bundle_specs) else {}
        else:
            available = ray.available_resources()
        index = len(self.slots)
        if not want_standby(self.cfg.grow.standby, index, self.cfg.max_blocks(), bundle, available):
            return
        if self._reserved_pg is not None:
            slot = self._launch_in_shared(index)
        else:
            slot = self._launch(index, placement_group([bundle], strategy="PACK"), 0, owns_pg=True)
        self._standby = (index, slot)

    def _take_standby(self, index: int) -> Slot | None:
        """The standby for block `index` when it is placed and alive; else it is dropped (None)."""
        if self._standby is None:
            return None
        for_index, slot = self._standby
        placed = for_index == index and (not slot.owns_pg or placement_group_table(slot.pg).get("state") == "CREATED")
        if placed:
            try:
                ray.get(slot.handle.__ray_ready__.remote(), timeout=self.cfg.runtime.stage_timeout_s)
                self._standby = None
                slot.ahead = True
                return slot
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass  # its node was lost, or it never started: place the block afresh
        self.drop_standby()
        return None

    def drop_standby(self) -> None:
        """Kill the standby and release its bundle (a recovery needs the room; the run ends)."""
        if self._standby is None:
            return
        _, slot = self._standby
        self._standby = None
        self._discard(slot)
        if not slot.owns_pg and slot.bundle == self._next_bundle - 1:
            self._next_bundle -= 1  # the reserved bundle goes to the next launch again

    def _bundle(self) -> dict[str, float]:
        """One stage's resources on this cluster (a GPU each when it has GPUs)."""
        return stage_bundle(self.cfg, ray.cluster_resources().get("GPU", 0) > 0)

    def _resources_text(self) -> str:
        b = self._bundle()
        return ", ".join(f"{v:g} {k}" for k, v in b.items()) + " per stage"

    def _kill_all(self) -> None:
        """End every stage actor (their bundles stay reserved: replacements go into them)."""
        end_actors([slot.handle for slot in self.slots if slot.host is None])

    def discard_block(self, block: Prepared) -> None:
        self._discard(cast(Slot, block.handle))

    def _start_preserved(self) -> None:
        """After attaching the last slot's block: one planned to start where the net stands (grow.init preserve)
        takes the exit of the block below as it is now (no stage trains between two run_epoch calls)."""
        new, below = self.slots[-1], self.slots[-2]
        if new.spec is None or not starts_preserved(new.spec):
            return
        exit_below = below.handle.exit_state.remote(below.index)  # handed stage to stage, not through here
        self._get(new.handle.start_from_exit.remote(new.index, exit_below), "starting the new block at the exit below")

    def _discard(self, slot: Slot) -> None:
        if slot.host is None:  # a packed block's host actor serves other blocks
            end_actors([slot.handle])
        for pg, _, owned in [(slot.pg, slot.bundle, slot.owns_pg), slot.home or (None, 0, False)]:
            if owned:
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)

    # ---- evaluation: the splits stream through the stage actors, nothing gathers the net -------------
    def evaluate(self) -> dict[str, Any]:
        """Every exit on the test split (and the full path on the validation split), streamed through the
        stage actors as training is: each computes the exits of the blocks it holds and keeps their
        probabilities; only those come back. No block's weights leave its actor (AL's label-side decoders
        excepted: the stages above read their exits through them)."""
        self._share_decoders()
        self._eval_bytes = {"activations": 0, "results": 0}
        test = self._predictions("test")
        ev = evaluate_exits(test, self.cfg.eval.thresholds, self.cfg.eval.confidence, self._exit_costs())
        ev["val_accuracy"] = None
        if self.cfg.data.val_fraction > 0:  # the held-out split (DataBundle.val)
            val = self._predictions("val")
            ev["val_accuracy"] = val.accuracy(val.depths[-1])
        ev["eval_bytes"] = self._eval_bytes  # activations between the stages, probabilities back: no weights
        return ev

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        """Real early exit on the test split through the stage actors: a sample that leaves at an exit is not
        sent on; timed against the full path."""
        self._share_decoders()
        early, seconds, labels = self._early_pass(threshold)
        _, full_seconds, _ = self._early_pass(None)
        return early_exit_report(threshold, early, labels, seconds, full_seconds, self._exit_costs())

    def _actors(self) -> list[Any]:
        """The stage actors in block order (a packed block runs in its host's)."""
        return [s.handle for s in self.slots if s.host is None]

    def _share_decoders(self) -> None:
        """AL: every stage gets the decoders of the blocks below it (small, label-side modules)."""
        actors = self._actors()
        if self.cfg.method != "al" or len(actors) < 2:
            return
        own = self._get_all([a.decoders.remote() for a in actors[:-1]], "collecting the decoders")
        below: list[Any] = []
        calls = []
        for actor, mine in zip(actors[1:], own, strict=True):
            below = [*mine, *below]
            calls.append(actor.set_decoders.remote(below))
        self._get_all(calls, "handing the decoders up")

    def _pass(self, split: str, threshold: float | None) -> tuple[list[dict[Any, Any]], float]:
        """Stream `split` through the stages once (see StageBase.eval_packet); what each kept, and the seconds."""
        actors, side = self._actors(), self._side_groups()
        batches = self._get(actors[0].eval_batches.remote(split), f"counting the {split} batches")
        last = max(s.index for s in self.slots) + 1
        start = time.perf_counter()
        self._stream_eval(actors, split, batches, side, threshold, last)
        seconds = time.perf_counter() - start
        return self._get_all([a.eval_results.remote() for a in actors], "collecting the exits"), seconds

    def _stream_eval(self, actors: list[Any], split: str, batches: int, side: tuple[str, ...],
                     threshold: float | None, last: int) -> None:  # fmt: skip
        """Every evaluation batch through the stages by chained calls (an ObjectRef from actor to actor)."""
        window = 2 * len(actors)  # batches in flight: every stage busy, the object store bounded
        inflight: list[Any] = []
        for b in range(batches):
            ref = actors[0].eval_source.remote(split, b, side, threshold, last)
            for actor in actors[1:]:
                ref = actor.eval_packet.remote(ref, threshold, last)
            inflight.append(ref)
            if len(inflight) >= window:
                self._get(inflight.pop(0), f"evaluating on the {split} split")
        self._get_all(inflight, f"evaluating on the {split} split")

    def _predictions(self, split: str) -> ExitPredictions:
        kept, _ = self._pass(split, ALL_EXITS)
        probs = {d: v for part in kept for d, v in part.items() if isinstance(d, int)}
        self._eval_bytes["activations"] += sum(part["sent_bytes"] for part in kept)
        self._eval_bytes["results"] += sum(v.numel() * v.element_size() for v in probs.values())
        return ExitPredictions(sorted(probs), probs, kept[0]["labels"])

    def _early_pass(self, threshold: float | None) -> tuple[Exited, float, Any]:
        kept, seconds = self._pass("test", threshold)
        return Exited.cat([part["exited"] for part in kept if "exited" in part]), seconds, kept[0]["labels"]

    def _exit_costs(self) -> dict[int, tuple[int, int]]:
        parts = self._get_all([a.cost_parts.remote() for a in self._actors()], "counting MACs")
        return exit_costs([p for per_actor in parts for p in per_actor])

    def _side_groups(self) -> tuple[str, ...]:
        return tuple(
            s.spec.encoder.params["group"] for s in self.slots if s.spec and s.spec.encoder.family in FEATURE_FAMILIES
        )

    # ---- the engine's common answers ------------------------------------------------------------------

    def checksums(self) -> dict[int, str]:
        sums = self._get_all([s.handle.checksum.remote(s.index) for s in self.slots], "checksumming the blocks")
        return {s.index: v for s, v in zip(self.slots, sums, strict=True)}

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        return self._get_all([s.handle.save_shard.remote(store, ckpt_dir, s.index) for s in self.slots],
                             "writing a checkpoint")  # fmt: skip

    def save_async(self, store: CheckpointStore, ckpt_dir: str) -> Callable[[], list[dict[str, Any]]]:
        """Every stage copies its blocks' states (this waits for that only), then writes them on a thread of its
        own while the next epoch trains; the answer waits for those writes (any thread)."""
        slots = list(self.slots)
        self._get_all([s.handle.copy_shard.remote(ckpt_dir, s.index) for s in slots], "copying the blocks' states")
        refs = [s.handle.write_copied_shard.remote(store, ckpt_dir, s.index) for s in slots]
        return lambda: self._get_all(refs, "writing a checkpoint")

    def layout(self) -> dict[str, Any]:
        """Blocks packed for good (grown without room for a stage); a block packed because its node was lost
        is saved as spread: a resume places it at home again."""
        return {"hosts": [s.host if s.home is None else None for s in self.slots]}

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        self._get_all([s.handle.restore.remote(store, ckpt_dir, shards, s.index) for s in self.slots],
                      "restoring the blocks from the checkpoint")  # fmt: skip

    def final_states(self) -> list[dict[str, Any]]:
        return self._get_all([s.handle.state_dict.remote(s.index) for s in self.slots], "collecting the weights")

    def extras(self) -> dict[str, Any]:
        return {
            "placement": [
                {"stage": i, "placement_group": s.pg.id.hex() if s.pg else None, "bundle": s.bundle,
                 "packed_into": s.host}
                for i, s in enumerate(self.slots)
            ]
        }  # fmt: skip

    def stop(self) -> None:
        """End every stage actor and release every placement group (they outlive the actor that made them)."""
        self.drop_standby()
        end_actors([slot.handle for slot in [*self.slots, *self._early.values()]])
        owned = {id(s.home[0]): s.home[0] for s in self.slots if s.home and s.home[2]}
        owned.update({id(s.pg): s.pg for s in self.slots if s.owns_pg})
        for pg in [*owned.values()] + ([self._shared_pg] if self._shared_pg else []):
            with contextlib.suppress(Exception):  # already gone with a dead node: nothing left to release
                remove_placement_group(pg)
        self._shared_pg = None
        self.slots, self._early = [], {}

    # ---- calls ----------------------------------------------------------------------------------------
    def _get(self, ref: Any, what: str) -> Any:
        return self._get_all([ref], what)[0]

    def _get_all(self, refs: list[Any], what: str) -> list[Any]:
        timeout = self.cfg.runtime.stage_timeout_s
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            why = self._stuck_why()
            raise PipelineError(f"{what} took more than runtime.stage_timeout_s={timeout:g}s{why}") from None
        except ray.exceptions.RayError as e:
            raise ray_error(e) from None

    def _stuck_why(self) -> str:
        """Why stage calls may hang: a block whose bundle is on no live node (its node was lost, and no
        capacity takes its place); '' when every bundle is placed."""
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        unplaced = []
        for i, slot in enumerate(self.slots):
            with contextlib.suppress(Exception):  # a removed group: nothing to say
                node = placement_group_table(slot.pg)["bundles_to_node_id"].get(slot.bundle)
                if node not in alive:
                    unplaced.append(i)
        if not unplaced:
            return ""
        return (f": the bundle(s) of block(s) {unplaced} are on no live node (a node was lost and no capacity "
                "replaced it); add a node with a stage's resources or see runtime.on_lost_node")  # fmt: skip

    def _wait_long(self, ref: Any) -> Any:
        """Wait for work of no fixed length (an epoch, a cache pass) with no timeout of its own: a dead stage
        fails `ref` at once, a stuck packet times out inside the stages (runtime.stage_timeout_s)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            raise ray_error(e) from None


def ray_error(e: BaseException) -> BaseException:
    """The error a Ray failure stands for: WorkerLost for a dead actor, else the stage's own error."""
    if isinstance(e, ray.exceptions.RayActorError):
        return WorkerLost(f"a stage actor died ({str(e).splitlines()[0]})")
    cause = getattr(e, "cause", None)
    if isinstance(cause, StageLostError):
        return WorkerLost(str(cause))
    if isinstance(cause, ray.exceptions.RayActorError):
        return WorkerLost(f"a stage actor died ({str(cause).splitlines()[0]})")
    return cause if isinstance(cause, Exception) else e
