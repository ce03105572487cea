"""One Ray Train trainer of the DDP engine (growpipe.runtime.ddp): its configuration, its fit() in a Ray task, its
channel (growpipe.runtime.ddp_channel) read part by part, its end, and the folders of ended trainers removed."""

from __future__ import annotations

import contextlib
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from growpipe.checkpoint import filesystem_of
from growpipe.config import RunConfig
from growpipe.errors import PipelineError
from growpipe.loop.engine import WorkerLost
from growpipe.runtime.ddp_channel import Channel, position_after
from growpipe.runtime.ddp_worker import train_fn

END_S = 120.0  # how long a stopped trainer may take to end before its task is cancelled


@ray.remote(num_cpus=0)
def fit(trainer_kwargs: dict[str, Any]) -> None:
    """One trainer's fit() (a task: the engine waits on it like on any other ref)."""
    from ray.train.torch import TorchTrainer

    TorchTrainer(train_fn, **trainer_kwargs).fit()


def _fit_env(cfg: RunConfig) -> dict[str, Any]:
    """The fit task's environment (Ray Train's controller inherits it): this cluster's address, which Ray Train's
    placement-group cleaner needs to find its State API on a machine that runs more than one Ray; the wait for
    a worker group's room (ddp.start_timeout_s)."""
    return {"env_vars": {"RAY_ADDRESS": ray.get_runtime_context().gcs_address,
                         "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(cfg.ddp.start_timeout_s)}}  # fmt: skip


def _here() -> NodeAffinitySchedulingStrategy:
    """On the controller's node (the head's: losing a worker's node must not take the trainer's fit or channel
    with it). Not soft: a soft affinity let Ray put a 0-CPU actor on a worker's node when the head has no CPU."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def _trainer_kwargs(cfg: RunConfig, storage: str, name: str) -> dict[str, Any]:
    """TorchTrainer's scaling (elastic between ddp.min_workers and ddp.workers), retries and checkpoints."""
    from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
    from ray.train import RunConfig as TrainRunConfig

    rt, most, least = cfg.runtime, cfg.ddp.workers or cfg.net.blocks, cfg.ddp.min_workers
    gpus = ray.cluster_resources().get("GPU", 0) > 0 and rt.gpus_per_stage != 0
    return {
        "scaling_config": ScalingConfig(num_workers=(least, most) if least is not None and least < most else most,  # type: ignore[arg-type]
                                        use_gpu=gpus, resources_per_worker={"CPU": rt.cpus_per_stage}),
        # its newest 3: the part the loop stands on survives the two the trainer may report ahead of it
        "run_config": TrainRunConfig(storage_path=storage, name=name,
                                     failure_config=FailureConfig(max_failures=rt.max_stage_restarts),
                                     checkpoint_config=CheckpointConfig(num_to_keep=3)),
    }  # fmt: skip


def remove_folders(storage: str, names: list[str]) -> None:
    """Remove ended trainers' folders under `storage` (the run stands on the newest part; restore points are
    copies)."""
    fs, root = filesystem_of(storage)
    for name in names:
        with contextlib.suppress(OSError, FileNotFoundError):
            fs.delete_dir(f"{root}/{name}")


class Trainer:
    """One Ray Train trainer of the engine: its fit task, its channel, the next part it reports."""

    def __init__(self, cfg: RunConfig, storage: str, name: str, config: dict[str, Any]):
        self.channel = Channel.options(scheduling_strategy=_here()).remote()  # type: ignore[attr-defined]
        kwargs = {**_trainer_kwargs(cfg, storage, name), "train_loop_config": {**config, "channel": self.channel}}
        self.run = fit.options(runtime_env=_fit_env(cfg), scheduling_strategy=_here()).remote(kwargs)
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
        self.next = position_after(part)
        return part

    def stop(self) -> None:
        self.channel.stop.remote()

    def end(self) -> None:
        self.stop()
        if not ray.wait([self.run], timeout=END_S)[0]:
            ray.cancel(self.run, force=True)  # its Ray Train controller and workers go with the task's process
        ray.kill(self.channel)
