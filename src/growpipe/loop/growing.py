"""Growth at a boundary (the loop's GROWING state): the planned steps due there and the grow requests ready
(loop.orders.GrowRequests), each block placed and built by the engine, attached and recorded; then, once the
earlier blocks are frozen, the newest one may train from their cached outputs (CACHING)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from growpipe.config import GrowStep, RunConfig
from growpipe.errors import ConfigError
from growpipe.growth import GrowthPlan, grow_refusal, growth_event, preserve_plan_problem
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine, Prepared
from growpipe.loop.orders import GrowingRun, GrowRequests
from growpipe.loop.record import RunRecord
from growpipe.loop.states import Growing
from growpipe.nn.specs import BlockSpec, InputInfo

Attacher = Callable[[Prepared, GrowStep], dict[str, Any]]
Accuracies = tuple[float | None, float | None]
"""(test, validation) accuracy of the full path."""


class Growth:
    """Appends blocks to a run's net: what the growth plan says is due and what was requested. The net's blocks
    are the run's (`run.specs`, a GrowingRun); this keeps the plan, the record of each growth in `rec`, and
    whether a prefix cache is due before the next epoch."""

    def __init__(self, cfg: RunConfig, engine: Engine, run_name: str, rec: RunRecord, requests: GrowRequests,
                 callbacks: list[RunCallback], say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.engine, self.run_name, self.rec = cfg, engine, run_name, rec
        self.requests, self.callbacks, self.say = requests, callbacks, say
        self.plan = GrowthPlan(cfg)
        self.cache_due = False  # the net grew with its earlier blocks frozen: cache their outputs first
        self._measured: tuple[tuple[int, int | None, int], Accuracies] | None = None  # (epoch, batch, depth), accs
        self._thawed = False  # grow.joint's phase began in this process

    def check_plan(self, info: InputInfo, specs: list[BlockSpec]) -> None:
        """At the start: ConfigError when a planned step cannot start as grow.init asks (preserve)."""
        if why := preserve_plan_problem(self.cfg, info, specs):
            raise ConfigError(why)

    def grow(self, g: Growing, run: GrowingRun) -> bool:
        """The growth of boundary `g`: the request prepared while the epoch ran (first: its block was built on
        the net as it is), its planned steps (a step the grow limit stops is skipped, one that cannot be placed
        ends the run), and, between epochs, every request waiting now. Whether the net grew."""
        grew = False
        requests = self.requests
        if g.order is not None and g.resume is None and self.plan.in_joint(g.epoch):  # placed too late to train
            requests.refuse(g.order, self.joint_refusal())
        elif g.order is not None:
            grew = requests.attach(g.order, len(run.specs), self._attacher(run.specs, g.epoch, g.batch))
        for step in g.steps:
            if why := grow_refusal(self.run_name, len(run.specs), self.requests.pending, self.cfg.max_blocks()):
                self.skip_planned(step, g.source, g.epoch, why)
                continue
            self.attach(run.specs, self.engine.prepare_block(run.next_spec(step)), step, g.source, g.epoch, g.batch)
            grew = True
        if g.resume is None:  # between epochs: the requests waiting now
            while (order := requests.next_order()) is not None:
                if requests.prepare(order, run):
                    grew = requests.attach(order, len(run.specs), self._attacher(run.specs, g.epoch, None)) or grew
        return grew

    def _attacher(self, specs: list[BlockSpec], epoch: int, batch: int | None) -> Attacher:
        return lambda prepared, step: self.attach(specs, prepared, step, "request", epoch, batch)

    def attach(self, specs: list[BlockSpec], prepared: Prepared, step: GrowStep, source: str, epoch: int,
               batch: int | None) -> dict[str, Any]:  # fmt: skip
        """Attach a prepared block after the last of `specs` (freezing the others when grow.freeze) and record
        it; `epoch` finished epochs, `batch` batches into the next (None: at the boundary). Returns the event."""
        depth = len(specs)
        freeze = self.cfg.grow.freeze
        (before, val_before), before_s = self.accuracy_now(epoch, batch, depth)
        self.engine.attach_block(prepared, freeze)
        if freeze:
            self.rec.frozen |= set(range(depth))
            sums = self.engine.checksums()
            self.rec.watch.note({i: sums[i] for i in range(depth)})
            self.cache_due = self.cfg.grow.cache.enabled and prepared.cacheable
        event = growth_event(epoch, step, depth + 1, self.rec.history, source, batch)
        event.update(block=prepared.spec.index, family=prepared.spec.encoder.family, where=prepared.where)
        if self.cfg.grow.eval_at_growth:
            (after, val_after), after_s = self.accuracy_now(epoch, batch, depth + 1)
            event.update(acc_just_before=before, acc_just_after=after, val_just_before=val_before,
                         val_just_after=val_after, eval_seconds=round(before_s + after_s, 4))  # fmt: skip
        specs.append(prepared.spec)
        self.plan.grew(epoch)
        self.rec.best = None  # model selection starts again on the grown net
        self.rec.growth.append(event)
        notify(self.callbacks, "on_growth", event, say=self.say)
        return event

    def accuracy_now(self, epoch: int, batch: int | None, depth: int) -> tuple[Accuracies, float]:
        """The (test, validation) accuracy of the net as it is now, `depth` blocks after `epoch` finished epochs
        and `batch` batches into the next (grow.eval_at_growth; Nones when off, the validation one without a
        validation split), and the seconds its evaluation took here: the evaluation made at this very point (the
        epoch's row, the growth just before: 0 s), else one now."""
        if not self.cfg.grow.eval_at_growth:
            return (None, None), 0.0
        key = (epoch, batch, depth)
        if self._measured is not None and self._measured[0] == key:
            return self._measured[1], 0.0
        rows = self.rec.history
        if batch is None and rows and (rows[-1]["epoch"], rows[-1]["blocks"]) == (epoch, depth):
            return (rows[-1]["test_accuracy"], rows[-1].get("val_accuracy")), 0.0
        t0 = time.perf_counter()
        ev = self.engine.evaluate()
        self._measured = (key, (ev["full_accuracy"], ev.get("val_accuracy")))
        return self._measured[1], time.perf_counter() - t0

    def skip_planned(self, step: GrowStep, source: str, epoch: int, why: str) -> None:
        """A planned step the grow limit stops (a request took its place): said once, recorded, the run goes on."""
        self.rec.growth_skipped.append({"epoch": epoch, "kind": step.kind, "group": step.group, "width": step.width,
                                        "source": source, "reason": why})  # fmt: skip
        self.say(f"grow   planned {step.kind} step after epoch {epoch} skipped: {why}")

    def cache(self, epoch: int) -> None:
        """Let the newest block train from the frozen prefix's stored outputs from epoch `epoch` + 1 on (the
        engine says where, or that it cannot)."""
        record = self.engine.cache_prefix()
        self.cache_due = False
        if record is None:
            return
        record = {"epoch": epoch, **record}
        self.rec.caches.append(record)
        k = record["block"]
        self.say(f"cache  block {k} trains from the frozen prefix's outputs ({record['where']}, computed in "
                 f"{record['seconds']:.1f}s); blocks 0-{k - 1} stop computing")  # fmt: skip

    def joint_if_due(self, epoch: int) -> None:
        """Before epoch `epoch` + 1 trains: from grow.joint's first epoch on, every block learns (the frozen ones
        too) at a lower learning rate, from the data again (no prefix cache), and no request grows the net. Once:
        a run restored inside the phase has blocks whose states carry it."""
        joint = self.cfg.grow.joint
        if joint is None or not self.plan.in_joint(epoch) or self._thawed:
            return
        self.requests.close(self.joint_refusal())
        self._thawed = True  # in this process: its engine drops a standby it started, once
        if self.rec.joint is not None:
            self.engine.thaw(joint.lr_factor)  # the blocks' states carry it already
            return
        thawed = sorted(self.rec.frozen)
        unchanged = self.rec.watch.thawed(self.engine.checksums()) if thawed else None
        self.engine.thaw(joint.lr_factor)
        self.rec.frozen, self.cache_due = set(), False
        self.rec.joint = {"epoch": epoch, "lr_factor": joint.lr_factor, "thawed": thawed,
                          "frozen_unchanged": unchanged}  # fmt: skip
        self.say(f"joint  from epoch {epoch + 1}: every block learns at {joint.lr_factor:g}x its learning rate"
                 + (f" (blocks {', '.join(map(str, thawed))} thawed)" if thawed else ""))  # fmt: skip

    def joint_refusal(self) -> str:
        """What a grow request gets once grow.joint's phase began (or its block was placed too late to train)."""
        return (f"run {self.run_name!r} is in its joint phase (grow.joint, epochs after {self.plan.growing_until}): "
                "every block trains, the net does not grow")  # fmt: skip

    def restored(self) -> None:
        """After `rec` came back from a checkpoint: the plan counts from its newest growth, and a frozen prefix
        is cached again (a restored engine holds no cache)."""
        self.plan.grew(self.rec.growth[-1]["epoch"] if self.rec.growth else 0)
        self._measured, self._thawed = None, False  # a restored engine: the joint phase's thaw (if due) again
        self.requests.reopen(self.joint_refusal())  # restored to before the phase: it grows again until then
        self.cache_due = self.cfg.grow.cache.enabled and bool(self.rec.frozen)
