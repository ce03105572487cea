"""The run loop's components on their own, without Ray and without a loop driving them: growth at a boundary
(loop.growing), restore points (loop.checkpointing) and what follows a failure (loop.recovery). The engine is
tests/test_loop.py's FakeEngine; the run whose blocks grow is a RunLoop started one step (its first blocks)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from growpipe.checkpoint import CheckpointStore
from growpipe.config import GrowStep
from growpipe.errors import CheckpointError, NonFiniteError
from growpipe.loop import checkpointing
from growpipe.loop.callbacks import RunCallback
from growpipe.loop.checkpointing import Checkpointer
from growpipe.loop.engine import WorkerLost
from growpipe.loop.growing import Growth
from growpipe.loop.loop import RunLoop
from growpipe.loop.orders import GrowRequests
from growpipe.loop.record import RunRecord
from growpipe.loop.recovery import Recovery
from growpipe.loop.states import Errored, Growing, Restoring, Starting, Training
from tests.test_loop import FakeEngine, _cfg

LAYER = GrowStep(kind="layer")


class Heard(RunCallback):
    """What the callbacks were told."""

    def __init__(self) -> None:
        self.growth: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.checkpoints: list[dict[str, Any]] = []

    def on_growth(self, event):
        self.growth.append(event)

    def on_error(self, message):
        self.errors.append(message)

    def on_checkpoint(self, checkpoint):
        self.checkpoints.append(checkpoint)


def _started(cfg, engine: FakeEngine) -> RunLoop:
    """A run with its first blocks built (STARTING done): the run whose net a Growth appends to."""
    run = RunLoop(cfg, engine)
    run.step()
    assert isinstance(run.state, Training) and len(run.specs) == 2
    return run


def _growth(cfg, engine: FakeEngine) -> tuple[Growth, RunRecord, Heard, list[str]]:
    rec, heard, lines = RunRecord(), Heard(), []
    requests = GrowRequests(cfg, engine, "r", lines.append)
    return Growth(cfg, engine, "r", rec, requests, [heard], lines.append), rec, heard, lines


def _queue(growth: Growth, run: RunLoop, request: dict, answers: list[dict]) -> threading.Thread:
    """A caller's request from a thread of its own (it waits for its answer); returned once it is queued."""
    asker = threading.Thread(target=lambda: answers.append(growth.requests.submit(request, run)))
    asker.start()
    deadline = time.monotonic() + 10
    while growth.requests.orders.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    return asker


def test_growth_attaches_the_planned_step_records_it_and_skips_the_one_past_the_limit():
    cfg = _cfg(grow={"max_blocks": 3})
    engine = FakeEngine()
    run = _started(cfg, engine)
    growth, rec, heard, lines = _growth(cfg, engine)
    rec.best = {"epoch": 2, "val_accuracy": 0.5, "path": "somewhere"}
    assert growth.grow(Growing(2, None, steps=(LAYER, LAYER), source="schedule"), run)
    assert [s.index for s in run.specs] == [0, 1, 2] and engine.depth == 3 and ("attach", 2, True) in engine.calls
    (event,) = rec.growth
    assert heard.growth == [event]
    assert [event[k] for k in ("epoch", "batch", "blocks", "block", "source")] == [2, None, 3, 2, "schedule"]
    assert rec.frozen == {0, 1} and rec.watch.at_freeze == {0: "sum0", 1: "sum1"}
    assert rec.best is None and growth.plan.last_growth_epoch == 2  # model selection and the plan start again
    assert growth.cache_due  # grow.cache.enabled, a block that can read a cache
    why = "run 'r' is at grow.max_blocks=3 blocks"
    assert rec.growth_skipped == [{"epoch": 2, "kind": "layer", "group": None, "width": None, "source": "schedule",
                                   "reason": why}]  # fmt: skip
    assert lines == [f"grow   planned layer step after epoch 2 skipped: {why}"]
    assert not growth.grow(Growing(3, None), run)  # nothing due, nothing waiting: the net stays


def test_growth_serves_the_waiting_requests_between_epochs_but_not_in_a_paused_epoch():
    cfg = _cfg(grow={"max_blocks": 4, "freeze": False})
    engine = FakeEngine()
    run = _started(cfg, engine)
    growth, rec, _, _ = _growth(cfg, engine)
    answers: list[dict] = []
    asker = _queue(growth, run, {"kind": "layer"}, answers)
    paused = Growing(1, 4, resume=Training(2, 4))
    assert not growth.grow(paused, run) and not growth.requests.orders.empty()  # waits for the boundary
    assert growth.grow(Growing(1, None), run)
    asker.join(10)
    assert answers[0]["block"] == 2 and answers[0]["blocks"] == 3 and answers[0]["source"] == "request"
    assert rec.frozen == set() and not growth.cache_due  # grow.freeze off: nothing frozen, nothing to cache
    assert growth.requests.pending == 0


def test_growth_caches_the_frozen_prefix_and_comes_back_from_a_restored_record():
    class Caching(FakeEngine):
        def cache_prefix(self):
            return {"block": 2, "where": "in memory", "seconds": 0.25}

    cfg = _cfg()
    growth, rec, _, lines = _growth(cfg, Caching())
    growth.cache_due = True
    growth.cache(3)
    assert not growth.cache_due and rec.caches == [{"epoch": 3, "block": 2, "where": "in memory", "seconds": 0.25}]
    assert lines[-1].startswith("cache  block 2 trains from the frozen prefix's outputs (in memory")
    plain, rec, _, lines = _growth(cfg, FakeEngine())
    plain.cache(1)  # the engine cannot cache: nothing recorded, nothing said
    assert rec.caches == [] and lines == []
    rec.growth, rec.frozen = [{"epoch": 1}, {"epoch": 4}], {0, 1}
    plain.restored()
    assert plain.plan.last_growth_epoch == 4 and plain.cache_due  # a restored engine holds no cache


def _checkpointer(tmp_path: Path | None, **cfg: Any) -> tuple[Checkpointer, RunRecord, Heard, FakeEngine]:
    rec, heard, engine = RunRecord(), Heard(), FakeEngine()
    store = CheckpointStore(str(tmp_path), "r", keep=1) if tmp_path else None
    ck = Checkpointer(_cfg(**cfg), store, engine, "r", rec, lambda: {"history": rec.history}, [heard],
                      say=lambda _line: None)  # fmt: skip
    return ck, rec, heard, engine


def test_the_checkpointer_counts_no_time_when_no_write_is_under_way(monkeypatch: pytest.MonkeyPatch):
    clock = iter(range(0, 1000, 7))  # a slow machine: every read of the clock a whole 7 s later than the last
    monkeypatch.setattr(checkpointing, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    off, rec, _, _ = _checkpointer(None)
    rec.history.append({"epoch": 1, "checkpoint_seconds": 0.0})
    assert off.write(1, 0) is None and not off.timing.enabled
    assert off.settle() == 0.0 and rec.history[-1]["checkpoint_seconds"] == 0.0


def test_the_checkpointer_writes_numbered_restore_points_and_keeps_the_best_from_pruning(tmp_path: Path):
    ck, rec, heard, _ = _checkpointer(tmp_path)
    store = ck.store
    assert store is not None
    rec.history.append({"epoch": 1, "checkpoint_seconds": 0.0})
    rec.best = {"epoch": 1, "val_accuracy": 0.9, "path": None}
    assert ck.write(1, 0, best=True) >= 0
    best = rec.best["path"]
    assert best == heard.checkpoints[0]["path"] and store.protected == {best}
    assert rec.history[-1]["checkpoint_seconds"] > 0  # its time counts in the newest epoch's row
    ck.write(2, 0)
    ck.write(3, 0)
    assert [r["seq"] for r in heard.checkpoints] == [1, 2, 3]
    assert Path(best).is_dir() and len(store.complete()) == 2  # kept past keep=1: it is the best epoch's
    rec.best = None  # the net grew: model selection starts again
    ck.write(3, 5)
    assert store.protected == set() and not Path(best).exists()
    later, _, _, _ = _checkpointer(tmp_path)
    later.restored(store.read_manifest(heard.checkpoints[-1]["path"]))
    assert later.seq == 4  # numbering goes on past every folder of the run


def test_the_checkpointer_decides_a_boundarys_restore_point(tmp_path: Path):
    ck, rec, heard, _ = _checkpointer(tmp_path, train={"epochs": 5}, checkpoint={"every_epochs": 2})
    ck.start()
    for epoch in range(1, 6):
        ck.at_boundary(epoch)  # every_epochs=2, and the last epoch
    ck.at_boundary(1, grew=True)  # the net grew: always
    ck.at_boundary(3, paused_at=4)  # an epoch paused for nothing that grew: none
    ck.at_boundary(3, paused_at=4, grew=True)
    rec.best = {"epoch": 3, "val_accuracy": 0.5, "path": None}
    ck.at_boundary(3, best=True)  # the best epoch so far: always
    written = [(c["epoch"], c["batch"]) for c in heard.checkpoints]
    assert written == [(0, 0), (2, 0), (4, 0), (5, 0), (1, 0), (3, 4), (3, 0)]
    assert rec.best["path"] == heard.checkpoints[-1]["path"]


def test_a_fresh_start_clears_an_earlier_runs_folders_only_with_overwrite(tmp_path: Path):
    first, _, _, _ = _checkpointer(tmp_path)
    first.start()
    again, _, _, _ = _checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match="already has 1 checkpoint"):
        again.check_fresh()
    replace, _, heard, _ = _checkpointer(tmp_path, checkpoint={"overwrite": True})
    replace.check_fresh()
    replace.start()
    assert [c["seq"] for c in heard.checkpoints] == [1]
    assert len(CheckpointStore(str(tmp_path), "r").complete()) == 1  # the earlier run's folder is gone


def _recovery(tmp_path: Path | None, limit: int = 3) -> tuple[Recovery, RunRecord, Heard, list[str]]:
    rec, heard, lines = RunRecord(), Heard(), []
    cfg = _cfg(runtime={"max_stage_restarts": limit}, checkpoint={"enabled": tmp_path is not None})
    store = CheckpointStore(str(tmp_path), "r") if tmp_path else None
    return Recovery(cfg, store, rec, [heard], lines.append), rec, heard, lines


def test_recovery_ends_the_run_when_nothing_can_be_retried():
    recovery, rec, heard, _ = _recovery(None)
    state, failure = recovery.after(WorkerLost("stage 1 died"), Training(2), None)
    assert state == Errored("stage 1 died; no checkpoint to recover from (checkpoint.enabled is false)")
    assert heard.errors == [state.message] and rec.restarts == 0
    lost = NonFiniteError("loss is nan", "lower train.lr", where="block 1")
    state, failure = recovery.after(lost, Training(3), None)
    assert isinstance(failure, NonFiniteError) and failure.epoch == 3  # located in the epoch that ran
    assert isinstance(state, Errored) and state.message == str(failure)
    state, failure = recovery.after(WorkerLost("gone"), Training(2), "SIGTERM")
    assert state == Errored("stopped: SIGTERM") and len(heard.errors) == 2  # a stop is no error to report


def test_recovery_goes_back_to_the_newest_checkpoint_while_restarts_are_left(tmp_path: Path):
    ck, _, _, _ = _checkpointer(tmp_path)
    ck.write(1, 0)
    latest = ck.store.latest().path
    recovery, rec, heard, lines = _recovery(tmp_path, limit=1)
    state, _ = recovery.after(WorkerLost("stage 1 died"), Training(2), None)
    assert state == Restoring(latest, "stage 1 died") and rec.restarts == 1 and not heard.errors
    assert lines == [f"recover stage 1 died; restart 1/1: every block back to {Path(latest).name}"]
    state, _ = recovery.after(WorkerLost("stage 1 died"), Training(2), None)
    assert "giving up after 1 restart(s)" in state.message and heard.errors == [state.message]
    fresh, _, _, _ = _recovery(tmp_path)
    state, _ = fresh.after(WorkerLost("no room"), Starting(), None)
    assert isinstance(state, Errored)  # a fresh start has no restore point of its own
