"""A run's restore points: when one is due (policies.CheckpointTiming), writing it (every block's shard from the
engine, then the manifest: the commit), and where a resume reads from. The loop says when; this says how."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from growpipe.checkpoint import CheckpointStore
from growpipe.config import RunConfig
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine
from growpipe.loop.policies import CheckpointTiming


class Checkpointer:
    """Writes the restore points of one run into `store` (None: checkpoints off, nothing is written)."""

    def __init__(self, cfg: RunConfig, store: CheckpointStore | None, engine: Engine, run_name: str,
                 callbacks: list[RunCallback], say: Callable[[str], None]):  # fmt: skip
        self.cfg, self.store, self.engine, self.run_name = cfg, store, engine, run_name
        self.callbacks, self.say = callbacks, say
        self.timing = CheckpointTiming.from_spec(cfg.checkpoint.model_copy(update={"enabled": store is not None}))
        self.seq = 0  # the newest checkpoint's number: folders are named after it, so they sort in writing order

    def reader(self) -> CheckpointStore:
        """The run's store, or (checkpoints off) one that reads the checkpoint a resume starts from."""
        return self.store or CheckpointStore(self.cfg.checkpoint.uri, self.run_name)

    def write(self, epoch: int, batch: int, record: Callable[[], dict[str, Any]],
              best: dict[str, Any] | None = None) -> float | None:  # fmt: skip
        """A restore point at `epoch` finished epochs and `batch` batches into the next, its manifest holding
        `record()`; `best`: the model-selection entry this checkpoint is (its path is set, pruning keeps it).
        Returns the seconds it took (None: checkpoints are off)."""
        if self.store is None:
            return None
        self.seq += 1
        t0 = time.perf_counter()
        path = self.store.dir_for(epoch, batch, self.seq)
        if best is not None:
            best["path"] = path
            self.store.protected = {path}
        shards = self.engine.save(self.store, path)
        manifest = {**record(), "epoch": epoch, "batch": batch, "seq": self.seq, "shards": shards,
                    "layout": self.engine.layout()}  # fmt: skip
        ref = self.store.commit(path, manifest, say=self.say)  # a failed prune is a line, the run goes on
        notify(self.callbacks, "on_checkpoint", {"path": ref.path, "epoch": epoch, "batch": batch, "seq": ref.seq},
               say=self.say)  # fmt: skip
        seconds = time.perf_counter() - t0
        self.say(f"ckpt   {ref.path.rsplit('/', 1)[-1]} (epoch {epoch}, batch {batch})")
        return seconds

    def restored(self, manifest: dict[str, Any], best: dict[str, Any] | None) -> None:
        """After a restore from `manifest`: number on past every folder of the run (a resume that went back from
        a damaged checkpoint never writes into it), and keep the best epoch's checkpoint from pruning."""
        highest = self.store.highest_seq() if self.store else 0
        self.seq = max(self.seq, manifest["seq"], highest)
        if self.store is not None:
            self.store.protected = {best["path"]} if best else set()

    def forget_best(self) -> None:
        """The net grew: model selection starts again, every checkpoint may be pruned."""
        if self.store is not None:
            self.store.protected = set()
