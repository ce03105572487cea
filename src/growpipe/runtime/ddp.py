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

import asyncio
import contextlib
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from growpipe.checkpoint import CheckpointStore, block_file, copy_shards, encode_shard, filesystem_of
from growpipe.config import RunConfig
from growpipe.errors import PipelineError
from growpipe.loop.engine import EpochPart, Pause, Prepared, WithoutBundles, WorkerLost
from growpipe.loop.stats import StageStats
from growpipe.loop.topology import Layout
from growpipe.nn.block import checksum_of
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.ddp_worker import assemble, describe_data, measure_net, train_fn
from growpipe.runtime.stage_base import cpu_copy

END_S = 120.0  # how long a stopped trainer may take to end before its task is cancelled


@ray.remote(num_cpus=0)
class Channel:
    """A trainer's parts on their way to the engine, and the engine's stop (async: every wait is an await)."""

    def __init__(self) -> None:
        self.parts: dict[int, dict[str, Any]] = {}
        self.taken = 0  # the next part the engine takes
        self.changed = asyncio.Condition()
        self.stop_event = asyncio.Event()

    async def put(self, part: dict[str, Any]) -> None:
        """Hand in a part; return once the engine has taken the one before it (or was stopped)."""
        async with self.changed:
            if part["seq"] >= self.taken:
                self.parts[part["seq"]] = part
                self.changed.notify_all()
            await self.changed.wait_for(lambda: self.taken >= part["seq"] or self.stop_event.is_set())

    async def take(self, seq: int, wait: bool = True) -> dict[str, Any] | None:
        async with self.changed:
            if wait:
                await self.changed.wait_for(lambda: seq in self.parts)
            part = self.parts.pop(seq, None)
            self.taken = seq + 1 if part is not None else self.taken
            self.changed.notify_all()
            return part

    async def stop(self) -> None:
        async with self.changed:
            self.stop_event.set()
            self.changed.notify_all()

    async def stopped(self) -> bool:
        await self.stop_event.wait()
        return True


@ray.remote(num_cpus=0)
def fit(trainer_kwargs: dict[str, Any]) -> None:
    """One trainer's fit() (a task: the engine waits on it like on any other ref)."""
    from ray.train.torch import TorchTrainer

    TorchTrainer(train_fn, **trainer_kwargs).fit()


def _fit_env() -> dict[str, Any]:
    """The fit task's environment: this cluster's address, which Ray Train's placement-group cleaner needs to
    find its State API on a machine that runs more than one Ray."""
    return {"env_vars": {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}}


def _here() -> NodeAffinitySchedulingStrategy:
    """On the controller's node (the head's: losing a worker's node must not take the trainer's fit or channel
    with it). Not soft: a soft affinity let Ray put a 0-CPU actor on a worker's node when the head has no CPU."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


class Trainer:
    """One Ray Train trainer of the engine: its fit task, its channel, the next part it reports."""

    def __init__(self, kwargs: dict[str, Any], config: dict[str, Any]):
        self.channel = Channel.options(scheduling_strategy=_here()).remote()  # type: ignore[attr-defined]
        kwargs["train_loop_config"] = {**config, "channel": self.channel}
        self.run = fit.options(runtime_env=_fit_env(), scheduling_strategy=_here()).remote(kwargs)
        self.seq, self.next = 0, tuple(config["position"])

    def part(self) -> dict[str, Any]:
        """The next part (PipelineError when the trainer failed: Ray Train had used up its retries)."""
        taking = self.channel.take.remote(self.seq)
        ready, _ = ray.wait([taking, self.run], num_returns=1)
        if taking not in ready:  # the trainer ended: everything it put is in the channel
            try:
                ray.get(self.run)
            except ray.exceptions.RayError as e:
                cause = getattr(e, "cause", None) or e
                why = (str(cause).strip() or type(cause).__name__).splitlines()[0]
                raise PipelineError(f"the DDP trainer failed: {why}") from None
            taking = self.channel.take.remote(self.seq, wait=False)
        try:
            part = ray.get(taking)
        except ray.exceptions.RayActorError as e:  # the channel's process was lost (e.g. killed out of memory)
            raise PipelineError(f"the DDP engine's channel actor died ({str(e).splitlines()[0]})") from None
        if part is None:
            raise WorkerLost("the DDP trainer ended without reporting its part")
        self.seq += 1
        self.next = (part["epoch"], part["at"]) if part["at"] is not None else (part["epoch"] + 1, 0)
        return part

    def stop(self) -> None:
        self.channel.stop.remote()

    def end(self) -> None:
        self.stop()
        if not ray.wait([self.run], timeout=END_S)[0]:
            ray.cancel(self.run, force=True)  # its Ray Train controller and workers go with the task's process
        ray.kill(self.channel)


class DDPEngine(WithoutBundles):
    """Method bp data-parallel on Ray Train workers; see the module docstring."""

    name = "ray-train-ddp"
    stage_table = False
    places_while_training = True  # nothing is placed: the block is built when the next trainer starts
    net: GrowableNet | None = None

    def __init__(self, cfg: RunConfig, run_name: str, reserved: Any = None, say: Any = None):
        self.cfg, self.run_name, self.storage = cfg, run_name, f"{cfg.checkpoint.uri}/{run_name}.ray-train"
        self.workers = cfg.ddp.workers or cfg.net.blocks
        self.config = cfg.model_dump(mode="json")
        self.info: InputInfo | None = None
        self.layers: list[dict[str, Any]] = []
        self.frozen = 0  # blocks frozen by growth (a block's state carries its own flag too)
        self.at: dict[str, Any] | None = None  # the checkpoint {fs, path, shards} the loop stands on; None: fresh
        self.exact = True  # `at` holds every block as it is (after a growth: not the new one, nor frozen flags)
        self.eval: dict[str, Any] | None = None  # the evaluation reported with the part `at` came from
        self.trainer: Trainer | None = None
        self.trainers, self.stopped = 0, False
        self.attempt = uuid.uuid4().hex[:8]  # names this engine's trainers: a resumed run's start afresh
        self.pruned = 0  # this engine's trainers up to this one have had their folders removed
        self.training_workers = 0  # the workers that trained the newest part (elastic: may be fewer)
        self._built: tuple[tuple[Any, int, int], list[dict[str, Any]]] | None = None  # _states()'s last answer

    def _start(self, epoch: int, batch: int) -> None:
        """A new trainer from `at`, at batch `batch` of epoch `epoch`."""
        from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
        from ray.train import RunConfig as TrainRunConfig

        self._end()
        self.trainers += 1
        rt, timing = self.cfg.runtime, self.cfg.checkpoint
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and rt.gpus_per_stage != 0
        least = self.cfg.ddp.min_workers
        scale = (least, self.workers) if least is not None and least < self.workers else self.workers
        kwargs = {
            "scaling_config": ScalingConfig(num_workers=scale, use_gpu=gpus,  # type: ignore[arg-type]  # elastic (min, max)
                                            resources_per_worker={"CPU": rt.cpus_per_stage}),
            # its newest 3: the part the loop stands on survives the two the trainer may report ahead of it
            "run_config": TrainRunConfig(storage_path=self.storage, name=f"{self.attempt}-{self.trainers}",
                                         failure_config=FailureConfig(max_failures=rt.max_stage_restarts),
                                         checkpoint_config=CheckpointConfig(num_to_keep=3)),
        }  # fmt: skip
        config = {"cfg": self.config, "topology": self.layers, "frozen": self.frozen, "start": self.at,
                  "position": (epoch, batch), "last_epoch": self.cfg.total_epochs(),
                  "every": timing.every_batches if timing.enabled else 0}  # fmt: skip
        self.trainer = Trainer(kwargs, config)

    def _end(self) -> None:
        if self.trainer is not None:
            self.trainer.end()
        self.trainer = None

    def _prune(self) -> None:
        """Remove the folders of this engine's earlier trainers (the run stands on the newest one's part; its
        restore points are copies)."""
        fs, root = filesystem_of(self.storage)
        for n in range(self.pruned + 1, self.trainers):
            with contextlib.suppress(OSError, FileNotFoundError):
                fs.delete_dir(f"{root}/{self.attempt}-{n}")
        self.pruned = max(self.pruned, self.trainers - 1)

    def _states(self) -> list[dict[str, Any]]:
        """Every block's state as it is now, built here once per change (a growth asks for its checksums, then
        saves: one build)."""
        assert self.info is not None
        key = (self.at, len(self.layers), self.frozen)
        if self._built is None or self._built[0] != key:
            blocks = assemble(self.cfg, self.info, self.layers, self.frozen, self.at)
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
        self._built = None
        return (f"bp (data-parallel, Ray Train) on {self.cfg.net.backbone}: {self.workers} DDP workers, "
                f"global batch {self.cfg.data.batch_size}")  # fmt: skip

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        if self.stopped:
            raise WorkerLost("the DDP trainer was stopped")
        if self.trainer is None or self.trainer.next != (epoch, start_batch):
            self._start(epoch, start_batch)
        assert self.trainer is not None
        with pause.forwarded(self.trainer.stop):
            part = self.trainer.part()
        if self.stopped:
            raise WorkerLost("the DDP trainer was stopped")
        self.at, self.exact, self.eval = part["checkpoint"], True, part["eval"]
        self.training_workers = part["workers"]
        self._prune()
        counted = part["loss_batches"]  # the batches not skipped
        stats = StageStats(0, "DDP", samples=part["samples"], batches=part["batches"], busy_s=part["busy_s"],
                           skipped=part["skipped"], loss_sums=part["loss"] if counted else {},
                           loss_batches={k: counted for k in part["loss"]} if counted else {})  # fmt: skip
        return EpochPart([stats], part["samples"], part["at"])

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        return Prepared(spec, f"on {self.workers} DDP workers", cacheable=False)  # built when a trainer starts

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        """The grown net: the next trainer starts from the newest checkpoint, the new block freshly built."""
        self._end()
        self.frozen = len(self.layers) if freeze else self.frozen
        self.layers = [*self.layers, block.spec.to_dict()]
        self.exact, self.eval = False, None

    def evaluate(self) -> dict[str, Any]:
        if self.eval is None or not self.exact:
            self.eval = ray.get(measure_net.remote(self.config, self.layers, self.frozen, self.at))
        return self.eval

    def measure_early_exit(self, threshold: float | None) -> dict[str, Any]:
        return ray.get(measure_net.remote(self.config, self.layers, self.frozen, self.at, threshold, True))

    def checksums(self) -> dict[int, str]:
        return {int(t["index"]): checksum_of(s["modules"]) for t, s in zip(self.layers, self._states(), strict=True)}

    def save(self, store: CheckpointStore, ckpt_dir: str) -> list[dict[str, Any]]:
        """The part's shards copied into the loop's checkpoint `ckpt_dir` (written from here after a growth,
        or at the start: the fresh net)."""
        if self.exact and self.at is not None:
            copy_shards(self.at["fs"], self.at["path"], self.at["shards"], store.fs, ckpt_dir)
            return list(self.at["shards"])
        store.fs.create_dir(ckpt_dir, recursive=True)
        shards = []
        for t, state in zip(self.layers, self._states(), strict=True):
            data, entry = encode_shard({t["index"]: state}, block_file(t["index"]))
            with store.fs.open_output_stream(f"{ckpt_dir}/{entry['file']}") as f:
                f.write(data)
            shards.append(entry)
        self.at, self.exact = {"fs": store.fs, "path": ckpt_dir, "shards": shards}, True
        return shards

    def restore(self, store: CheckpointStore, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        self._end()
        self.frozen = 0  # the restored states carry their frozen flags
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
