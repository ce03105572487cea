"""The train function of the DDP engine's Ray Train workers (growpipe.runtime.ddp), which owns its epochs.

Every worker holds a replica of the whole net and trains its shard of each global mini-batch. The train function
starts from `ray.train.get_checkpoint()` when Ray Train restarted its group (a worker was lost), else from the
checkpoint the engine named (a new trainer: the run's start, a growth, a restore). It trains from there to the
run's last epoch and reports every part (an epoch, or up to a mid-epoch restore point) through `ray.train.report`
with a checkpoint: growpipe's shards plus `part.json`. Rank 0 then hands the part to the engine's channel, which
also tells it when to stop before its next batch (a growth waits, or the run ends).
"""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any

import ray
import torch
import torch.nn.functional as F

from growpipe import faults
from growpipe.checkpoint import filesystem_of, write_shard_at
from growpipe.config import RunConfig, build_config
from growpipe.data import load_data
from growpipe.data.batches import epoch_batches
from growpipe.errors import NonFiniteError
from growpipe.evaluation import evaluate_net
from growpipe.loop.policies import CheckpointTiming
from growpipe.nn.block import Block
from growpipe.nn.guard import SKIPPED, guarded_update
from growpipe.nn.specs import InputInfo
from growpipe.quiet import quiet_libraries
from growpipe.runtime.ddp_channel import StopFlag, position_after
from growpipe.runtime.ddp_net import Chain, as_net, assemble
from growpipe.runtime.stage_base import cpu_copy

PART = "part.json"


class Replica:
    """One worker's copy of the net and its data."""

    def __init__(self, cfg: RunConfig, rank: int, world: int):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.set_num_threads(max(1, int(cfg.runtime.cpus_per_stage)))
        self.bundle = load_data(cfg.data, cfg.seed)
        self.info = InputInfo.from_bundle(self.bundle, cfg.net)
        self.blocks: list[Block] = []
        self.model: Any = None
        self.steps = 0  # training steps run by this worker (for fault injection)

    def setup(self, topology: list[dict[str, Any]], frozen: int, start: dict[str, Any] | None) -> None:
        import ray.train.torch

        self.blocks = assemble(self.cfg, self.info, topology, frozen, start)
        self.model = ray.train.torch.prepare_model(Chain(self.blocks))  # DDP: rank 0's weights broadcast

    def train(self, epoch: int, start: int, stop_at: int | None, stop: StopFlag) -> dict[str, Any]:
        """Train this worker's shard of each global mini-batch of `epoch` from batch `start`, up to its end,
        batch `stop_at` (a restore point; None: none) or a stop; what it did ({"at": the batch it stopped
        before, or None at the epoch's end})."""
        device = next(self.model.parameters()).device
        self.model.train()
        for b in self.blocks:
            if b.frozen:
                b.modules.eval()
        trainable = [b for b in self.blocks if not b.frozen]
        optimizers = [b.optimizers["all"] for b in trainable]
        last = self.blocks[-1]
        loss_sum, batches, skipped, samples, t0, at = 0.0, 0, 0, 0, time.perf_counter(), None
        for batch in epoch_batches(self.bundle.train, self.cfg.data.batch_size, seed=self.cfg.seed, epoch=epoch,
                                   start_batch=start, augment=True, shard=(self.rank, self.world)):  # fmt: skip
            faults.hold_before(epoch, batch.index, stop)  # GROWPIPE_HOLD_AT
            if (stop_at is not None and batch.index >= stop_at) or stop():
                at = batch.index
                break
            self.steps += 1
            faults.maybe_die_at(self.rank, self.steps)  # GROWPIPE_DIE_AT
            p = batch.parts[0]  # this worker's shard of the global mini-batch
            with last.computing():
                loss = F.cross_entropy(self.model(p.x.to(device), None, {}), p.labels().to(device))
            try:  # the backward inside: DDP averages the gradients of all workers there
                metrics = guarded_update({"ce": loss}, optimizers, last.on_nonfinite, replicated=True,
                                         grad_clip=last.grad_clip)  # fmt: skip
            except NonFiniteError as e:
                raise e.located(f"DDP worker {self.rank} (block {last.index}, {type(last).__name__})",
                                batch=batch.index) from None  # fmt: skip
            for b in trainable:
                b.steps += 1
            skipped += SKIPPED in metrics
            loss_sum += metrics.get("ce", 0.0)
            batches += 1
            samples += batch.samples
        return {"loss": {f"b{last.index}.ce": loss_sum}, "loss_batches": batches - skipped, "batches": batches,
                "skipped": {f"b{b.index}": skipped for b in trainable} if skipped else {}, "samples": samples,
                "busy_s": time.perf_counter() - t0, "at": at}  # fmt: skip

    def report(self, part: dict[str, Any]) -> dict[str, Any]:
        """`ray.train.report` of this part with its checkpoint (written by rank 0); on rank 0 the part with the
        persisted checkpoint's place."""
        with tempfile.TemporaryDirectory(prefix="growpipe-ddp-") as tmp:
            checkpoint = None
            if self.rank == 0:
                local, _ = filesystem_of(tmp)
                shards = [write_shard_at(local, tmp, {b.index: cpu_copy(b.state_dict())}) for b in self.blocks]
                part = {**part, "shards": shards}
                with local.open_output_stream(f"{tmp}/{PART}") as f:
                    f.write(json.dumps(part).encode())
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            metrics = {"epoch": part["epoch"], "batch": part["at"] or 0, "seq": part["seq"]}
            ray.train.report(metrics, checkpoint=checkpoint)
        if self.rank:
            return part
        return _placed(part, ray.train.get_checkpoint())


def _placed(part: dict[str, Any], checkpoint: Any) -> dict[str, Any]:
    """`part` with the place of the Ray Train checkpoint that holds it ({fs, path, shards}, as the engine reads)."""
    return {**part, "checkpoint": {"fs": checkpoint.filesystem, "path": checkpoint.path, "shards": part["shards"]}}


def _restarted_from(checkpoint: Any) -> dict[str, Any]:
    """The part a checkpoint of this trainer holds, with its place."""
    with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/{PART}") as f:
        return _placed(json.loads(f.read()), checkpoint)


def train_fn(config: dict[str, Any]) -> None:
    """The train function of every Ray Train worker (see the module docstring). `config`: the run config, the
    topology, the frozen blocks, the checkpoint to start from, the (epoch, batch) it is at, the last epoch,
    and the engine's channel."""
    import ray.train

    quiet_libraries()  # Ray Train's INFO line for every report and checkpoint is bookkeeping
    ctx = ray.train.get_context()
    rank, channel = ctx.get_world_rank(), config["channel"]
    replica = Replica(build_config(config["cfg"], "ddp worker config"), rank, ctx.get_world_size())
    start, (epoch, batch), seq = config["start"], config["position"], 0
    if (checkpoint := ray.train.get_checkpoint()) is not None:  # Ray Train restarted the group from its newest
        part = _restarted_from(checkpoint)
        start, seq = part["checkpoint"], part["seq"] + 1
        epoch, batch = position_after(part)
        if rank == 0:  # the engine may not have it yet: the worker that died may have held it
            ray.get(channel.put.remote(part))
    replica.setup(config["topology"], config["frozen"], start)
    stop = StopFlag(channel, next(replica.model.parameters()).device)
    timing = CheckpointTiming.from_spec(replica.cfg.checkpoint)  # the restore points the loop stops at
    while epoch <= config["last_epoch"]:
        done = replica.train(epoch, batch, timing.next_stop(batch), stop)
        part = {"seq": seq, "epoch": epoch, **done, "eval": None, "workers": replica.world}
        if done["at"] is None and rank == 0:  # rank 0 evaluates, the others wait at the report
            part["eval"] = evaluate_net(as_net(replica.cfg, replica.info, replica.blocks), replica.bundle,
                                        replica.cfg.eval)  # fmt: skip
        part = replica.report(part)
        if rank == 0:
            ray.get(channel.put.remote(part))  # waits while the engine is a part behind
        if done["at"] is not None and stop():
            return
        seq, (epoch, batch) = seq + 1, position_after(part)
