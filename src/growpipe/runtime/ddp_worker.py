"""What every Ray Train worker of the DDP engine runs (growpipe.runtime.ddp): a replica of the whole net on its
shard of each global mini-batch, answering the engine's orders one at a time.

Rank 0 fetches each order from the engine's mailbox (through the run's controller actor) and broadcasts it;
every worker runs it and calls ray.train.report, with a checkpoint (growpipe's shard format plus
`report.json`) whenever the order changed the weights; the engine names that checkpoint in its next order.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from growpipe import faults
from growpipe.checkpoint import block_file, encode_shard, load_states
from growpipe.config import RunConfig, build_config
from growpipe.data import load_data
from growpipe.data.batches import epoch_batches
from growpipe.errors import GrowpipeError, NonFiniteError
from growpipe.evaluation import evaluate_net, measure_early_exit
from growpipe.nn.backbones import encoder_of
from growpipe.nn.guard import SKIPPED, guarded_update
from growpipe.nn.methods import build_block
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime import NAMESPACE
from growpipe.runtime.stage_base import cpu_copy

REPORT = "report.json"


class Chain(nn.Module):
    """Every block's encoder in order, then the last block's classifier: one module for DDP. Frozen blocks
    (the net grew on top of them) forward without gradients, as in single-process BP."""

    def __init__(self, blocks: list[Any]):
        super().__init__()
        self.encoders = nn.ModuleList([b.modules["f"] for b in blocks])
        self.encoder_list = [encoder_of(b.modules) for b in blocks]  # the same modules, as their class
        self.frozen = [b.frozen for b in blocks]
        self.head = blocks[-1].modules["cls"]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, side: dict) -> torch.Tensor:
        for f, frozen in zip(self.encoder_list, self.frozen, strict=True):
            with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
                x, mask = f(x, mask, side)
            side = {**side, **f.handoff()}  # e.g. an LSTM block's final state for the next (net.lstm_state)
        return self.head(self.encoder_list[-1].pool(x, mask))


class Replica:
    """One worker's copy of the net and its data."""

    def __init__(self, cfg: RunConfig, rank: int, world: int):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.set_num_threads(max(1, int(cfg.runtime.cpus_per_stage)))
        self.bundle = load_data(cfg.data, cfg.seed)
        self.info = InputInfo.from_bundle(self.bundle, cfg.net)
        self.blocks: list[Any] = []
        self.model: Any = None
        self.steps = 0  # training steps run by this worker (for fault injection)

    def setup(self, topology: list[dict[str, Any]], frozen: int, start: dict[str, Any] | None) -> None:
        """Build the blocks of `topology` (seeded: equal on every worker), load what `start` holds of them,
        freeze the first `frozen`, and wrap them for DDP."""
        import ray.train.torch

        self.blocks = [build_block(self.cfg.rule(), BlockSpec.from_dict(d), self.info) for d in topology]
        if start:
            held = [b for b in self.blocks if any(b.index in e["blocks"] for e in start["shards"])]
            states = load_states(start["fs"], start["path"], start["shards"], [b.index for b in held])
            for b, state in zip(held, states, strict=True):
                b.load_state_dict(state)
        for b in self.blocks[:frozen]:
            if not b.frozen:
                b.freeze()
        self.model = ray.train.torch.prepare_model(Chain(self.blocks))  # DDP: rank 0's weights broadcast

    def describe(self) -> dict[str, Any]:
        return {"info": self.info.to_dict(), "data": self.bundle.describe()}

    def train(self, epoch: int, start: int, stop_at: int | None) -> dict[str, Any]:
        """Train this worker's shard of each global mini-batch of `epoch` from batch `start` (before `stop_at`)."""
        device = next(self.model.parameters()).device
        split, bs = self.bundle.train, self.cfg.data.batch_size
        self.model.train()
        for b in self.blocks:
            if b.frozen:
                b.modules.eval()
        trainable = [b for b in self.blocks if not b.frozen]
        optimizers = [b.optimizers["all"] for b in trainable]
        last = self.blocks[-1]
        loss_sum, batches, skipped, samples, t0, paused_at = 0.0, 0, 0, 0, time.perf_counter(), None
        for batch in epoch_batches(split, bs, seed=self.cfg.seed, epoch=epoch, start_batch=start, augment=True,
                                   shard=(self.rank, self.world)):  # fmt: skip
            if stop_at is not None and batch.index >= stop_at:
                paused_at = batch.index
                break
            self.steps += 1
            faults.maybe_die_at(self.rank, self.steps)  # GROWPIPE_DIE_AT
            p = batch.parts[0]  # this worker's shard of the global mini-batch
            with last.computing():
                loss = F.cross_entropy(self.model(p.x.to(device), None, {}), p.labels().to(device))
            try:  # the backward inside: DDP averages the gradients of all workers there
                metrics = guarded_update(
                    {"ce": loss}, optimizers, last.on_nonfinite, replicated=True, grad_clip=last.grad_clip
                )  # each block's averaged gradients
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
                "busy_s": time.perf_counter() - t0, "paused_at": paused_at}  # fmt: skip

    def net(self) -> GrowableNet:
        net = GrowableNet(self.cfg.rule(), self.info)
        for b in self.blocks:
            net.append(b)
        return net

    def write(self, directory: str, report: dict[str, Any]) -> None:
        """Every block's state as growpipe shards, and `report` (with the shards' entries) as report.json."""
        shards = []
        for b in self.blocks:
            data, entry = encode_shard({b.index: cpu_copy(b.state_dict())}, block_file(b.index))
            Path(directory, entry["file"]).write_bytes(data)
            shards.append(entry)
        report.update(shards=shards)
        Path(directory, REPORT).write_text(json.dumps(report))


def _run(replica: Replica, order: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Run one order; (what rank 0 reports, whether the weights changed)."""
    op = order["op"]
    if op == "describe":
        return replica.describe(), False
    if op == "train":
        return replica.train(order["epoch"], order["start"], order["stop_at"]), True
    if op == "checkpoint":
        return {}, True
    if replica.rank:  # evaluation runs on rank 0 alone, the other replicas wait at the report
        return {}, False
    if op == "checksums":  # asked for when the loop checks frozen blocks, not hashed at every checkpoint
        return {"checksums": {b.index: b.checksum() for b in replica.blocks}}, False
    if op == "evaluate":
        return {"eval": evaluate_net(replica.net(), replica.bundle, replica.cfg.eval)}, False
    if op == "early_exit":
        return {"early_exit": measure_early_exit(replica.net(), replica.bundle, replica.cfg.eval,
                                                 order["threshold"])}, False  # fmt: skip
    raise ValueError(f"unknown order {op!r}")


def worker_loop(config: dict[str, Any]) -> None:
    """The train function of every Ray Train worker: answer orders until the engine says end.

    Each order names the state it runs on (a version, the topology and the checkpoint holding it); a worker
    group that is not at that version (it just started: a new trainer, or Ray Train replaced a lost worker)
    builds the net and loads that checkpoint first, so an order that was in flight when a worker died runs
    again from where it started."""
    import ray.train

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    replica = Replica(build_config(config["cfg"], "ddp worker config"), rank, ctx.get_world_size())
    controller = ray.get_actor(config["run"], namespace=NAMESPACE) if rank == 0 else None
    version, report = None, None
    while True:
        box: list[Any] = [ray.get(controller.rendezvous.remote(report)) if controller is not None else None]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)
        order: dict[str, Any] = box[0]
        if order["op"] == "end":
            return
        state = order.get("state")
        try:
            if state is not None and state["version"] != version:
                replica.setup(state["topology"], state["frozen"], state["start"])
                version = state["version"]
            answer, changed = _run(replica, order)
        except (GrowpipeError, ValueError) as e:  # the same on every replica: said once, not retried by Train
            answer, changed = {"error": e}, False
        report = {**answer, "seq": order["seq"]}
        if changed and "error" not in answer:
            version = order["seq"]
            with tempfile.TemporaryDirectory(prefix="growpipe-ddp-") as tmp:
                if rank == 0:
                    replica.write(tmp, report)
                checkpoint = ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None
                ray.train.report({"seq": order["seq"]}, checkpoint=checkpoint)
            if rank == 0:
                persisted = ray.train.get_checkpoint()
                report.update(path=persisted.path, fs=persisted.filesystem)
        else:
            ray.train.report({"seq": order["seq"]})
