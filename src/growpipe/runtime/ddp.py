"""Data-parallel BP through Ray Train as an Engine (method bp, runtime.bp_schedule: ddp): the baseline the
pipelines are measured against. The same blocks as one network, replicated on `runtime.ddp_workers` Ray
Train workers (TorchTrainer; DDP over gloo on CPUs, NCCL on GPUs); each global mini-batch of
data.batch_size is split evenly across the workers and DDP averages their gradients.

Every step goes through the divergence guard (growpipe.nn.guard), which judges the gradients DDP averaged
(the same on every worker; a worker's own loss may differ), so the workers skip (or stop on) the same
mini-batches and stay replicas.

The loop drives the workers through one command queue each (ray.util.queue): open the data, build, train
an epoch (or up to a batch), grow, evaluate, save, restore, stop. TorchTrainer.fit() runs in a thread of
the engine's process for as long as the run lasts; rank 0 answers for the replicas.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from growpipe.config import RunConfig, build_config
from growpipe.errors import NonFiniteError, PipelineError
from growpipe.loop.engine import EpochPart, Poll, Prepared, WorkerLost
from growpipe.loop.stats import StageStats
from growpipe.nn.guard import SKIPPED, guarded_update
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo

REPLY_POLL_S = 1.0


class Chain(nn.Module):
    """Every block's encoder in order, then the last block's classifier: one module for DDP. Frozen blocks
    (the net grew on top of them) forward without gradients, as in single-process BP."""

    def __init__(self, blocks: list[Any]):
        super().__init__()
        self.encoders = nn.ModuleList([b.modules["f"] for b in blocks])
        self.frozen = [b.frozen for b in blocks]
        self.head = blocks[-1].modules["cls"]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, side: dict) -> torch.Tensor:
        for f, frozen in zip(self.encoders, self.frozen, strict=True):
            if frozen:
                with torch.no_grad():
                    x, mask = f(x, mask, side)
            else:
                x, mask = f(x, mask, side)
            side = {**side, **f.handoff()}  # e.g. an LSTM block's final state for the next (net.lstm_state)
        return self.head(self.encoders[-1].pool(x, mask))


class Replica:
    """One Ray Train worker's copy of the net and its data; each method is one command of the loop."""

    def __init__(self, cfg: RunConfig, rank: int, world: int):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.set_num_threads(max(1, int(cfg.runtime.cpus_per_stage)))
        self.blocks: list[Any] = []
        self.model: Any = None
        self.bundle: Any = None
        self.info: InputInfo | None = None

    def open(self) -> tuple[InputInfo, dict[str, Any]]:
        from growpipe.data import load_data

        self.bundle = load_data(self.cfg.data, self.cfg.seed)
        self.info = InputInfo.from_bundle(self.bundle, self.cfg.net)
        return self.info, self.bundle.describe()

    def build(self, topology: list[dict[str, Any]]) -> str:
        from growpipe.nn.methods import build_block

        assert self.info is not None
        self.blocks = [build_block(self.cfg.rule(), BlockSpec.from_dict(d), self.info) for d in topology]
        self._wrap()
        return type(self.blocks[0]).__name__

    def _wrap(self) -> None:
        import ray.train.torch

        self.model = ray.train.torch.prepare_model(Chain(self.blocks))  # DDP: rank 0's weights broadcast

    def grow(self, spec: dict[str, Any], freeze: bool) -> None:
        from growpipe.nn.methods import build_block

        assert self.info is not None
        block = build_block(self.cfg.rule(), BlockSpec.from_dict(spec), self.info)  # seeded: equal everywhere
        if freeze:
            for b in self.blocks:
                b.freeze()
        self.blocks.append(block)
        self._wrap()

    def epoch(self, epoch: int, start: int, stop_at: int | None) -> dict[str, Any]:
        from growpipe.data.bundle import batch_order

        device = next(self.model.parameters()).device
        split, bs = self.bundle.train, self.cfg.data.batch_size
        self.model.train()
        for b in self.blocks:
            if b.frozen:
                b.modules.eval()
        trainable = [b for b in self.blocks if not b.frozen]
        last = self.blocks[-1]
        loss_sum, batches, skipped, samples, t0, paused_at = 0.0, 0, 0, 0, time.perf_counter(), None
        for index, idx in batch_order(len(split), bs, shuffle=True, seed=self.cfg.seed, epoch=epoch,
                                      start_batch=start):  # fmt: skip
            if stop_at is not None and index >= stop_at:
                paused_at = index
                break
            mine = idx[self.rank :: self.world]  # this worker's shard of the global mini-batch
            x, y = split.batch(mine, epoch)
            with last.computing():
                loss = F.cross_entropy(self.model(x.to(device), None, {}), y.to(device))
            try:  # the backward inside: DDP averages the gradients of all workers there
                optimizers = [b.optimizers["all"] for b in trainable]
                metrics = guarded_update({"ce": loss}, optimizers, last.on_nonfinite, replicated=True)
            except NonFiniteError as e:
                raise e.located(
                    f"DDP worker {self.rank} (block {last.index}, {type(last).__name__})", batch=index
                ) from None
            for b in trainable:
                b.steps += 1
            if SKIPPED in metrics:
                skipped += 1
            else:
                loss_sum += metrics["ce"]
            batches += 1
            samples += len(idx)
        return {"loss": {f"b{last.index}.ce": loss_sum}, "loss_batches": batches - skipped, "batches": batches,
                "skipped": {f"b{b.index}": skipped for b in trainable} if skipped else {}, "samples": samples,
                "busy_s": time.perf_counter() - t0, "paused_at": paused_at}  # fmt: skip

    def net(self) -> GrowableNet:
        assert self.info is not None
        net = GrowableNet(self.cfg.rule(), self.info)
        for b in self.blocks:
            net.append(b)
        return net

    def evaluate(self) -> dict[str, Any] | None:
        from growpipe.evaluation import evaluate_net

        return evaluate_net(self.net(), self.bundle, self.cfg.eval) if self.rank == 0 else None

    def measure_early_exit(self, threshold: float) -> dict[str, Any] | None:
        from growpipe.evaluation import measure_early_exit

        return measure_early_exit(self.net(), self.bundle, self.cfg.eval, threshold) if self.rank == 0 else None

    def checksums(self) -> dict[int, str]:
        return {b.index: b.checksum() for b in self.blocks}

    def states(self) -> list[dict[str, Any]] | None:
        from growpipe.runtime.stage_base import cpu_copy

        return [cpu_copy(b.state_dict()) for b in self.blocks] if self.rank == 0 else None

    def save(self, ckpt_dir: str) -> list[dict[str, Any]] | None:
        from growpipe.checkpoint import block_file
        from growpipe.prepare import checkpoint_store

        if self.rank:
            return None
        store = checkpoint_store(self.cfg)
        assert store is not None
        return [store.write_shard(ckpt_dir, {i: s}, block_file(i)) for i, s in enumerate(self.states() or [])]

    def restore(self, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        from growpipe.checkpoint import CheckpointStore

        store = CheckpointStore(self.cfg.checkpoint.uri, self.cfg.name)
        for b, state in zip(self.blocks, store.load_blocks(ckpt_dir, shards, [b.index for b in self.blocks]),
                            strict=True):  # fmt: skip
            b.load_state_dict(state)
        self._wrap()


def _worker_loop(config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker: answer the engine's commands until it says stop."""
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    commands, replies = config["commands"][rank], config["replies"]
    replica = Replica(build_config(config["cfg"], "ddp worker config"), rank, world)
    while True:
        op, args = commands.get()
        if op == "stop":
            replies.put((rank, "ok", None))
            return
        try:
            replies.put((rank, "ok", getattr(replica, op)(*args)))
        except NonFiniteError as e:  # the error itself: the loop adds the epoch to it
            replies.put((rank, "error", e))
        except Exception as e:  # reported to the engine, which fails the run with it
            replies.put((rank, "error", f"DDP worker {rank}: {type(e).__name__}: {e}"))


class DDPEngine:
    """Method bp data-parallel on Ray Train workers; see the module docstring."""

    name = "ray-train-ddp"
    stage_table = False
    pauses_mid_epoch = False
    net: GrowableNet | None = None

    def __init__(self, cfg: RunConfig, run_name: str, reserved: Any = None, say: Any = None):
        self.cfg = cfg
        self.run_name = run_name
        self.workers = cfg.runtime.ddp_workers or cfg.net.blocks
        self.queues: list[Any] = []
        self.replies: Any = None
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.specs: list[BlockSpec] = []
        self._storage = tempfile.TemporaryDirectory(prefix="growpipe-ddp-")
        self._starts = 0

    def open(self, layout: dict[str, Any] | None = None) -> tuple[InputInfo, dict[str, Any]]:
        self._start_trainer()
        return self._ask("open")

    def _start_trainer(self) -> None:
        import ray
        from ray.train import RunConfig as TrainRunConfig
        from ray.train import ScalingConfig
        from ray.train.torch import TorchTrainer
        from ray.util.queue import Queue

        self.queues = [Queue(actor_options={"num_cpus": 0}) for _ in range(self.workers)]
        self.replies = Queue(actor_options={"num_cpus": 0})
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and self.cfg.runtime.gpus_per_stage != 0
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config={"cfg": self.cfg.model_dump(mode="json"), "commands": self.queues,
                               "replies": self.replies},
            scaling_config=ScalingConfig(num_workers=self.workers, use_gpu=gpus,
                                         resources_per_worker={"CPU": self.cfg.runtime.cpus_per_stage}),
            run_config=TrainRunConfig(storage_path=self._storage.name, name=f"{self.run_name}-{self._starts}"),
        )  # fmt: skip
        self.failure = None
        self._starts += 1

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as e:  # the loop learns of it at its next command
                self.failure = e

        self.thread = threading.Thread(target=fit, name="growpipe-ddp-fit", daemon=True)
        self.thread.start()

    def _ask(self, op: str, *args: Any) -> Any:
        """Send a command to every worker and wait for all answers; rank 0's is returned."""
        for q in self.queues:
            q.put((op, args))
        answers: dict[int, Any] = {}
        while len(answers) < self.workers:
            try:
                rank, status, payload = self.replies.get(timeout=REPLY_POLL_S)
            except queue.Empty:
                if self.thread is None or not self.thread.is_alive():
                    why = str(self.failure).splitlines()[0] if self.failure else "the trainer ended"
                    raise WorkerLost(f"a DDP worker died ({why})") from None
                continue
            except Exception as e:  # the queue actor itself is gone
                raise WorkerLost(f"the DDP command queue is gone ({type(e).__name__})") from None
            if status == "error":
                raise payload if isinstance(payload, NonFiniteError) else PipelineError(payload)
            answers[rank] = payload
        return answers[0]

    def build(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        self.specs = list(specs)
        self._ask("build", [s.to_dict() for s in specs])
        return (f"bp (data-parallel, Ray Train) on {self.cfg.net.backbone}: {self.workers} DDP workers, "
                f"global batch {self.cfg.data.batch_size}")  # fmt: skip

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, poll: Poll) -> EpochPart:
        r = self._ask("epoch", epoch, start_batch, stop_at)
        counted = r["loss_batches"]  # the batches not skipped
        stats = StageStats(0, "DDP", samples=r["samples"], batches=r["batches"], busy_s=r["busy_s"],
                           skipped=r["skipped"], loss_sums=r["loss"] if counted else {},
                           loss_batches={k: counted for k in r["loss"]} if counted else {})  # fmt: skip
        return EpochPart([stats], r["samples"], r["paused_at"])

    def prepare_block(self, spec: BlockSpec) -> Prepared:
        return Prepared(spec, f"on {self.workers} DDP workers", cacheable=False)  # built by every worker at attach

    def attach_block(self, block: Prepared, freeze: bool) -> None:
        self._ask("grow", block.spec.to_dict(), freeze)
        self.specs.append(block.spec)

    def discard_block(self, block: Prepared) -> None:
        """Nothing was placed."""

    def cache_prefix(self) -> dict[str, Any] | None:
        return None

    def evaluate(self) -> dict[str, Any]:
        return self._ask("evaluate")

    def measure_early_exit(self, threshold: float) -> dict[str, Any]:
        return self._ask("measure_early_exit", threshold)

    def checksums(self) -> dict[int, str]:
        return self._ask("checksums")

    def save(self, ckpt_dir: str) -> list[dict[str, Any]]:
        return self._ask("save", ckpt_dir)

    def layout(self) -> dict[str, Any]:
        return {}

    def restore(self, ckpt_dir: str, shards: list[dict[str, Any]]) -> None:
        self._ask("restore", ckpt_dir, shards)

    def recover(self, specs: list[BlockSpec], layout: dict[str, Any] | None) -> str:
        self.stop()
        self.open(layout)
        return self.build(specs, layout)

    def final_states(self) -> list[dict[str, Any]]:
        return self._ask("states")

    def position(self) -> tuple[int, int] | None:
        return None

    def extras(self) -> dict[str, Any]:
        return {"schedule": "data-parallel (Ray Train DDP)", "workers": self.workers}

    def stop(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            for q in self.queues:
                q.put(("stop", ()))
            self.thread.join(timeout=60)
        self.thread = None
        for q in [*self.queues, self.replies]:
            if q is not None:
                q.shutdown()
        self.queues, self.replies = [], None
