"""The run loop a step at a time with a fake engine (no Ray, no torch training): planned growth, a grow
request mid-epoch, the grow limit under concurrent requests, a lost worker and the retry, resume; and the
policies it asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from growpipe.checkpoint import CheckpointStore
from growpipe.errors import CheckpointError
from growpipe.growth import grow_refusal
from growpipe.loop.callbacks import RunCallback
from growpipe.loop.engine import EpochPart, Pause, Prepared, WorkerLost
from growpipe.loop.loop import RunLoop
from growpipe.loop.policies import (
    CheckpointTiming,
    Raise,
    Retry,
    better_epoch,
    decide_failure,
    grow_at_boundary,
    pack_host,
    want_standby,
)
from growpipe.loop.progress import PositionFeed
from growpipe.loop.record import RunRecord
from growpipe.loop.stats import StageStats, merge_by_stage
from growpipe.nn.specs import InputInfo
from growpipe.runtime.names import stage_actor_name
from tests.conftest import tiny_config

BATCHES = 10


class FakeEngine:
    """Counts batches instead of training; records what the loop asked it to do."""

    name = "fake"
    stage_table = True
    places_while_training = False
    net = "the fake net"  # the loop hands it to the callbacks as it is

    def __init__(self, fail_at: tuple[int, int] | None = None, on_batch=None):
        self.fail_at = fail_at  # (epoch, batch) where a worker is lost, once
        self.on_batch = on_batch  # called with (epoch, batch) before each batch
        self.trained: list[tuple[int, int, int]] = []  # (epoch, batch, blocks) of every batch trained
        self.calls: list[tuple] = []
        self.depth = 0
        self.gate: threading.Event | None = None  # prepare_block waits on it when set
        self.preparing = threading.Event()

    def open(self, layout):
        self.calls.append(("open",))
        return InputInfo((4,), "float", 3), {"summary": "fake data"}

    def build(self, specs, layout):
        self.depth = len(specs)
        self.calls.append(("build", len(specs)))
        return f"fake net of {len(specs)} blocks"

    def run_epoch(self, epoch, start_batch, stop_at, pause):
        self.calls.append(("run_epoch", epoch, start_batch, stop_at))
        stats = StageStats(0, "fake")
        for b in range(start_batch, BATCHES):
            if self.on_batch:
                self.on_batch(epoch, b)
            if (stop_at is not None and b >= stop_at) or pause.check():
                return EpochPart([stats], stats.samples, b)
            if self.fail_at == (epoch, b):
                self.fail_at = None
                raise WorkerLost("stage 1 died (killed)")
            self.trained.append((epoch, b, self.depth))
            stats.samples += 8
            stats.batches += 1
            stats.add_losses({f"b{self.depth - 1}.loss": 1.0 / epoch})
        return EpochPart([stats], stats.samples, None)

    def prepare_block(self, spec):
        self.preparing.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.calls.append(("prepare", spec.index))
        return Prepared(spec, f"worker {spec.index}")

    def attach_block(self, block, freeze):
        self.depth += 1
        self.calls.append(("attach", block.spec.index, freeze))

    def discard_block(self, block):
        self.calls.append(("discard", block.spec.index))

    def cache_prefix(self):
        return None

    def evaluate(self):
        k = self.depth
        return {"full_accuracy": 0.5, "exit_depths": list(range(1, k + 1)), "exit_accuracy": [0.5] * k,
                "macs_per_exit": [1] * k, "adaptive": [], "confidence": "max_prob", "val_accuracy": None}  # fmt: skip

    def measure_early_exit(self, threshold):
        self.calls.append(("early_exit", threshold))
        return {"threshold": threshold, "accuracy": 0.5}

    def checksums(self):
        return {i: f"sum{i}" for i in range(self.depth)}

    def save(self, store, ckpt_dir):
        Path(ckpt_dir).mkdir(parents=True)
        self.calls.append(("save", Path(ckpt_dir).name))
        return []

    def layout(self):
        return {}

    def restore(self, store, ckpt_dir, shards):
        self.calls.append(("restore", Path(ckpt_dir).name))

    def recover(self, specs, layout):
        self.depth = len(specs)
        self.calls.append(("recover", len(specs)))
        return "recovered"

    def final_states(self):
        return []

    def topology(self):
        return None

    def position(self):
        return None

    def extras(self):
        return {}

    def stop(self):
        self.calls.append(("stop",))


class States(RunCallback):
    def __init__(self):
        self.names: list[str] = []

    def on_state_change(self, prev, nxt):
        self.names.append(nxt.name)


def _cfg(**extra):
    return tiny_config(name="fake", **extra)


def _loop(cfg, engine, tmp_path: Path | None = None, **kw):
    store = CheckpointStore(str(tmp_path), cfg.name) if tmp_path else None
    states = States()
    return RunLoop(cfg, engine, store=store, callbacks=[states], **kw), states


def _ask_from_another_thread(loop: RunLoop, request: dict, keep: Callable[[dict], Any]) -> threading.Thread:
    """Send a grow request from a thread of its own (grow() waits for its answer, which goes to `keep`);
    return once the loop has accepted it (queued, or taken at once to be placed)."""
    asker = threading.Thread(target=lambda: keep(loop.grow(request)))
    asker.start()
    deadline = time.monotonic() + 10
    while loop.requests.pending == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return asker


def test_planned_growth_happens_after_its_epoch_and_the_new_block_trains_from_the_next():
    engine = FakeEngine()
    loop, states = _loop(_cfg(train={"epochs": 2}, grow={"schedule": [{"kind": "layer", "epochs": 1}]}), engine)
    result = loop.run()
    assert [(e, d) for e, b, d in engine.trained if b == 0] == [(1, 2), (2, 2), (3, 3)]
    assert [(g["epoch"], g["batch"], g["blocks"], g["source"]) for g in result["growth"]] == [(2, None, 3, "schedule")]
    assert ("attach", 2, True) in engine.calls
    assert states.names == ["training", "growing", "caching", "training", "finished"]
    assert [h["training"] for h in result["history"]] == [2, 2, 1]  # the earlier blocks frozen
    assert result["epochs"] == 3 and result["blocks"] == 3 and engine.calls[-1] == ("stop",)


def test_checkpoints_pause_the_epoch_at_every_batches_and_at_epoch_ends(tmp_path: Path):
    engine = FakeEngine()
    loop, _ = _loop(_cfg(train={"epochs": 1}, checkpoint={"enabled": True, "every_batches": 4}), engine, tmp_path)
    loop.run()
    runs = [c[1:] for c in engine.calls if c[0] == "run_epoch"]
    assert runs == [(1, 0, 4), (1, 4, 8), (1, 8, 12)]
    saves = [c[1] for c in engine.calls if c[0] == "save"]
    assert saves == ["ckpt-000000-0000000-0001", "ckpt-000000-0000004-0002", "ckpt-000000-0000008-0003",
                     "ckpt-000001-0000000-0004"]  # fmt: skip
    assert len(engine.trained) == BATCHES  # pausing loses no batch and repeats none


def test_a_request_mid_epoch_is_placed_while_training_goes_on_then_attached_at_the_next_batch():
    answers: list[dict] = []
    askers: list[threading.Thread] = []
    loop: RunLoop

    def ask(epoch, batch):
        if (epoch, batch) == (1, 3) and not askers:
            askers.append(_ask_from_another_thread(loop, {"kind": "layer", "width": 16}, answers.append))

    engine = FakeEngine(on_batch=ask)
    loop, states = _loop(_cfg(train={"epochs": 2}, grow={"max_blocks": 4}), engine)
    result = loop.run()
    askers[0].join(10)
    assert [d for e, b, d in engine.trained if e == 1] == [2] * 3 + [3] * 7  # batches 0-2, then the new block
    assert [d for e, b, d in engine.trained if e == 2] == [3] * BATCHES
    (event,) = result["growth"]
    assert (event["epoch"], event["batch"], event["source"], event["block"]) == (0, 3, "request", 2)
    assert answers and answers[0]["block"] == 2 and answers[0]["blocks"] == 3
    assert states.names[:3] == ["training", "growing", "training"]  # a request grows through GROWING too
    assert loop.grow({"kind": "layer"})["error"] == "run 'fake' has finished; nothing to grow"


def test_an_engine_that_places_while_training_trains_on_until_the_block_is_built():
    """Placement in a thread of its own: the block is held unbuilt (a gate) for three batches, which train
    meanwhile; the block is attached at the first batch after it is ready."""
    answers: list[dict] = []
    askers: list[threading.Thread] = []
    loop: RunLoop

    def ask(epoch, batch):
        if (epoch, batch) == (1, 2) and not askers:
            askers.append(_ask_from_another_thread(loop, {"kind": "layer"}, answers.append))
        if (epoch, batch) == (1, 6) and not engine.gate.is_set():
            assert engine.preparing.wait(10) and loop.requests._placing is not None
            placing = loop.requests._placing[1]
            engine.gate.set()
            placing.join(10)  # built: the pause is set, the engine stops before this batch

    engine = FakeEngine(on_batch=ask)
    engine.places_while_training = True
    engine.gate = threading.Event()
    loop, _ = _loop(_cfg(train={"epochs": 1}, grow={"max_blocks": 3}), engine)
    result = loop.run()
    askers[0].join(10)
    assert [d for e, b, d in engine.trained if e == 1][:6] == [2] * 6  # batches 3-5 trained during placement
    assert [d for e, b, d in engine.trained if e == 1][6:] == [3] * 4
    assert result["growth"][0]["batch"] == 6 and answers[0]["blocks"] == 3


@pytest.mark.parametrize(("epochs", "release"), [(3, (2, 4)), (3, (2, None)), (2, None)])
def test_a_request_waiting_at_an_epoch_boundary_is_placed_while_the_next_epoch_trains_unless_it_is_the_last(
    epochs: int, release: tuple[int, int | None] | None
):
    """A request accepted while epoch 1 is evaluated (no epoch runs, nothing is placed), its placement held
    (a gate): an engine that places while training trains epoch 2 meanwhile and attaches the block at the batch
    after the placement ends (released at batch 4 of epoch 2). A placement still under way when only one epoch
    is left (released once epoch 2 ended) is waited for at that boundary, and a request waiting there (2 epochs)
    is placed there: the block trains the whole last epoch."""
    answers: list[dict] = []
    askers: list[threading.Thread] = []
    loop: RunLoop

    class Evaluated(FakeEngine):
        places_while_training = True

        def evaluate(self):
            if not askers:
                askers.append(_ask_from_another_thread(loop, {"kind": "layer"}, answers.append))
                if release is None:
                    self.gate.set()  # held nowhere: placed at the boundary
            elif release == (2, None) and not self.gate.is_set():  # epoch 2 ended, its placement under way
                assert self.preparing.wait(10)
                self.gate.set()
            return super().evaluate()

    def let_go(epoch: int, batch: int) -> None:
        if (epoch, batch) == release:
            assert engine.preparing.wait(10)
            placing = loop.requests._placing
            engine.gate.set()
            if placing is not None:
                placing[1].join(10)  # built: the pause is set, the engine stops before this batch

    engine = Evaluated(on_batch=let_go)
    engine.gate = threading.Event()
    loop, _ = _loop(_cfg(train={"epochs": epochs}, grow={"max_blocks": 3}), engine)
    result = loop.run()
    askers[0].join(10)
    (event,) = result["growth"]
    assert answers[0]["blocks"] == 3 and [d for e, b, d in engine.trained if e == epochs] == [3] * BATCHES
    if release == (2, 4):  # attached within epoch 2, at the batch after the placement ended
        assert (event["epoch"], event["batch"]) == (1, 4)
        assert [d for e, b, d in engine.trained if e == 2] == [2] * 4 + [3] * 6
    else:  # at the boundary before the last epoch: placed there (2 epochs) or waited for there (3 epochs)
        assert (event["epoch"], event["batch"]) == (epochs - 1, None)


def test_a_pause_runs_a_forwarded_hook_once_whether_set_before_or_while_inside():
    calls: list[str] = []
    pause = Pause()
    with pause.forwarded(lambda: calls.append("inside")):
        assert calls == [] and not pause.requested
        pause.set()
        pause.set()
    assert calls == ["inside"] and pause.requested
    with pause.forwarded(lambda: calls.append("after")):  # set already: at once
        assert calls == ["inside", "after"]
    pause.set()
    assert calls == ["inside", "after"]
    left = Pause()
    with left.forwarded(lambda: calls.append("left")):
        pass
    left.set()
    assert calls == ["inside", "after"]  # a hook goes with the wait it was registered around
    ready = iter([False, True])
    between = Pause(lambda: next(ready))  # the loop's work between two batches: a block ready at the second
    assert not between.check() and between.check() and between.requested and between.check()


class WorkerEngine(FakeEngine):
    """Trains in its "workers": the first part of epoch 1 only waits until the pause is forwarded to them
    (nothing polls, no batch boundary passes on this thread), then says it stopped before batch 3."""

    places_while_training = True

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()
        self.told = threading.Event()

    def run_epoch(self, epoch, start_batch, stop_at, pause):
        if (epoch, start_batch) != (1, 0):
            return super().run_epoch(epoch, start_batch, stop_at, pause)
        self.calls.append(("run_epoch", epoch, start_batch, stop_at))
        with pause.forwarded(self.told.set):
            self.waiting.set()
            assert self.told.wait(10), "the grow request's pause never reached the workers"
        self.trained += [(epoch, b, self.depth) for b in range(3)]
        return EpochPart([StageStats(0, "fake", samples=24, batches=3)], 24, 3)


def test_a_request_is_placed_when_it_arrives_and_its_pause_is_forwarded_to_the_workers():
    engine = WorkerEngine()
    loop, _ = _loop(_cfg(train={"epochs": 1}, grow={"max_blocks": 3}), engine)
    answers: list[dict] = []

    def ask() -> None:
        assert engine.waiting.wait(10)
        answers.append(loop.grow({"kind": "layer"}))

    asker = threading.Thread(target=ask)
    asker.start()
    result = loop.run()
    asker.join(10)
    assert "error" not in result and answers and answers[0]["blocks"] == 3 and answers[0]["batch"] == 3
    assert [d for e, b, d in engine.trained] == [2] * 3 + [3] * 7  # the new block from batch 3 on
    assert ("prepare", 2) in engine.calls and result["growth"][0]["source"] == "request"


def test_two_requests_never_pass_grow_max_blocks_while_the_first_is_being_placed():
    """The first request is dequeued and its block is being placed (in neither the net nor the queue) when
    the second arrives: it must be refused, not attached as a fourth block."""
    answers: dict[str, dict] = {}
    askers: list[threading.Thread] = []
    loop: RunLoop

    def second() -> None:
        assert engine.preparing.wait(10)  # the loop took the first one and is placing its block
        answers["second"] = loop.grow({"kind": "layer"})  # answered at once, while the first is placed
        engine.gate.set()

    def ask(epoch, batch):
        if (epoch, batch) == (1, 2) and not askers:
            askers.append(_ask_from_another_thread(loop, {"kind": "layer"}, lambda a: answers.setdefault("first", a)))
            askers.append(threading.Thread(target=second))
            askers[1].start()

    engine = FakeEngine(on_batch=ask)
    engine.gate = threading.Event()
    loop, _ = _loop(_cfg(train={"epochs": 1}, grow={"max_blocks": 3}), engine)
    result = loop.run()
    for t in askers:
        t.join(10)
    assert "grow.max_blocks=3" in answers["second"]["error"]
    assert answers["first"]["blocks"] == 3 and result["blocks"] == 3 and engine.depth == 3


def test_the_grow_limit_stops_a_planned_step_a_request_took_the_room_of_and_the_run_goes_on(tmp_path: Path):
    """No grow.max_blocks: the limit is its documented default, net.blocks + len(grow.schedule) = 3. A request
    in epoch 1 takes the third block; the schedule's step after epoch 2 is skipped (said once, recorded), the
    step's epoch still runs and the boundary keeps its checkpoint."""
    answers: dict[str, dict] = {}
    askers: list[threading.Thread] = []
    loop: RunLoop

    def ask(epoch, batch):
        if (epoch, batch) == (1, 3) and not askers:
            askers.append(_ask_from_another_thread(loop, {"kind": "layer"}, lambda a: answers.setdefault("first", a)))
        if (epoch, batch) == (1, 5):
            answers["second"] = loop.grow({"kind": "layer"})  # refused at once: the net is at the limit

    cfg = _cfg(train={"epochs": 2}, grow={"schedule": [{"kind": "layer", "epochs": 1}]}, checkpoint={"enabled": True})
    assert cfg.grow.max_blocks is None and cfg.max_blocks() == 3
    lines: list[str] = []
    engine = FakeEngine(on_batch=ask)
    loop, _ = _loop(cfg, engine, tmp_path, say=lines.append)
    result = loop.run()
    askers[0].join(10)
    why = "run 'fake' is at grow.max_blocks=3 blocks"
    assert answers["first"]["blocks"] == 3
    assert answers["second"]["error"] == f"{why}; for more blocks, start or resume the run with --set grow.max_blocks=N"
    assert [(g["epoch"], g["batch"], g["source"]) for g in result["growth"]] == [(0, 3, "request")]
    assert result["blocks"] == 3 and engine.depth == 3 and result["epochs"] == 3
    assert [line for line in lines if "skipped" in line] == [f"grow   planned layer step after epoch 2 skipped: {why}"]
    skipped = [{"epoch": 2, "kind": "layer", "group": None, "width": None, "source": "schedule", "reason": why}]
    assert result["growth_skipped"] == skipped
    store = CheckpointStore(str(tmp_path), "fake")
    assert ("save", "ckpt-000002-0000000-0004") in engine.calls  # the boundary of the skipped step
    assert store.read_manifest(store.latest().path)["growth_skipped"] == skipped  # a resumed run keeps it


class ValEngine(FakeEngine):
    """A fake whose validation accuracy follows a script, one value per evaluation."""

    def __init__(self, vals):
        super().__init__()
        self.vals = list(vals)

    def evaluate(self):
        return {**super().evaluate(), "val_accuracy": self.vals.pop(0) if self.vals else 0.0}


def test_model_selection_restores_the_best_epoch_since_the_last_growth_and_keeps_its_checkpoint(tmp_path: Path):
    assert better_epoch(None, {"val_accuracy": 0.1}) and not better_epoch(0.5, {"val_accuracy": 0.4})
    assert better_epoch(0.5, {"val_accuracy": 0.5})  # a tie: the later epoch
    assert not better_epoch(None, {"val_accuracy": None})
    # epochs 1-4, a growth after epoch 2: epoch 1 (0.9) is the best overall but of the smaller net
    engine = ValEngine([0.9, 0.5, 0.8, 0.6, 0.8])  # 5 evaluations: 4 epochs, then the restored net
    cfg = _cfg(train={"epochs": 2}, data={"val_fraction": 0.1}, grow={"schedule": [{"kind": "layer", "epochs": 2}]},
               checkpoint={"enabled": True, "keep": 1})  # fmt: skip
    loop, _ = _loop(cfg, engine, tmp_path)
    result = loop.run()
    restores = [c[1] for c in engine.calls if c[0] == "restore"]
    assert result["selected_epoch"] == 3 and len(restores) == 1 and restores[0].startswith("ckpt-000003-")
    assert result["epochs"] == 4 and [h["val_accuracy"] for h in result["history"]] == [0.9, 0.5, 0.8, 0.6]
    # without a validation split, or with eval.restore_best off, the last epoch's net is the result
    plain = _loop(_cfg(train={"epochs": 2}, checkpoint={"enabled": True}), FakeEngine(), tmp_path / "p")[0].run()
    assert plain["selected_epoch"] is None
    off = _cfg(train={"epochs": 3}, data={"val_fraction": 0.1}, eval={"restore_best": False},
               checkpoint={"enabled": True})  # fmt: skip
    engine = ValEngine([0.9, 0.5, 0.4])
    assert _loop(off, engine, tmp_path / "o")[0].run()["selected_epoch"] == 3
    assert not [c for c in engine.calls if c[0] == "restore"]


def test_a_lost_worker_is_retried_from_the_newest_checkpoint_and_the_run_ends_as_planned(tmp_path: Path):
    engine = FakeEngine(fail_at=(2, 5))
    lines: list[str] = []
    loop, states = _loop(_cfg(train={"epochs": 3}, checkpoint={"enabled": True}), engine, tmp_path, say=lines.append)
    result = loop.run()
    assert result["restarts"] == 1 and "restoring" in states.names
    assert ("recover", 2) in engine.calls and ("restore", "ckpt-000001-0000000-0002") in engine.calls
    assert [b for e, b, _ in engine.trained if e == 2] == [0, 1, 2, 3, 4, *range(BATCHES)]  # epoch 2 again
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3]
    assert any(line.startswith("recover stage 1 died (killed); restart 1/3") for line in lines)


def test_a_failing_block_or_no_restarts_left_ends_the_run(tmp_path: Path):
    engine = FakeEngine(fail_at=(1, 2))
    cfg = _cfg(checkpoint={"enabled": True}, runtime={"max_stage_restarts": 0})
    loop, states = _loop(cfg, engine, tmp_path)
    assert "giving up after 0 restart(s)" in loop.run()["error"] and states.names[-1] == "errored"
    assert engine.calls[-1] == ("stop",)

    class Broken(FakeEngine):
        def evaluate(self):
            raise ValueError("a block's exit failed")

    loop, _ = _loop(_cfg(checkpoint={"enabled": True, "overwrite": True}), Broken(), tmp_path)
    assert loop.run() == {"error": "ValueError: a block's exit failed"}  # not a lost worker: no retry
    assert isinstance(loop.failure, ValueError)


def test_a_new_run_never_takes_the_checkpoints_of_an_earlier_run_of_its_name_unless_told(tmp_path: Path):
    first, _ = _loop(_cfg(checkpoint={"enabled": True}), FakeEngine(), tmp_path)
    first.run()
    store = CheckpointStore(str(tmp_path), "fake")
    kept = [store.read_manifest(c)["written_at"] for c in store.complete()]
    engine = FakeEngine()
    again, _ = _loop(_cfg(checkpoint={"enabled": True}), engine, tmp_path)
    error = again.run()["error"]
    assert error.startswith("name: run 'fake' already has 2 checkpoint(s)") and "--resume fake" in error
    assert isinstance(again.failure, CheckpointError) and not any(c[0] == "open" for c in engine.calls)
    assert [store.read_manifest(c)["written_at"] for c in store.complete()] == kept  # untouched
    replace, _ = _loop(_cfg(checkpoint={"enabled": True, "overwrite": True}), FakeEngine(), tmp_path)
    assert "error" not in replace.run()
    assert not set(kept) & {store.read_manifest(c)["written_at"] for c in store.complete()}  # replaced


def test_resume_goes_on_after_the_checkpoint_without_repeating_growth(tmp_path: Path):
    grow = {"schedule": [{"kind": "layer", "epochs": 2}]}
    first, _ = _loop(_cfg(train={"epochs": 1}, grow=grow, checkpoint={"enabled": True}), FakeEngine(), tmp_path)
    first.run()
    latest = CheckpointStore(str(tmp_path), "fake").latest()
    assert (latest.epoch, latest.batch) == (3, 0)
    longer = _cfg(train={"epochs": 2}, grow=grow, checkpoint={"enabled": True})  # one more epoch before growth
    engine = FakeEngine()
    loop, _ = _loop(longer, engine, tmp_path, resume=latest.path)
    result = loop.run()
    assert ("build", 3) in engine.calls and ("restore", Path(latest.path).name) in engine.calls
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4] and len(result["growth"]) == 1
    assert {e for e, _, _ in engine.trained} == {4}  # only what the first run had not trained


def test_policies_decide_without_a_run():
    assert decide_failure("x", lost=False, restarts=0, limit=3, latest="/c", checkpoints=True) == Raise("x")
    assert decide_failure("x", True, 0, 3, "/c", True) == Retry("/c", 1)
    assert "checkpoint.enabled is false" in decide_failure("x", True, 0, 3, None, False).message
    assert "giving up after 3" in decide_failure("x", True, 3, 3, "/c", True).message
    timing = CheckpointTiming(True, 2, 0)
    assert [e for e in range(1, 6) if timing.at_epoch_end(e, 5)] == [2, 4, 5]
    assert CheckpointTiming(True, 1, 4).next_stop(5) == 8 and CheckpointTiming(False, 1, 4).next_stop(0) is None
    assert grow_refusal("r", 2, 0, 3) is None and "counting 1 request" in grow_refusal("r", 2, 1, 3)
    assert pack_host("pack", 1) == 1 and pack_host("fail", 1) is None
    # a boundary grows for a plan or a placed block; a waiting request only where it cannot be placed in training
    assert grow_at_boundary(True, False, False, True, 3, False) and grow_at_boundary(False, True, False, True, 0, False)
    assert grow_at_boundary(False, False, True, False, 3, False) and not grow_at_boundary(False, False, True, False, 0,
                                                                                            False)  # fmt: skip
    assert not grow_at_boundary(False, False, True, True, 3, False)  # placed during the next epoch: nothing stops
    assert grow_at_boundary(False, False, True, True, 1, False)  # the last epoch trains the block from its start
    assert grow_at_boundary(False, False, True, True, 3, True)  # a cache due first: a mid-epoch attach would drop it


def test_a_standby_actor_is_started_while_the_run_can_grow_and_the_room_is_there_now():
    cpu, gpu = {"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}
    room = {"CPU": 2.0, "GPU": 1.0}
    assert want_standby("auto", depth=2, max_blocks=3, bundle=cpu, available=room)
    assert not want_standby("auto", 3, 3, cpu, room)  # at max_blocks: no growth to wait for
    assert not want_standby("auto", 2, 3, gpu, room)  # auto never holds a GPU idle
    assert want_standby("always", 2, 3, gpu, room)
    assert not want_standby("never", 2, 3, cpu, room)
    assert not want_standby("always", 2, 3, cpu, {"CPU": 0.5})  # no waiting for room, no autoscaler request


def test_stage_stats_merge_pieces_of_an_epoch():
    a, b = StageStats(1, "X", samples=8, batches=1, busy_s=1.0), StageStats(1, "X", samples=8, batches=2, busy_s=2.0)
    a.add_losses({"b1.ce": 1.0})
    b.add_losses({"b1.ce": 2.0})
    b.add_losses({"b1.ce": 3.0})
    (m,) = merge_by_stage([a, b])
    assert (m.samples, m.batches, m.busy_s, m.losses) == (16, 3, 3.0, {"b1.ce": 2.0})
    m.wall_s = 6.0
    assert m.row()["utilisation"] == pytest.approx(0.5)
    m.wall_s = 2.0
    assert m.row()["utilisation"] == pytest.approx(1.5)  # as measured: a double count would show, not be clamped


def test_topology_policy_replaces_waits_shrinks_fails_and_expands():
    from growpipe.loop.topology import Fail, Layout, Replace, Shrink, Wait, after_loss, expand

    spread = Layout.spread([None, None, None])
    assert after_loss(spread, [True, True, True], 0, 30, "shrink") == Replace(spread)
    assert isinstance(after_loss(spread, [True, False, True], 5, 30, "shrink"), Wait)
    assert isinstance(after_loss(spread, [True, False, True], 99, 30, "wait"), Wait)
    assert "on_lost_node: fail" in after_loss(spread, [True, False, True], 31, 30, "fail", "node ab12").message
    shrunk = after_loss(spread, [True, False, True], 31, 30, "shrink")
    assert shrunk == Shrink(Layout((None, 0, None), (0, None, 2)), (1,))  # block 1 runs after block 0
    lost_first = after_loss(spread, [False, True, True], 31, 30, "shrink")  # block 0's home is gone
    assert lost_first.layout == Layout((None, 0, None), (1, None, 2))  # block 0's actor moves to block 1's home
    assert isinstance(after_loss(spread, [False, False, False], 31, 30, "shrink"), Fail)
    assert expand(shrunk.layout, spread, [True, True, True]) and not expand(shrunk.layout, spread, [True, False, True])
    assert not expand(spread, spread, [True, True, True])  # nothing to spread


def test_the_run_record_counts_epochs_notes_the_best_and_comes_back_from_its_manifest():
    rec = RunRecord()
    stats = StageStats(0, "X", samples=8, batches=1)
    stats.add_losses({"b0.ce": 0.5})
    losses, skipped = rec.add_epoch([stats], samples=8, seconds=2.0)
    assert losses == {"b0.ce": 0.5} and skipped == {} and (rec.samples, rec.train_seconds) == (8, 2.0)
    rec.history += [{"epoch": 1, "val_accuracy": 0.5}]
    assert rec.note_best(1) and rec.best == {"epoch": 1, "val_accuracy": 0.5, "path": None}
    rec.history += [{"epoch": 2, "val_accuracy": 0.4}]
    assert not rec.note_best(2) and rec.best["epoch"] == 1  # worse: the best stays
    assert not rec.note_best(1)  # only the newest row can be noted
    rec.watch.note({0: "sum0"})
    rec.restarts = 1
    back = RunRecord(restarts=3)
    back.restore(rec.to_manifest())
    assert back.to_manifest() == {**rec.to_manifest(), "restarts": 3}  # restarts are this process's own
    assert back.frozen == {0} and back.totals == {}


def _feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "growpipe-position"]


def test_the_position_feed_pushes_from_its_own_thread_while_an_epoch_runs_and_never_after():
    pushed: list[dict] = []
    got = threading.Event()

    class Bar(RunCallback):
        def on_position(self, position):
            pushed.append(position)
            got.set()

    engine = FakeEngine()
    engine.position = lambda: (3, 10)
    feed = PositionFeed(engine, [Bar()], say=lambda _line: None)
    with feed.running(1, 5):
        assert _feed_threads() == []  # every_s None: never
    feed.every_s = 0.0  # as often as it may (SHORTEST_S)
    feed.open = True
    with feed.running(2, 5):
        assert got.wait(10)  # nothing drives it but its own thread
    assert _feed_threads() == []  # ended with the epoch: nothing pushed after it
    assert pushed[0] == {"epoch": 2, "epochs": 5, "batch": 3, "batches": 10} and pushed == [pushed[0]] * len(pushed)
    feed.open = False
    assert feed.position(2, 5) is None  # no epoch open: nothing to show
    feed.every_s = 3600.0
    t0 = time.monotonic()
    with feed.running(3, 5):
        pass
    assert time.monotonic() - t0 < 5 and _feed_threads() == []  # its end does not wait out the period


def test_each_launch_of_a_blocks_actor_has_a_name_of_its_own():
    """A replacement (recovery, a standby started again) never waits for Ray to free the name it replaces."""
    assert [stage_actor_name("r", 1, n) for n in range(3)] == ["r/stage1", "r/stage1.1", "r/stage1.2"]
