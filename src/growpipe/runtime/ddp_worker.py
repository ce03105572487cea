"""The train function of the DDP engine's Ray Train workers (growpipe.runtime.ddp), which owns its epochs.

Every worker holds a replica of the net and trains its shard of each global mini-batch, from
`ray.train.get_checkpoint()` after Ray Train restarted its group, else from the checkpoint the engine named, to the
run's last epoch, reporting each part (an epoch, or up to a restore point) with a checkpoint (shards + `part.json`).
Rank 0 hands the part to the engine's channel, which also tells it to stop before its next batch (growth, the end).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict
from typing import Any

import ray
import torch
import torch.nn.functional as F

from growpipe import faults
from growpipe.checkpoint import filesystem_of, write_shard_at
from growpipe.config import build_config
from growpipe.data import load_data
from growpipe.data.batches import epoch_batches
from growpipe.errors import NonFiniteError
from growpipe.evaluation import evaluate_net
from growpipe.loop.policies import CheckpointTiming
from growpipe.loop.stats import StageStats
from growpipe.nn.guard import SKIPPED, guarded_update
from growpipe.nn.specs import InputInfo
from growpipe.quiet import quiet_libraries
from growpipe.runtime.ddp_channel import StopFlag, placed_part, position_after
from growpipe.runtime.ddp_net import Chain, as_net, assemble
from growpipe.snapshot import cpu_copy, read_files, write_files

PART = "part.json"


class Replica:
    """One worker's copy of the net, from checkpoint `start` ({fs, path, shards}; None: fresh), and its data."""

    def __init__(self, config: dict[str, Any], start: dict[str, Any] | None, rank: int, world: int):
        import ray.train.torch

        self.cfg, self.rank, self.world = build_config(config["cfg"], "ddp worker config"), rank, world
        torch.set_num_threads(max(1, int(self.cfg.runtime.cpus_per_stage)))
        self.bundle = load_data(self.cfg.data, self.cfg.seed)
        self.info = InputInfo.from_bundle(self.bundle, self.cfg.net)
        self.device = ray.train.torch.get_device()  # the blocks know it too: autocast and evaluation follow it
        self.blocks = assemble(self.cfg, self.info, config["topology"], config["frozen"], start, self.device,
                               config["thaw"])  # fmt: skip
        self.model = ray.train.torch.prepare_model(Chain(self.blocks))  # DDP: rank 0's weights broadcast
        self.steps = 0  # training steps run by this worker (for fault injection)

    def train(self, epoch: int, start: int, stop_at: int | None, stop: StopFlag) -> dict[str, Any]:
        """This worker's shard of each global mini-batch of `epoch` from batch `start` to the epoch's end, batch
        `stop_at` (a restore point) or a stop: {"stats", "at": the batch it stopped before (None: the end)}."""
        for b in self.blocks:
            b.modules.train(not b.frozen)  # frozen blocks (the net grew on top of them) stay in eval mode
        trainable = [b for b in self.blocks if not b.frozen]
        optimizers = [b.optimizers["all"] for b in trainable]
        last, stats, t0, at = self.blocks[-1], StageStats(0, "DDP"), time.perf_counter(), None
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
                loss = F.cross_entropy(self.model(p.x.to(self.device), None, {}), p.labels().to(self.device))
            for b in trainable:
                b.set_scheduled_lr()
            try:  # the backward inside: DDP averages the gradients of all workers there
                metrics = guarded_update({"ce": loss}, optimizers, last.on_nonfinite, replicated=True,
                                         grad_clip=last.grad_clip)  # fmt: skip
            except NonFiniteError as e:
                raise e.located(f"DDP worker {self.rank} (block {last.index}, {type(last).__name__})",
                                batch=batch.index) from None  # fmt: skip
            for b in trainable:
                b.steps += 1
            skips = {f"b{b.index}.{SKIPPED}": 1.0 for b in trainable}
            stats.add_batch(batch.samples, skips if SKIPPED in metrics else {f"b{last.index}.ce": metrics["ce"]})
        stats.busy_s = time.perf_counter() - t0
        return {"stats": asdict(stats), "at": at}

    def report(self, part: dict[str, Any]) -> dict[str, Any]:
        """`ray.train.report` of `part`; rank 0 adds the checkpoint (and, at an epoch's end, the evaluation: the
        others wait at the report) and gets the part back with its checkpoint's place."""
        with tempfile.TemporaryDirectory(prefix="growpipe-ddp-") as tmp:
            checkpoint = None
            if self.rank == 0:
                if part["at"] is None:
                    net = as_net(self.cfg, self.info, self.blocks, self.device)
                    part["eval"] = evaluate_net(net, self.bundle, self.cfg.eval)
                local, _ = filesystem_of(tmp)
                part["shards"] = [write_shard_at(local, tmp, {b.index: cpu_copy(b.state_dict())}) for b in self.blocks]
                write_files(local, tmp, {PART: json.dumps(part).encode()})
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": part["epoch"], "batch": part["at"] or 0, "seq": part["seq"]}, checkpoint)
        return part if self.rank else placed_part(part, ray.train.get_checkpoint())


def train_fn(config: dict[str, Any]) -> None:
    """The train function of every Ray Train worker (see the module docstring); `config`: see DDPEngine._trainer."""
    import ray.train

    quiet_libraries()  # Ray Train's INFO line for every report and checkpoint is bookkeeping
    ctx, channel = ray.train.get_context(), config["channel"]
    start, (epoch, batch), seq = config["start"], config["position"], 0
    if (checkpoint := ray.train.get_checkpoint()) is not None:  # Ray Train restarted the group from its newest
        part = placed_part(json.loads(read_files(checkpoint.filesystem, checkpoint.path, [PART])[PART]), checkpoint)
        start, seq, (epoch, batch) = part["checkpoint"], part["seq"] + 1, position_after(part)
        if ctx.get_world_rank() == 0:  # the engine may not have it yet: the worker that died may have held it
            ray.get(channel.put.remote(part))
    replica = Replica(config, start, ctx.get_world_rank(), ctx.get_world_size())
    stop = StopFlag(channel, replica.device)
    timing = CheckpointTiming.from_spec(replica.cfg.checkpoint)  # the restore points the loop stops at
    while epoch <= replica.cfg.total_epochs():
        done = replica.train(epoch, batch, timing.next_stop(batch), stop)
        part = replica.report({"seq": seq, "epoch": epoch, **done, "eval": None, "workers": replica.world})
        if replica.rank == 0:
            ray.get(channel.put.remote(part))  # waits while the engine is a part behind
        if done["at"] is not None and stop():
            return
        seq, (epoch, batch) = seq + 1, position_after(part)
