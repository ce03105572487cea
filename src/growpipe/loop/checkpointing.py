"""A run's restore points: when one is due (policies.CheckpointTiming), writing it (every block's shard from the
engine, then the manifest: the commit), and where a resume reads from.

The loop calls it at the run's points as it would a callback (`start`, `at_boundary`, `write` for a pause
mid-epoch), but directly, not through callbacks.notify: a checkpoint that cannot be written is the run's failure
(the failure policy decides), never a warning the run goes on after.

With checkpoint.asynchronous the loop waits only while the engine copies every block's state (save_async); the
shards and the manifest are written in the background (snapshot.BackgroundWrite) while the run goes on, and
reported (on_checkpoint, its line) once complete. One write at a time: the next one first waits for it, and raises
what it failed with (the run's failure, as on the loop's thread). A restore reads through the run's store, which
waits for it (CheckpointStore.settle); the run's last boundary, and a boundary whose checkpoint is handed on with
its epoch (reports_checkpoints: a Tune trial), wait for it too, so a checkpoint is reported only once complete."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from growpipe.checkpoint import CheckpointRef, CheckpointStore, run_folder_problem
from growpipe.config import RunConfig
from growpipe.errors import CheckpointError, describe
from growpipe.loop.callbacks import RunCallback, notify, reports_checkpoints
from growpipe.loop.engine import Engine, SavesInBackground
from growpipe.loop.policies import CheckpointTiming
from growpipe.loop.record import RunRecord
from growpipe.snapshot import BackgroundWrite


class Checkpointer:
    """Writes the restore points of one run into `store` (None: checkpoints off, nothing is written); each
    manifest holds `record()` (the run's record and net), and the time the run waited for a write counts in
    `rec`'s newest epoch row. The best epoch's checkpoint (`rec.best`) is kept from pruning."""

    def __init__(self, cfg: RunConfig, store: CheckpointStore | None, engine: Engine, run_name: str,
                 rec: RunRecord, record: Callable[[], dict[str, Any]], callbacks: list[RunCallback],
                 say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.store, self.engine, self.run_name = cfg, store, engine, run_name
        self.rec, self.record, self.callbacks, self.say = rec, record, callbacks, say
        self.timing = CheckpointTiming.from_spec(cfg.checkpoint.model_copy(update={"enabled": store is not None}))
        self.total_epochs = cfg.total_epochs()
        self.seq = 0  # the newest checkpoint's number: folders are named after it, so they sort in writing order
        self.pending: BackgroundWrite[CheckpointRef] | None = None  # the write under way, until the run waited

    def reader(self) -> CheckpointStore:
        """The run's store, or (checkpoints off) one that reads the checkpoint a resume starts from."""
        return self.store or CheckpointStore(self.cfg.checkpoint.uri, self.run_name)

    def check_fresh(self) -> None:
        """CheckpointError when a fresh run may not write into its folder (checked before the run already; this
        catches a run of the same name started meanwhile)."""
        if self.store is not None and (why := run_folder_problem(self.store, True, self.cfg.checkpoint.overwrite)):
            raise CheckpointError(why)

    def start(self) -> None:
        """A fresh run's first restore point, once the earlier run's folders of its name are gone (complete
        ones only with --overwrite: check_fresh refused the run otherwise)."""
        if self.cfg.eval.restore_best and self.cfg.data.val_fraction and self.store is None:
            self.say("best   eval.restore_best needs checkpoint.enabled: the result is the last epoch's net")
        if self.store is not None and (gone := self.store.clear()):
            self.say(
                f"ckpt   a fresh run: removed {gone} checkpoint folder(s) of an earlier run {self.run_name!r}"
                + (" (--overwrite)" if self.cfg.checkpoint.overwrite else " (none of them complete)")
            )
        self.write(0, 0, wait=True)  # a checkpoint.uri that cannot be written fails the run now

    def at_boundary(self, epoch: int, paused_at: int | None = None, grew: bool = False, best: bool = False) -> None:
        """After `epoch` finished epochs (`paused_at`: that many batches into the next, an epoch paused for a
        growth; None: between epochs): a restore point when the net grew here, the epoch is the best so far, or
        checkpoint.every_epochs asks for one at this epoch's end. Written after the boundary's growth, so a
        restored run never grows twice."""
        between = paused_at is None
        # complete before the boundary ends: at the run's end, and when it is handed on with the epoch's row
        wait = between and (epoch >= self.total_epochs or reports_checkpoints(self.callbacks))
        if grew or best or (between and self.timing.at_epoch_end(epoch, self.total_epochs)):
            self.write(epoch, paused_at or 0, best, wait=wait)
        elif wait:
            self.settle()

    def write(self, epoch: int, batch: int, best: bool = False, wait: bool = False) -> float | None:
        """A restore point at `epoch` finished epochs and `batch` batches into the next; `best`: it is the
        checkpoint of model selection's entry `rec.best` (its path is set, pruning keeps it). Written in the
        background with checkpoint.asynchronous unless `wait` (complete when this returns). Returns the seconds the
        run waited for it (None: checkpoints are off)."""
        if self.store is None:
            return None
        t0 = time.perf_counter()
        self._settle()  # one write at a time: the one under way first (what it failed with is raised here)
        self.seq += 1
        path = self.store.dir_for(epoch, batch, self.seq)
        if best and self.rec.best is not None:
            self.rec.best["path"] = path
        kept = self.rec.best["path"] if self.rec.best else None  # None: the net grew since, nothing is kept
        self.store.protected = {kept} if kept else set()
        manifest = {**self.record(), "epoch": epoch, "batch": batch, "seq": self.seq, "layout": self.engine.layout()}
        report = self._report(epoch, batch)
        if self.cfg.checkpoint.asynchronous and not wait and isinstance(self.engine, SavesInBackground):
            write_shards = self.engine.save_async(self.store, path)
            manifest = copy.deepcopy(manifest)  # the record as it is now: the loop goes on changing it
            self.pending = self.store.commit_in_background(path, manifest, write_shards, report, say=self.say)
        else:
            shards = self.engine.save(self.store, path)
            report(self.store.commit(path, {**manifest, "shards": shards}, say=self.say))  # a failed prune: a line
        return self._waited(time.perf_counter() - t0)

    def settle(self) -> float:
        """Wait for the write under way (if any) to be complete; raise what it failed with. The seconds waited
        (counted in the newest epoch's row); nothing under way counts nothing."""
        if self.pending is None:
            return 0.0
        t0 = time.perf_counter()
        self._settle()
        return self._waited(time.perf_counter() - t0)

    def finish(self, timeout_s: float = 120.0) -> None:
        """The run ends (done, failed or stopped): a write under way completes first (at most `timeout_s`); its
        failure is a line here, not the run's."""
        pending = self.pending
        if pending is None:
            return
        if not pending.wait(timeout_s):
            self.say(f"ckpt   {pending.name} still being written after {timeout_s:.0f}s; the run ends without it")
        elif pending.error is not None:
            self.say(f"ckpt   {pending.name} was not completed ({describe(pending.error)})")

    def _settle(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.wait()
            if pending.error is not None:
                raise pending.error

    def _report(self, epoch: int, batch: int) -> Callable[[CheckpointRef], None]:
        """What is done once a checkpoint is complete (on the thread that wrote it): the callbacks told, its line."""

        def report(ref: CheckpointRef) -> None:
            notify(self.callbacks, "on_checkpoint", {"path": ref.path, "epoch": epoch, "batch": batch,
                                                     "seq": ref.seq}, say=self.say)  # fmt: skip
            self.say(f"ckpt   {ref.path.rsplit('/', 1)[-1]} (epoch {epoch}, batch {batch})")

        return report

    def _waited(self, seconds: float) -> float:
        """`seconds` the run waited for a checkpoint, counted in the newest epoch's row."""
        if self.rec.history:
            row = self.rec.history[-1]
            row["checkpoint_seconds"] = round(row.get("checkpoint_seconds", 0.0) + seconds, 4)
        return seconds

    def restored(self, manifest: dict[str, Any]) -> None:
        """After a restore from `manifest`: number on past every folder of the run (a resume that went back from
        a damaged checkpoint never writes into it). A write that was under way has ended (the restore read
        through the store, which waited for it): committed or not, it is the past now; a failed one is a line."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.error is not None:
            self.say(f"ckpt   {pending.name} was not completed ({describe(pending.error)}); "
                     f"the run goes on from epoch {manifest['epoch']}, batch {manifest['batch']}")  # fmt: skip
        highest = self.store.highest_seq() if self.store else 0
        self.seq = max(self.seq, manifest["seq"], highest)
