"""The events a run pushes to whoever follows it (the controller's stream on Ray), here on the reference
engine in this process: each epoch's row with the checkpoint written at its boundary, the bar's position,
a paced run that trains no epoch before the follower took the one before, and a stop while it waits."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from growpipe.checkpoint import CheckpointStore
from growpipe.local import LocalEngine
from growpipe.loop.loop import RunLoop
from growpipe.runtime.events import RunEvents
from tests.conftest import tiny_config


class _HeldEngine(LocalEngine):
    """Holds each epoch before its first batch, at its first position, until the follower has seen a position
    of that epoch (the feed pushes it from its own thread meanwhile), so the test sees a position in every epoch
    however the threads run."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.seen = threading.Event()
        self.held: set[int] = set()

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Any) -> Any:
        if epoch not in self.held:
            self.held.add(epoch)
            assert self.bundle is not None
            self._position = (start_batch, -(-len(self.bundle.train) // self.cfg.data.batch_size))
            self.seen.wait(60)  # not seen by then: the test's own assertion says so
            self.seen.clear()
        return super().run_epoch(epoch, start_batch, stop_at, pause)


def _paced_loop(tmp_path: Path, epochs: int, held: bool = False) -> tuple[RunLoop, RunEvents, threading.Thread,
                                                                         list[dict]]:  # fmt: skip
    cfg = tiny_config(
        name="events",
        data={"limit_train": 256, "batch_size": 32},
        net={"blocks": 1, "width": 32},
        train={"epochs": epochs},
        grow={"every_epochs": 1, "max_blocks": 2},
        checkpoint={"enabled": True, "uri": str(tmp_path), "every_epochs": 1},
    )
    events = RunEvents()
    events.paced = True
    engine = _HeldEngine(cfg) if held else LocalEngine(cfg)
    loop = RunLoop(cfg, engine, store=CheckpointStore(str(tmp_path), "events"), callbacks=[events], say=events.say)
    loop.epoch_gate = events.settled
    loop.feed.every_s = 0.0  # as often as the feed pushes (loop.progress.SHORTEST_S)
    results: list[dict[str, Any]] = []

    def run() -> None:
        try:
            results.append(loop.run())
        finally:
            events.end()

    return loop, events, threading.Thread(target=run), results


def test_a_paced_run_hands_each_epoch_with_its_boundary_checkpoint_and_waits_for_it(tmp_path: Path):
    loop, events, thread, results = _paced_loop(tmp_path, 3, held=True)
    hold = loop.engine
    assert isinstance(hold, _HeldEngine)
    store = CheckpointStore(str(tmp_path), "events")
    thread.start()
    epochs, positions, lines = [], [], []
    for event in events.follow():
        if event["kind"] == "epoch":
            row, path = event["row"], event["checkpoint"]
            assert loop.status()["epoch"] == row["epoch"]  # the next epoch has not started: it waits for us
            manifest = store.read_manifest(path)
            assert (manifest["epoch"], manifest["batch"]) == (row["epoch"], 0)
            assert len(manifest["topology"]) == len(loop.specs)  # written after the boundary's growth
            epochs.append(row["epoch"])
            events.take(row["epoch"])
        elif event["kind"] == "position":
            if event["epoch"] not in {e for e, _, _ in positions}:
                hold.seen.set()
            positions.append((event["epoch"], event["batch"], event["batches"]))
        elif event["kind"] == "line":
            lines.append(event["line"])
    thread.join(timeout=60)
    assert epochs == [1, 2, 3] and "error" not in results[0]
    assert {e for e, _, _ in positions} == {1, 2, 3} and all(0 <= b <= n == 8 for _, b, n in positions)
    assert positions == sorted(positions)  # never an older one after a newer one
    assert len(loop.rec.growth) == 1 and any(line.startswith("ckpt ") for line in lines)


def test_a_run_stopped_while_it_waits_for_its_follower_trains_nothing_more(tmp_path: Path):
    loop, events, thread, results = _paced_loop(tmp_path, 3)
    thread.start()
    for event in events.follow():
        if event["kind"] == "epoch":  # not taken: the run waits at epoch 1's boundary
            loop.shutdown("stopped early by the Tune scheduler")
            events.release()
    thread.join(timeout=60)
    assert results == [{"error": "stopped: stopped early by the Tune scheduler"}]
    assert [row["epoch"] for row in loop.rec.history] == [1]
