"""RunLoop: a run's lifecycle, the same for every engine: its states and the transitions between them.

`step()` runs the current state's handler and moves to the state it returns (states.py); `run()` steps until
FINISHED or ERRORED. The work inside a state is its components': growth (growing.Growth, the requests from
other threads through `grow()`: orders.GrowRequests), restore points (checkpointing.Checkpointer), failures
(recovery.Recovery), lost and returning nodes (elastic.Topology), the end (ending.Ending); what the run has done
is its record.RunRecord. They decide with the policies (policies.py, growth.GrowthPlan); the engine executes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from growpipe import signals
from growpipe.checkpoint import CheckpointStore
from growpipe.config import GrowStep, RunConfig
from growpipe.errors import NonFiniteError
from growpipe.growth import note_epoch
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.checkpointing import Checkpointer
from growpipe.loop.elastic import Topology
from growpipe.loop.ending import Ending
from growpipe.loop.engine import Engine
from growpipe.loop.growing import Growth
from growpipe.loop.orders import GrowRequests
from growpipe.loop.policies import grow_at_boundary, learned_nothing
from growpipe.loop.progress import PositionFeed
from growpipe.loop.record import RunRecord
from growpipe.loop.recovery import Recovery
from growpipe.loop.states import Caching, Errored, Finished, Growing, Restoring, Starting, State, Training
from growpipe.loop.stats import StageStats, merge_by_stage
from growpipe.nn.net import GrowableNet, plan_blocks, plan_growth_block
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.report import epoch_row
from growpipe.saved_config import check_input_matches

Say = Callable[[str], None]

SKIP_HINT = "lower train.lr (train.on_nonfinite=skip_batch still stops a run once an epoch learns nothing)"


class RunLoop:
    """Drives one run of `engine` from STARTING to FINISHED (or ERRORED)."""

    def __init__(
        self,
        cfg: RunConfig,
        engine: Engine,
        *,
        run_name: str | None = None,
        store: CheckpointStore | None = None,
        callbacks: list[RunCallback] | None = None,
        say: Say | None = None,
        resume: str | None = None,
    ):
        """`store`: where restore points go (None: none); `resume`: a checkpoint directory to start from."""
        self.cfg = cfg
        self.engine = engine
        self.run_name: str = run_name or cfg.name or "unnamed"
        self.store = store
        self.callbacks = list(callbacks or [])
        self.say: Say = say or (lambda _line: None)
        self.rec = RunRecord()
        self.checkpoints = Checkpointer(cfg, store, engine, self.run_name, self.rec, self.record, self.callbacks,
                                        self.say)  # fmt: skip
        self.recovery = Recovery(cfg, store, self.rec, self.callbacks, self.say)
        self.state: State = Starting(resume)
        self.error: str | None = None
        self.failure: BaseException | None = None  # the exception that ended the run
        self.stop_reason: str | None = None  # why the run was stopped from outside (not a failure)
        self.info: InputInfo | None = None
        self.specs: list[BlockSpec] = []
        self.last_eval: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.ending = Ending(cfg, engine, store, self.rec, self.callbacks, self.say)
        self.requests = GrowRequests(cfg, engine, self.run_name, self.say)
        self.topology = Topology(cfg, engine, self.callbacks, self.say, lambda: self.stop_reason is not None)
        self.feed = PositionFeed(engine, self.callbacks, self.say)
        self.growth = Growth(cfg, engine, self.run_name, self.rec, self.requests, self.callbacks, self.say)
        self.plan = self.growth.plan
        self._row_epoch = 0  # the newest epoch whose row this start of the run made
        self._gated = 0  # the newest epoch handed to epoch_gate
        self.keep_net = True
        """Gather the trained net's weights at the end (final_net / final); off: nobody asks for the whole net."""
        self.epoch_gate: Callable[[int], None] | None = None
        """Called once an epoch's boundary is done (its row, growth and checkpoint went to the callbacks),
        before the next epoch trains; it may block until whoever follows the run has taken that epoch (a Tune
        trial: until Tune answered its report, so nothing trains past an epoch Tune stops the trial at)."""

    # ---- the state machine ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Step to FINISHED or ERRORED; return the result JSON or {'error': message}."""
        try:
            while not self.state.terminal:
                signals.check()  # a stop of this process whose KeyboardInterrupt was swallowed where it landed
                if self.stop_reason is not None:  # stopped from another thread (shutdown): no step after it
                    self.error = f"stopped: {self.stop_reason}"
                    self.state = Errored(self.error)
                else:
                    self.step()
        except BaseException as e:  # KeyboardInterrupt, SystemExit: this process is being stopped
            why = signals.describe() if signals.received() else type(e).__name__
            self._stopped(self.stop_reason or f"interrupted ({why})")
            raise
        finally:
            self.requests.close(f"run {self.run_name!r} has {self.state.name}; nothing to grow")
            self.checkpoints.finish()  # a write under way completes before the workers that write it go
            self.engine.stop()
            notify(self.callbacks, "close", say=self.say)
        if isinstance(self.state, Errored):
            return {"error": self.state.message}
        return self.result or {}

    def step(self) -> tuple[State, State]:
        """Run the current state's handler; return (previous, next)."""
        prev = self.state
        try:
            nxt = getattr(self, f"_{prev.name}")(prev)  # each state's handler is named after it
        except Exception as e:  # any failure: the failure policy retries from a checkpoint or ends the run
            nxt, failure = self.recovery.after(e, prev, self.stop_reason)
            if isinstance(nxt, Errored):
                self.error, self.failure = nxt.message, failure
        self.state = nxt
        if type(prev) is not type(nxt):
            notify(self.callbacks, "on_state_change", prev, nxt, say=self.say)
        return prev, nxt

    # ---- states ---------------------------------------------------------------------------------------
    def _starting(self, s: Starting) -> State:
        cfg = self.cfg
        manifest = None
        if s.resume:
            manifest = self.checkpoints.reader().read_manifest(s.resume)
        else:
            self.checkpoints.check_fresh()
        layout = manifest.get("layout") if manifest else None
        self.say(f"run    {self.run_name}" + (f" (checkpoints in {self.store.root})" if self.store else ""))
        self.info, data = self.engine.open(layout)
        self.say(f"data   {data['summary']}")
        notify(self.callbacks, "on_data", data, say=self.say)
        if manifest:
            check_input_matches(manifest["input"], self.info.to_dict())
            self.specs = [BlockSpec.from_dict(t) for t in manifest["topology"]]
        else:
            self.specs = plan_blocks(cfg.net, cfg.rule(), self.info)
        self.growth.check_plan(self.info, self.specs)  # before any block is built: bad input stops the run here
        self.say(f"net    {self.engine.build(self.specs, layout)}")
        self.topology.note()
        if manifest and s.resume:
            self.engine.restore(self.checkpoints.reader(), s.resume, manifest["shards"])
            self._restore_record(manifest)
            self.say(f"resume {s.resume}: epoch {manifest['epoch']}, batch {manifest['batch']}, "
                     f"{len(self.specs)} blocks")  # fmt: skip
            notify(self.callbacks, "on_start", say=self.say)
            return self._after_restore(manifest)
        notify(self.callbacks, "on_start", say=self.say)
        self.checkpoints.start()  # a restore point from the very start
        return self._boundary(0)

    def _training(self, t: Training) -> State:
        parts, samples, seconds, start = list(t.parts), t.samples, t.seconds, t.start_batch
        self.feed.open = True
        while True:
            stop_at = self.checkpoints.timing.next_stop(start)
            t0 = time.perf_counter()
            with self.requests.pausing(self) as pause, self.feed.running(t.epoch, self.plan.total_epochs):
                part = self.engine.run_epoch(t.epoch, start, stop_at, pause)
            seconds += time.perf_counter() - t0
            self.requests.collect(wait=False)  # a block's placement that failed meanwhile fails here
            parts.extend(part.stats)
            samples += part.samples
            if part.paused_at is None:
                break
            start = part.paused_at
            if (order := self.requests.take_prepared()) is not None:  # placed while the epoch ran: grow, go on
                resume = Training(t.epoch, start, tuple(parts), samples, seconds)
                return Growing(t.epoch - 1, start, order=order, resume=resume)
            if start == stop_at:
                self.checkpoints.write(t.epoch - 1, start)
        self._end_epoch(t.epoch, parts, samples, seconds)
        return self._boundary(t.epoch)

    def _growing(self, g: Growing) -> State:
        if grew := self.growth.grow(g, self):
            self.last_eval = None
        # the restore point after the growth (a boundary whose planned steps were all skipped keeps its epoch end's)
        self.checkpoints.at_boundary(g.epoch, None if g.resume is None else g.batch, grew=grew)
        return g.resume if g.resume is not None else self._next_epoch(g.epoch, 0)

    def _caching(self, c: Caching) -> State:
        self.growth.cache(c.then.epoch - 1)
        return c.then

    def _restoring(self, r: Restoring) -> State:
        assert self.store is not None
        manifest = self.store.read_manifest(r.path)
        self.specs = [BlockSpec.from_dict(t) for t in manifest["topology"]]
        layout = r.layout or self.topology.after_loss(manifest.get("layout"), len(self.specs), manifest["epoch"],
                                                      manifest["batch"])  # fmt: skip
        self.engine.recover(self.specs, layout)
        self.engine.restore(self.store, r.path, manifest["shards"])
        self._restore_record(manifest)
        self.topology.note()
        return self._after_restore(manifest)

    # ---- decisions between states ---------------------------------------------------------------------
    def _boundary(self, epoch: int) -> State:
        """After `epoch` finished epochs (0: the start): grow (planned, or a request), checkpoint, go on."""
        best = bool(self.cfg.eval.restore_best and self.store) and self.rec.note_best(epoch)
        due = self.plan.due(epoch, self.rec.history, len(self.specs))
        left = self.plan.growing_until - epoch  # epochs the net may still grow in (grow.joint's phase follows)
        self.requests.collect(wait=left == 1)  # one epoch left: a placement under way ends first, to train in it
        order = self.requests.take_prepared()  # placed during an epoch that could not pause
        waiting = not self.requests.orders.empty()
        if grow_at_boundary(bool(due), order is not None, waiting, self.engine.places_while_training, left,
                            self.growth.cache_due):  # fmt: skip
            return Growing(epoch, None, steps=tuple(due), source=self.plan.policy, order=order)
        spread = self.topology.expand_due() if self.store and epoch < self.plan.total_epochs else None
        if spread is not None:  # a shrunk run whose lost homes are back: its blocks go home, state carried over
            self.checkpoints.write(epoch, 0, best, wait=True)  # the restore below starts from it
            self.topology.record("expand", epoch, 0, "capacity is back: every block in its own actor again", spread)
            return Restoring(self.store.latest().path, "expand", layout=spread)  # type: ignore[union-attr]
        self.checkpoints.at_boundary(epoch, best=best)
        return self._next_epoch(epoch, 0)

    def _next_epoch(self, epoch: int, batch: int) -> State:
        """Train on from `batch` of epoch `epoch` + 1 (building a prefix cache first when one is due), or
        finish."""
        if batch == 0 and epoch == self._row_epoch > self._gated and self.epoch_gate is not None:
            self._gated = epoch
            self.epoch_gate(epoch)
            if self.stop_reason is not None:  # stopped while the gate waited: train nothing more
                self.error = f"stopped: {self.stop_reason}"
                return Errored(self.error)
        if batch == 0 and epoch >= self.plan.total_epochs:
            return self._finish()
        nxt = Training(epoch + 1, batch)
        self.growth.joint_if_due(epoch)  # grow.joint: every block learns from its first epoch on
        return Caching(nxt) if self.growth.cache_due else nxt

    def _after_restore(self, manifest: dict[str, Any]) -> State:
        """Where a restored run goes on. A boundary checkpoint is written after that boundary's growth, so
        nothing grows twice."""
        return self._next_epoch(manifest["epoch"], manifest["batch"])

    # ---- epochs ---------------------------------------------------------------------------------------
    def _end_epoch(self, epoch: int, parts: list[StageStats], samples: int, seconds: float) -> None:
        stats = merge_by_stage(parts)
        if idle := learned_nothing(stats):  # before the epoch's row and any checkpoint after it
            raise NonFiniteError(idle, SKIP_HINT, epoch=epoch)
        losses, skipped = self.rec.add_epoch(stats, samples, seconds)
        self.feed.open = False  # no progress bar from here: the epoch's line comes next
        t0 = time.perf_counter()
        ev = self.last_eval = self.engine.evaluate()
        eval_seconds = time.perf_counter() - t0
        depth = len(self.specs)
        row = epoch_row(epoch, self.cfg, depth, depth - len(self.rec.frozen), losses, ev, samples, seconds, skipped)
        row.update(eval_seconds=round(eval_seconds, 4), checkpoint_seconds=0.0, eval_bytes=ev.get("eval_bytes"))
        self.rec.history.append(row)
        self._row_epoch = epoch
        note_epoch(self.rec.growth, row)
        if self.engine.stage_table:
            notify(self.callbacks, "after_epoch_stages", epoch, [s.row() for s in stats], say=self.say)
        notify(self.callbacks, "after_epoch", row, say=self.say)

    def position(self) -> dict[str, int] | None:
        """Where the running epoch is: {epoch, epochs, batch, batches}; None outside an epoch."""
        return self.feed.position(self._training_epoch(), self.plan.total_epochs)

    def _training_epoch(self) -> int | None:
        return self.state.epoch if isinstance(self.state, Training) else None

    # ---- growth ---------------------------------------------------------------------------------------
    def grow(self, request: dict[str, Any]) -> dict[str, Any]:
        """Append a block to this running job (from any thread; blocks until it is attached or refused): what
        was added, or {'error': message}, a bad request never disturbing the run. Validated like a config, placed
        and built while training goes on, attached (the earlier blocks frozen: grow.freeze) before the next batch
        the engine can pause at; one at a time, in arrival order (loop.orders.GrowRequests)."""
        return self.requests.submit(request, self)

    def next_spec(self, step: GrowStep, request: bool = False) -> BlockSpec:
        """The spec of the block `step` appends (`request`: a grow request's, refused in a request's terms)."""
        assert self.info is not None
        preserve = self.cfg.grow.init == "preserve"
        return plan_growth_block(self.cfg.net, self.info, self.specs[-1], step, preserve, request)

    # ---- the record a checkpoint keeps ----------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The run's record as a checkpoint manifest keeps it (without position and shards)."""
        assert self.info is not None
        return {
            "run": self.run_name,
            "config": self.cfg.model_dump(mode="json"),
            "input": self.info.to_dict(),
            "topology": [s.to_dict() for s in self.specs],
            **self.rec.to_manifest(),
            "mlflow_run_id": next((rid for cb in self.callbacks if (rid := getattr(cb, "run_id", None))), None),
        }

    def _restore_record(self, manifest: dict[str, Any]) -> None:
        """Back to what `manifest` recorded: the record, the growth plan from it, the checkpoint numbering."""
        self.rec.restore(manifest)
        self.growth.restored()
        self.checkpoints.restored(manifest)
        self.last_eval = None

    # ---- the end --------------------------------------------------------------------------------------
    def _finish(self) -> State:
        extra = {"topology_changes": self.topology.changes, "checkpoints": self.store.root if self.store else None}
        self.result = self.ending.summary(self.last_eval, len(self.specs), extra, self.keep_net)
        self.ending.announce(self.result, self.final_net)  # after `result`: final() answers from on_finish on
        return Finished()

    def final_net(self) -> GrowableNet:
        """The trained net in this process (after FINISHED)."""
        return self.ending.built(self.info, self.specs)

    def final(self) -> dict[str, Any] | None:
        """After FINISHED: the topology, the input description and every block's state (None when the run
        did not finish, or was run without keep_net)."""
        return None if self.result is None else self.ending.exported(self.info, self.specs)

    def shutdown(self, reason: str | None = None) -> None:
        """Release everything now (from another thread: the driver stops a run midway, `reason` says why).
        A run that had not ended is recorded as stopped: KILLED in MLflow, nothing logged after."""
        if reason and not self.state.terminal:
            self._stopped(reason)
        self.requests.close(f"run {self.run_name!r} was stopped; nothing to grow")
        self.engine.stop()

    def _stopped(self, reason: str) -> None:
        self.requests.close(f"run {self.run_name!r} is stopping ({reason}); nothing to grow")  # none queued after
        if self.stop_reason is None:
            self.stop_reason = reason
            self.say(f"stop   {reason}")
            notify(self.callbacks, "on_stop", reason, say=self.say)

    def status(self) -> dict[str, Any]:
        """A small snapshot: state, the epoch running (or the last finished), blocks."""
        state = self.state
        return {
            "run": self.run_name,
            "state": state.name,
            "epoch": state.epoch if isinstance(state, Training) else len(self.rec.history),
            "blocks": [s.index for s in self.specs],
            "nodes": list(self.topology.nodes),
            "error": self.error,
        }
