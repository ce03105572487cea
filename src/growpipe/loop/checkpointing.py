"""A run's restore points: when one is due (policies.CheckpointTiming), writing it (every block's shard from the
engine, then the manifest: the commit), and where a resume reads from.

The loop calls it at the run's points as it would a callback (`start`, `at_boundary`, `write` for a pause
mid-epoch), but directly, not through callbacks.notify: a checkpoint that cannot be written is the run's failure
(the failure policy decides), never a warning the run goes on after."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from growpipe.checkpoint import CheckpointStore, run_folder_problem
from growpipe.config import RunConfig
from growpipe.errors import CheckpointError
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine
from growpipe.loop.policies import CheckpointTiming
from growpipe.loop.record import RunRecord


class Checkpointer:
    """Writes the restore points of one run into `store` (None: checkpoints off, nothing is written); each
    manifest holds `record()` (the run's record and net), and the time a write took counts in `rec`'s newest
    epoch row. The best epoch's checkpoint (`rec.best`) is kept from pruning."""

    def __init__(self, cfg: RunConfig, store: CheckpointStore | None, engine: Engine, run_name: str,
                 rec: RunRecord, record: Callable[[], dict[str, Any]], callbacks: list[RunCallback],
                 say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.store, self.engine, self.run_name = cfg, store, engine, run_name
        self.rec, self.record, self.callbacks, self.say = rec, record, callbacks, say
        self.timing = CheckpointTiming.from_spec(cfg.checkpoint.model_copy(update={"enabled": store is not None}))
        self.total_epochs = cfg.total_epochs()
        self.seq = 0  # the newest checkpoint's number: folders are named after it, so they sort in writing order

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
        self.write(0, 0)

    def at_boundary(self, epoch: int, paused_at: int | None = None, grew: bool = False, best: bool = False) -> None:
        """After `epoch` finished epochs (`paused_at`: that many batches into the next, an epoch paused for a
        growth; None: between epochs): a restore point when the net grew here, the epoch is the best so far, or
        checkpoint.every_epochs asks for one at this epoch's end. Written after the boundary's growth, so a
        restored run never grows twice."""
        if grew or best or (paused_at is None and self.timing.at_epoch_end(epoch, self.total_epochs)):
            self.write(epoch, paused_at or 0, best)

    def write(self, epoch: int, batch: int, best: bool = False) -> float | None:
        """A restore point at `epoch` finished epochs and `batch` batches into the next; `best`: it is the
        checkpoint of model selection's entry `rec.best` (its path is set, pruning keeps it). Returns the
        seconds it took (None: checkpoints are off)."""
        if self.store is None:
            return None
        self.seq += 1
        t0 = time.perf_counter()
        path = self.store.dir_for(epoch, batch, self.seq)
        if best and self.rec.best is not None:
            self.rec.best["path"] = path
        kept = self.rec.best["path"] if self.rec.best else None  # None: the net grew since, nothing is kept
        self.store.protected = {kept} if kept else set()
        shards = self.engine.save(self.store, path)
        manifest = {**self.record(), "epoch": epoch, "batch": batch, "seq": self.seq, "shards": shards,
                    "layout": self.engine.layout()}  # fmt: skip
        ref = self.store.commit(path, manifest, say=self.say)  # a failed prune is a line, the run goes on
        notify(self.callbacks, "on_checkpoint", {"path": ref.path, "epoch": epoch, "batch": batch, "seq": ref.seq},
               say=self.say)  # fmt: skip
        seconds = time.perf_counter() - t0
        self.say(f"ckpt   {ref.path.rsplit('/', 1)[-1]} (epoch {epoch}, batch {batch})")
        if self.rec.history:  # its time counts in the newest epoch's row
            row = self.rec.history[-1]
            row["checkpoint_seconds"] = round(row.get("checkpoint_seconds", 0.0) + seconds, 4)
        return seconds

    def restored(self, manifest: dict[str, Any]) -> None:
        """After a restore from `manifest`: number on past every folder of the run (a resume that went back from
        a damaged checkpoint never writes into it)."""
        highest = self.store.highest_seq() if self.store else 0
        self.seq = max(self.seq, manifest["seq"], highest)
