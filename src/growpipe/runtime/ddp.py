"""Data-parallel BP on Ray Train (runtime.engine ddp): the blocks as one network on `ddp.workers` Ray Train
workers (DDP over gloo on CPUs, NCCL on GPUs), each on an even share of every global mini-batch.

Ray Train keeps the books: an order that changes the weights ends in `ray.train.report(metrics, checkpoint)`,
growpipe's shards inside the Ray Train checkpoint (storage_path: checkpoint.uri, folder RUN.ray-train); Ray
Train replaces a lost worker (FailureConfig) and its group goes on from there. The loop's restore points are
copies of those shards; a growth starts a new trainer from the newest one with the grown net. The loop's calls
are orders through a Mailbox, answered by rank 0 via the run's controller actor (growpipe.runtime.ddp_worker).
"""

from __future__ import annotations

import threading
from typing import Any

import ray

from growpipe.checkpoint import CheckpointStore, copy_shards, load_states
from growpipe.config import RunConfig
from growpipe.errors import PipelineError
from growpipe.loop.engine import EpochPart, Poll, Prepared, WithoutBundles, WorkerLost
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.ddp_worker import worker_loop
from growpipe.runtime.mailbox import Mailbox, TrainerEnded


class DDPEngine(WithoutBundles):
    """Method bp data-parallel on Ray Train workers; see the module docstring."""

    name = "ray-train-ddp"
    stage_table = False
    places_while_training = False  # nothing is placed: the block is built when the trainer restarts
    net: GrowableNet | None = None

    def __init__(self, cfg: RunConfig, run_name: str, reserved: Any = None, say: Any = None):
        self.cfg, self.run_name, self.storage_name = cfg, run_name, f"{run_name}.ray-train"
        self.workers = cfg.ddp.workers or cfg.net.blocks
        self.mailbox = Mailbox()
        self.layers: list[dict[str, Any]] = []
        self.frozen = 0  # blocks frozen by growth (a block's state carries its own flag too)
        self.start: dict[str, Any] | None = None  # the checkpoint the weights are in: {fs, path, shards}
        self.version: int | str = ""  # names the state the next order runs on; workers not at it load `start` first
        self.current = False  # `start` holds every block as it is now
        self.thread: threading.Thread | None = None
        self.trainers = self.changes = 0

    # ---- the trainer ----------------------------------------------------------------------------------
    def _start(self) -> None:
        """A new trainer: its workers load the data and wait for orders."""
        from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
        from ray.train import RunConfig as TrainRunConfig
        from ray.train.torch import TorchTrainer

        self._end()
        self.trainers += 1
        rt = self.cfg.runtime
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and rt.gpus_per_stage != 0
        trainer = TorchTrainer(
            worker_loop,
            train_loop_config={"cfg": self.cfg.model_dump(mode="json"), "run": self.run_name},
            scaling_config=ScalingConfig(num_workers=self._scale, use_gpu=gpus,  # type: ignore[arg-type]  # elastic (min, max): not in Ray's hint
                                         resources_per_worker={"CPU": rt.cpus_per_stage}),
            run_config=TrainRunConfig(storage_path=self.cfg.checkpoint.uri, name=self.storage_name,
                                      failure_config=FailureConfig(max_failures=rt.max_stage_restarts),
                                      checkpoint_config=CheckpointConfig(num_to_keep=2)),
        )  # fmt: skip
        self.mailbox.reopen()

        def fit() -> None:
            why = "the trainer finished"
            try:
                trainer.fit()
            except BaseException as e:  # Ray Train gave up (more failures than max_failures), or a stop
                why = (str(e).strip() or type(e).__name__).splitlines()[0]
            self.mailbox.ended(why)

        self.thread = threading.Thread(target=fit, name="growpipe-ddp-fit", daemon=True)
        self.thread.start()

    @property
    def _scale(self) -> int | tuple[int, int]:  # elastic between ddp.min_workers and ddp.workers when set
        least = self.cfg.ddp.min_workers
        return (least, self.workers) if least is not None and least < self.workers else self.workers

    def _ask(self, op: str, **args: Any) -> dict[str, Any]:
        """Post an order on the current state and wait for rank 0's report (a checkpoint in it becomes the
        current state)."""
        if self.thread is None:
            raise WorkerLost("the DDP trainer is not running")
        state = {"version": self.version, "topology": self.layers, "frozen": self.frozen, "start": self.start}
        try:
            report = self.mailbox.wait_report(self.mailbox.post({"op": op, "state": state if self.layers else None,
                                                                 **args}))  # fmt: skip
        except TrainerEnded as e:
            raise WorkerLost(f"the DDP trainer ended ({e})") from None
        if "error" in report:
            error = report["error"]
            raise error if isinstance(error, BaseException) else PipelineError(str(error))
        if "path" in report:
            self.start = {"fs": report["fs"], "path": report["path"], "shards": report["shards"]}
            self.version = report["seq"]  # what the workers that wrote it are at
            self.current = True
        return report

    def _changed(self, why: str) -> None:
        """The net changed here (`why`), not on the workers: the next order makes them rebuild it."""
        self.changes += 1
        self.version = f"{why}-{self.changes}"
        self.current = False

    def _current(self) -> dict[str, Any]:
        """The checkpoint holding every block as it is now (asked for when a growth added one since)."""
        if not self.current:
            self._ask("checkpoint")
        assert self.start is not None
        return self.start

    def _end(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.mailbox.post({"op": "end"})
            self.thread.join(timeout=120.0)  # the workers end at once; Ray Train tears down its group
        self.thread = None

    # ---- the Engine protocol --------------------------------------------------------------------------
    def open(self, layout: dict[str, Any] | None = None) -> tuple[InputInfo, dict[str, Any]]:
        self._start()
        r = self._ask("describe")
        return InputInfo.from_dict(r["info"]), r["data"]

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        self.layers, self.frozen, self.start = [s.to_dict() for s in specs], 0, None
        self._changed("build")
        self._current()  # the fresh weights, as a checkpoint
        return (f"bp (data-parallel, Ray Train) on {self.cfg.net.backbone}: {self.workers} DDP workers, "
                f"global batch {self.cfg.data.batch_size}")  # fmt: skip

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, poll: Poll) -> EpochPart:
        r = self._ask("train", epoch=epoch, start=start_batch, stop_at=stop_at)
        counted = r["loss_batches"]  # the batches not skipped
        stats = StageStats(0, "DDP", samples=r["samples"], batches=r["batches"], busy_s=r["busy_s"],
                           skipped=r["skipped"], loss_sums=r["loss"] if counted else {},
                           loss_batches={k: counted for k in r["loss"]} if counted else {})  # fmt: skip
        return EpochPart([stats], r["samples"], r["paused_at"])

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        return Prepared(spec, f"on {self.workers} DDP workers", cacheable=False)  # built when the trainer restarts

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        """A new trainer from the newest checkpoint, with the grown net (the new block freshly built)."""
        self._current()
        self.frozen = len(self.layers) if freeze else self.frozen
        self.layers = [*self.layers, block.spec.to_dict()]
        self._changed("grow")
        self._start()

    def evaluate(self) -> dict[str, Any]:
        return self._ask("evaluate")["eval"]

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        return self._ask("early_exit", threshold=threshold)["early_exit"]

    def checksums(self) -> dict[int, str]:
        return {int(k): v for k, v in self._ask("checksums")["checksums"].items()}

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        """The newest Ray Train checkpoint's shards, copied into the loop's checkpoint `ckpt_dir`."""
        state = self._current()
        copy_shards(state["fs"], state["path"], state["shards"], store.fs, ckpt_dir)
        return list(state["shards"])

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        self.frozen = 0  # the restored states carry their frozen flags
        self.start = {"fs": store.fs, "path": ckpt_dir, "shards": shards}
        self._changed("restore")
        self.current = True

    def recover(self, specs: list[BlockSpec], layout: Layout | None) -> str:
        self._end()
        self.open(None)  # DDP replicates every block: no layout to keep
        return self.build(specs, None)

    def final_states(self) -> list[dict[str, Any]]:
        state = self._current()
        return load_states(state["fs"], state["path"], state["shards"], [t["index"] for t in self.layers])

    def position(self) -> tuple[int, int] | None:
        return None

    def extras(self) -> dict[str, Any]:
        return {"schedule": "data-parallel (Ray Train DDP)", "workers": self.workers, "trainers": self.trainers,
                "ray_train_storage": f"{self.cfg.checkpoint.uri}/{self.storage_name}"}  # fmt: skip

    stop = _end
