"""Data-parallel BP on Ray Train (runtime.engine ddp): the blocks as one network on `ddp.workers` Ray Train
workers (DDP over gloo on CPUs, NCCL on GPUs), each on an even share of every global mini-batch.

Ray Train owns the epochs: a trainer's train function (growpipe.runtime.ddp_worker) trains from the checkpoint it
is given to the run's last epoch, reporting each epoch (and each mid-epoch restore point) with a checkpoint;
FailureConfig is the one retry policy (a lost worker: its group restarts from the newest of them, elastic between
`ddp.min_workers` and `ddp.workers`), and a trainer that gives up fails the run. The engine runs one trainer at a
time in a Ray task and reads its parts from a channel actor, at most two parts behind; a growth, a restore or the
run's end stops the trainer before its next batch, and the next one starts from the checkpoint the loop stands on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import ray

from growpipe.checkpoint import CheckpointStore, write_shard_at
from growpipe.config import RunConfig
from growpipe.loop.engine import EpochPart, Pause, Prepared, WithoutBundles, WorkerLost
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout
from growpipe.nn.block import checksum_of
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.ddp_net import assemble, describe_data, measure_net
from growpipe.runtime.ddp_trainer import Trainer, remove_folders
from growpipe.snapshot import copy_later, cpu_copy


class DDPEngine(WithoutBundles):
    """Method bp data-parallel on Ray Train workers; see the module docstring."""

    name = "ray-train-ddp"
    stage_table = False
    places_while_training = True  # nothing is placed: the block is built when the next trainer starts
    net: GrowableNet | None = None

    def __init__(self, cfg: RunConfig, run_name: str):
        self.cfg, self.storage = cfg, f"{cfg.checkpoint.uri}/{run_name}.ray-train"
        self.workers = cfg.ddp.workers or cfg.net.blocks
        self.config = cfg.model_dump(mode="json")
        self.info: InputInfo | None = None
        self.layers: list[dict[str, Any]] = []
        self.frozen = 0  # blocks frozen by growth (a block's state carries its own flag too)
        self.thawed: float | None = None  # grow.joint's lr_factor once every block learns again
        self.at: dict[str, Any] | None = None  # the checkpoint {fs, path, shards} the loop stands on; None: fresh
        self.exact = True  # `at` holds every block as it is (after a growth: not the new one, nor frozen flags)
        self.eval: dict[str, Any] | None = None  # the evaluation reported with the part `at` came from
        self.trainer: Trainer | None = None
        self.trainers, self.stopped = 0, False
        self.attempt = uuid.uuid4().hex[:8]  # names this engine's trainers: a resumed run's start afresh
        self.pruned = 0  # this engine's trainers up to this one have had their folders removed
        self.training_workers = 0  # the workers that trained the newest part (elastic: may be fewer)
        self._built: tuple[Any, list[dict[str, Any]]] | None = None  # _states()'s last answer

    def _trainer(self, epoch: int, batch: int) -> Trainer:
        """The trainer at batch `batch` of epoch `epoch`: the running one, or a new one from `at`."""
        if self.stopped:
            raise WorkerLost("the DDP trainer was stopped")
        if self.trainer is None or self.trainer.next != (epoch, batch):
            self._end()
            self.trainers += 1
            config = {"cfg": self.config, "topology": self.layers, "frozen": self.frozen, "start": self.at,
                      "position": (epoch, batch), "thaw": self.thawed}  # fmt: skip
            self.trainer = Trainer(self.cfg, self.storage, f"{self.attempt}-{self.trainers}", config)
        return self.trainer

    def _end(self) -> None:
        trainer, self.trainer = self.trainer, None
        if trainer is not None:
            trainer.end()

    def _states(self) -> list[dict[str, Any]]:
        """Every block's state as it is now, built once per change (a growth asks for its checksums, then saves)."""
        assert self.info is not None
        key = (self.at, self.layers, self.frozen, self.thawed)
        if self._built is None or self._built[0] != key:
            blocks = assemble(self.cfg, self.info, self.layers, self.frozen, self.at, thaw=self.thawed)
            self._built = (key, [cpu_copy(b.state_dict()) for b in blocks])
        return self._built[1]

    # ---- the Engine protocol --------------------------------------------------------------------------
    def open(self, layout: dict[str, Any] | None = None) -> tuple[InputInfo, dict[str, Any]]:
        info, data = ray.get(describe_data.remote(self.config))
        self.info = InputInfo.from_dict(info)
        return self.info, data

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        self._end()
        self.layers, self.frozen, self.at, self.exact, self.eval = [s.to_dict() for s in specs], 0, None, True, None
        return (f"bp (data-parallel, Ray Train) on {self.cfg.net.backbone}: {self.workers} DDP workers, "
                f"global batch {self.cfg.data.batch_size}")  # fmt: skip

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        trainer = self._trainer(epoch, start_batch)
        with pause.forwarded(trainer.stop):
            part = trainer.part()
        if self.stopped:
            raise WorkerLost("the DDP trainer was stopped")
        self.at, self.exact, self.eval = part["checkpoint"], True, part["eval"]
        self._built = None  # states of an older part: not kept for the rest of the run
        self.training_workers = part["workers"]
        if self.pruned < self.trainers - 1:  # the first part of a new trainer: the earlier ones' folders go
            remove_folders(self.storage, [f"{self.attempt}-{n}" for n in range(self.pruned + 1, self.trainers)])
            self.pruned = self.trainers - 1
        stats = StageStats(**part["stats"])
        return EpochPart([stats], stats.samples, part["at"])

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        return Prepared(spec, f"on {self.workers} DDP workers", cacheable=False)  # built when a trainer starts

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        """The grown net: the next trainer starts from the newest checkpoint, the new block freshly built."""
        self._end()
        self.frozen = len(self.layers) if freeze else self.frozen
        self.layers = [*self.layers, block.spec.to_dict()]
        self.exact, self.eval = False, None

    def thaw(self, lr_factor: float) -> None:  # the next trainer thaws every block it loads (their states then too)
        self._end()
        self.frozen, self.thawed, self.exact = 0, lr_factor, False

    def evaluate(self) -> dict[str, Any]:
        if self.eval is None or not self.exact:
            self.eval = ray.get(measure_net.remote(self.config, self.layers, self.frozen, self.at))
        return self.eval

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        return ray.get(measure_net.remote(self.config, self.layers, self.frozen, self.at, threshold, True))

    def checksums(self) -> dict[int, str]:
        return {int(t["index"]): checksum_of(s["modules"]) for t, s in zip(self.layers, self._states(), strict=True)}

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        return self.save_async(store, ckpt_dir)()

    def save_async(self, store: CheckpointStore, ckpt_dir: str) -> Callable[[], list[dict[str, Any]]]:
        """The part's shards read now (its trainer may remove them), written into `ckpt_dir` by the answer; a net
        built here (after a growth, at the start) is written now: the next trainer starts from it."""
        if self.exact and self.at is not None:
            return copy_later(self.at["fs"], self.at["path"], self.at["shards"], store.fs, ckpt_dir)
        shards = [write_shard_at(store.fs, ckpt_dir, {t["index"]: state})
                  for t, state in zip(self.layers, self._states(), strict=True)]  # fmt: skip
        self.at, self.exact = {"fs": store.fs, "path": ckpt_dir, "shards": shards}, True
        return lambda: shards

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        self._end()
        self.frozen, self.thawed = 0, None  # the restored states carry their frozen flags and rates
        self.at, self.exact, self.eval = {"fs": store.fs, "path": ckpt_dir, "shards": shards}, True, None

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        return self.build(specs, None)  # DDP replicates every block: no layout to keep

    def final_states(self) -> list[dict[str, Any]]:
        return self._states()

    def position(self) -> tuple[int, int] | None:
        return None

    def extras(self) -> dict[str, Any]:
        return {"schedule": "data-parallel (Ray Train DDP)", "workers": self.workers, "trainers": self.trainers,
                "workers_at_end": self.training_workers, "ray_train_storage": self.storage}  # fmt: skip

    def stop(self) -> None:
        self.stopped = True
        self._end()
