"""Checkpoints written in the background (checkpoint.asynchronous): the run goes on training while a write is
held open, the previous checkpoint stays the newest complete one until the manifest lands, two writes of a run
never overlap, the end of the run waits for the write under way, and a process killed mid-write leaves the
previous checkpoint whole (the reference engine, real files; each write held by an event, never a sleep)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from growpipe.checkpoint import CheckpointStore
from growpipe.config import RunConfig
from growpipe.local import LocalEngine
from growpipe.loop.callbacks import RunCallback
from growpipe.loop.loop import RunLoop
from tests.conftest import REPO, tiny_config


class _HeldWrites(LocalEngine):
    """The reference engine whose background writes can be held open (once their shards are on disk, the write
    of the folder named with `hold` waits for `gate` before its manifest) or fail (`fail`: disk full); it notes,
    at each copy of the state, whether the run's previous write had ended."""

    def __init__(self, cfg: RunConfig, hold: str | None = None, fail: str | None = None) -> None:
        super().__init__(cfg)
        self.hold, self.fail = hold, fail
        self.gate = threading.Event()
        self.shards_written = threading.Event()
        self.copies: list[tuple[str, bool]] = []  # (folder, whether no other write was under way then)
        self.seen: dict[str, Any] = {}  # what the next epoch saw while the held write was open

    def save_async(self, store: CheckpointStore, ckpt_dir: str) -> Any:
        self.copies.append((Path(ckpt_dir).name, store.pending is None or store.pending.done))
        write = super().save_async(store, ckpt_dir)

        def held() -> list[dict[str, Any]]:
            shards = write()
            if self.fail and self.fail in ckpt_dir:
                raise OSError(28, "No space left on device")
            if self.hold and self.hold in ckpt_dir:
                self.shards_written.set()
                assert self.gate.wait(120), "the test never let the held write go on"
            return shards

        return held


class _Checkpoints(RunCallback):
    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self.landed = threading.Condition()

    def on_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        with self.landed:
            self.done.append(checkpoint)
            self.landed.notify_all()

    def wait_for(self, epoch: int) -> bool:
        with self.landed:
            return self.landed.wait_for(lambda: any(c["epoch"] == epoch for c in self.done), timeout=120)


def _cfg(tmp_path: Path, name: str, epochs: int, **checkpoint: Any) -> RunConfig:
    return tiny_config(name=name, data={"limit_train": 256, "batch_size": 32}, net={"blocks": 2, "width": 32},
                       train={"epochs": epochs},
                       checkpoint={"enabled": True, "uri": str(tmp_path), "keep": 5, **checkpoint})  # fmt: skip


def _loop(cfg: RunConfig, engine: LocalEngine, tmp_path: Path) -> tuple[RunLoop, _Checkpoints, list[str]]:
    seen, lines = _Checkpoints(), []
    loop = RunLoop(cfg, engine, store=CheckpointStore(str(tmp_path), cfg.name), callbacks=[seen], say=lines.append)
    return loop, seen, lines


def test_a_checkpoint_is_written_while_the_next_epoch_trains_and_the_previous_one_stays_newest_until_it_lands(
    tmp_path: Path,
):
    cfg = _cfg(tmp_path, "bg", 2)
    reader = CheckpointStore(str(tmp_path), "bg")  # another reader of the run's folder (a server following it)

    class Watching(_HeldWrites):
        def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Any) -> Any:
            if epoch == 2:  # the loop is on to the next epoch while epoch 1's checkpoint is held open
                assert self.shards_written.wait(120)
                held = Path(tmp_path, "bg", next(n for n, _ in self.copies if n.startswith("ckpt-000001-")))
                self.seen.update(newest=reader.latest(), files=sorted(p.name for p in held.iterdir()))
                self.gate.set()
                self.seen["landed"] = seen.wait_for(1)
                self.seen["then"] = reader.latest()
            return super().run_epoch(epoch, start_batch, stop_at, pause)

    engine = Watching(cfg, hold="ckpt-000001-")
    loop, seen, lines = _loop(cfg, engine, tmp_path)
    result = loop.run()
    assert "error" not in result, result
    newest = engine.seen["newest"]
    assert (newest.epoch, newest.batch) == (0, 0)  # the start's: epoch 1's has no manifest yet
    assert engine.seen["files"] == ["block-0.pt", "block-1.pt"]  # its shards are there, the manifest is not
    assert engine.seen["landed"] and engine.seen["then"].epoch == 1
    assert [c["epoch"] for c in seen.done] == [0, 1, 2]
    assert any(line.startswith("ckpt   ckpt-000001-") for line in lines)
    last = reader.latest()
    assert last is not None and last.epoch == 2  # the end's checkpoint is complete when the run returns
    manifest = reader.verify(last.path, load=True)
    assert [row["epoch"] for row in manifest["history"]] == [1, 2]
    assert all(row["checkpoint_seconds"] >= 0 for row in loop.rec.history)
    assert loop.store is not None and loop.store.pending is not None  # the last background write, ended
    assert pickle.loads(pickle.dumps(loop.store)).pending is None  # what a worker gets: no thread of this process


def test_two_writes_of_a_run_never_overlap(tmp_path: Path):
    """A checkpoint every 3 batches and at every epoch's end: epoch 1's end's write is held open while epoch 2
    trains its first 3 batches, then let go as the loop pauses there for the next checkpoint, which copies the
    state only once the write before has ended (its manifest in place); so does every other one."""
    cfg = _cfg(tmp_path, "one", 3, every_batches=3)

    class ReleasedLate(_HeldWrites):
        def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Any) -> Any:
            part = super().run_epoch(epoch, start_batch, stop_at, pause)
            if epoch == 2 and not self.gate.is_set():
                self.seen["trained_while_held"] = self.shards_written.wait(120) and part.paused_at == 3
                self.gate.set()  # it finishes while the loop goes on to the next checkpoint
            return part

    engine = ReleasedLate(cfg, hold="ckpt-000001-0000000-")
    loop, seen, _ = _loop(cfg, engine, tmp_path)
    result = loop.run()
    assert "error" not in result, result
    assert engine.seen["trained_while_held"]
    names = [name for name, _ in engine.copies]  # every write but the start's and the end's (written at once)
    assert len(names) == len(seen.done) - 2 == 8 and all(alone for _, alone in engine.copies), engine.copies
    assert names == sorted(names) and [c["seq"] for c in seen.done] == list(range(1, 11))


def test_the_end_of_the_run_waits_for_the_write_under_way_and_fails_with_it(tmp_path: Path):
    """checkpoint.every_epochs 0, every_batches 6: the start's checkpoint is written at once, batch 6's in the
    background while the epoch's last 2 batches train; its write fails (a full disk), and the run's end, which
    writes nothing itself, fails with it."""
    cfg = _cfg(tmp_path, "full", 1, every_epochs=0, every_batches=6)
    engine = _HeldWrites(cfg, fail="ckpt-000000-0000006-")
    loop, seen, _ = _loop(cfg, engine, tmp_path)
    result = loop.run()
    assert "No space left on device" in result.get("error", ""), result
    assert [row["epoch"] for row in loop.rec.history] == [1] and [c["batch"] for c in seen.done] == [0]
    latest = CheckpointStore(str(tmp_path), "full").latest()  # nothing half-written counts as complete
    assert latest is not None and (latest.epoch, latest.batch) == (0, 0)


def test_a_process_killed_while_a_background_write_is_held_leaves_the_previous_checkpoint_whole(tmp_path: Path):
    """A real run in a process of its own dies (SIGKILL) while epoch 1's checkpoint, shards written, waits for its
    manifest; the start's checkpoint stays the newest complete one, loads hash-checked, and a resume goes on
    from it."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from growpipe.checkpoint import CheckpointStore
        from growpipe.loop.loop import RunLoop
        from tests.test_async_checkpoints import _HeldWrites, _cfg
        from pathlib import Path

        class Dies(_HeldWrites):
            def run_epoch(self, epoch, start_batch, stop_at, pause):
                if epoch == 2:
                    assert self.shards_written.wait(120)
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().run_epoch(epoch, start_batch, stop_at, pause)

        cfg = _cfg(Path({str(tmp_path)!r}), "killed", 2)
        RunLoop(cfg, Dies(cfg, hold="ckpt-000001-"), store=CheckpointStore(cfg.checkpoint.uri, "killed")).run()
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    store = CheckpointStore(str(tmp_path), "killed")
    newest = store.latest()
    assert newest is not None and (newest.epoch, newest.seq) == (0, 1)
    store.verify(newest.path, load=True)
    (cut,) = [p for p in (tmp_path / "killed").iterdir() if p.name.startswith("ckpt-000001-")]
    assert (cut / "block-0.pt").is_file() and not (cut / "manifest.json").exists()
    resumed = _cfg(tmp_path, "killed", 2, keep=1)
    loop = RunLoop(resumed, LocalEngine(resumed), store=CheckpointStore(str(tmp_path), "killed"), resume=newest.path)
    result = loop.run()
    assert "error" not in result and [row["epoch"] for row in result["history"]] == [1, 2], result
    assert store.latest().epoch == 2 and not cut.exists()  # the cut-short folder pruned with the older ones
