"""The end of a run: model selection (back to the best epoch's checkpoint), the result JSON, and the trained
net, gathered only where one is asked for (a block may be as big as its worker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from growpipe.checkpoint import CheckpointStore
from growpipe.config import RunConfig
from growpipe.loop.callbacks import RunCallback, notify, wants_final_net
from growpipe.loop.engine import Engine
from growpipe.loop.record import RunRecord
from growpipe.nn.inference import chosen_threshold
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.report import summarize


def select_best(rec: RunRecord, store: CheckpointStore | None, engine: Engine,
                say: Callable[[str], None]) -> tuple[int | None, bool]:  # fmt: skip
    """Model selection at the end: back to the best epoch's checkpoint when a later epoch was worse on the
    validation split. Returns (the epoch whose net the result is, None without a validation split; whether the
    engine's blocks were restored)."""
    last = rec.history[-1] if rec.history else None
    if last is None or last["val_accuracy"] is None:
        return None, False
    best = rec.best
    if best is None or best["path"] is None or best["epoch"] == last["epoch"] or store is None:
        return last["epoch"], False
    manifest = store.read_manifest(best["path"])
    engine.restore(store, best["path"], manifest["shards"])
    say(f"best   epoch {best['epoch']} (val {best['val_accuracy']:.4f}) restored: the last, epoch "
        f"{last['epoch']}, had val {last['val_accuracy']:.4f}")  # fmt: skip
    return int(best["epoch"]), True


def run_summary(cfg: RunConfig, engine: Engine, rec: RunRecord, depth: int, ev: dict[str, Any],
                extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The result JSON (report.summarize) with the engine's figures, the per-stage totals, and `extra`."""
    summary = summarize(cfg, depth, rec.history, rec.growth, ev, rec.train_seconds, rec.samples)
    summary["runtime"] = engine.name
    if engine.stage_table:
        rows = [rec.totals[i].row() for i in sorted(rec.totals)]
        hops = sorted(r["hop_ms_median"] for r in rows if r["hop_ms_median"] is not None)
        summary["stages"] = rows
        summary["hop_overhead_ms"] = hops[len(hops) // 2] if hops else None
    summary.update(engine.extras())
    # after a joint phase: whether the frozen blocks stayed bit-identical until it thawed them
    unchanged = rec.joint["frozen_unchanged"] if rec.joint else rec.watch.unchanged(engine.checksums())
    summary["frozen_unchanged"] = unchanged
    summary.update(growth_skipped=rec.growth_skipped, prefix_caches=rec.caches, restarts=rec.restarts, joint=rec.joint,
                   **extra)  # fmt: skip
    return summary


class Ending:
    """The end of a run (FINISHED): model selection, the result JSON and the trained net, the engine's own (the
    reference trainer) or built here from every block's state once gathered from the workers."""

    def __init__(self, cfg: RunConfig, engine: Engine, store: CheckpointStore | None, rec: RunRecord,
                 callbacks: list[RunCallback], say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.engine, self.store, self.rec, self.callbacks, self.say = cfg, engine, store, rec, callbacks, say
        self.states: list[dict[str, Any]] | None = None
        self.net: GrowableNet | None = None

    def summary(self, last_eval: dict[str, Any] | None, depth: int, extra: dict[str, Any],
                keep_net: bool) -> dict[str, Any]:  # fmt: skip
        """The result JSON of a net of `depth` blocks (`last_eval`: the last epoch's evaluation, None: evaluate
        now), with `extra` and the callbacks' fields; every block's state is gathered first when `keep_net` or a
        callback wants the net (a block may be as big as its worker)."""
        selected, restored = select_best(self.rec, self.store, self.engine, self.say)
        ev = dict((None if restored else last_eval) or self.engine.evaluate())
        ev["early_exit"] = self.engine.measure_early_exit(chosen_threshold(ev, self.cfg.eval.exit_threshold))
        summary = run_summary(self.cfg, self.engine, self.rec, depth, ev, {"selected_epoch": selected, **extra})
        for fields in notify(self.callbacks, "result_fields", say=self.say):
            summary.update(fields or {})
        wanted = keep_net or any(wants_final_net(cb) for cb in self.callbacks)
        if self.engine.net is None and wanted:
            self.states = self.engine.final_states()
        return summary

    def announce(self, summary: dict[str, Any], net: Callable[[], GrowableNet]) -> None:
        """Hand the result to the callbacks, and the trained net (`net()`) to those that want it."""
        notify(self.callbacks, "on_finish", summary, say=self.say)
        if wanting := [cb for cb in self.callbacks if wants_final_net(cb)]:
            notify(wanting, "on_final_net", net(), summary, say=self.say)

    def built(self, info: InputInfo | None, specs: list[BlockSpec]) -> GrowableNet:
        """The trained net in this process."""
        if self.net is None:
            self.net = self.engine.net
        if self.net is None:
            assert info is not None and self.states is not None
            self.net = GrowableNet.from_states(self.cfg.rule(), info, [s.to_dict() for s in specs], self.states)
        return self.net

    def exported(self, info: InputInfo | None, specs: list[BlockSpec]) -> dict[str, Any] | None:
        """The topology, the input description and every block's state (None: nothing was gathered)."""
        if self.states is None and self.engine.net is None:
            return None
        states = self.states if self.states is not None else self.built(info, specs).state_dict()["blocks"]
        return {"topology": [s.to_dict() for s in specs], "info": info, "states": states}
