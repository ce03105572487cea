"""Data-parallel BP through Ray Train: the baseline pipeline papers measure against (method bp,
runtime.bp_schedule: ddp). The same blocks as one network, replicated on `runtime.ddp_workers` Ray Train
workers (TorchTrainer; DDP over gloo on CPUs, NCCL on GPUs); each global mini-batch of data.batch_size is
split evenly across the workers and DDP averages their gradients, so every step is the global batch's.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from growpipe.config import RunConfig, build_config
from growpipe.nn.backbones import head_features


class Chain(nn.Module):
    """Every block's encoder in order, then the last block's classifier: one module for DDP."""

    def __init__(self, blocks: list[Any]):
        super().__init__()
        self.blocks = nn.ModuleList([b.modules for b in blocks])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, side: dict) -> torch.Tensor:
        for m in self.blocks:
            x, mask = m["f"](x, mask, side)
        return self.blocks[-1]["cls"](head_features(x, mask))


def _worker_loop(config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker."""
    import ray.train
    import ray.train.torch

    from growpipe.data import load_data
    from growpipe.data.bundle import batch_order
    from growpipe.evaluation import evaluate_states
    from growpipe.nn.methods import build_block
    from growpipe.nn.net import plan_blocks
    from growpipe.nn.specs import InputInfo

    cfg = build_config(config["cfg"], "ddp worker config")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(cfg.runtime.cpus_per_stage)))
    bundle = load_data(cfg.data)
    info = InputInfo.from_bundle(bundle)
    specs = plan_blocks(cfg, info)
    blocks = [build_block(cfg, s, info) for s in specs]  # seeded: the same initial weights on every worker
    model = ray.train.torch.prepare_model(Chain(blocks))
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    split, bs = bundle.train, cfg.data.batch_size
    history: list[dict[str, Any]] = []
    for epoch in range(1, cfg.train.epochs + 1):
        model.train()
        t0, loss_sum, batches = time.perf_counter(), 0.0, 0
        for _, idx in batch_order(len(split), bs, shuffle=True, seed=cfg.seed, epoch=epoch):
            mine = idx[rank::world]  # this worker's shard of the global mini-batch
            logits = model(split.x[mine].to(device), None, {})
            loss = F.cross_entropy(logits, split.y[mine].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients of all workers here
            opt.step()
            loss_sum += float(loss.detach())
            batches += 1
        seconds = time.perf_counter() - t0
        row: dict[str, Any] = {"epoch": epoch, "loss": loss_sum / max(batches, 1), "seconds": seconds}
        if rank == 0:
            states = [
                {"modules": b.modules.state_dict(), "optimizers": {}, "frozen": False, "steps": 0} for b in blocks
            ]
            ev = evaluate_states(cfg, bundle, info, [s.to_dict() for s in specs], states)
            row["ev"] = ev
        history.append(row)
        brief = {"epoch": epoch, "loss": row["loss"], "test_accuracy": row["ev"]["full_accuracy"] if rank == 0 else -1}
        if rank == 0 and epoch == cfg.train.epochs:  # the weights and the history go in the checkpoint
            with tempfile.TemporaryDirectory() as tmp:
                torch.save(states, Path(tmp) / "blocks.pt")
                (Path(tmp) / "history.json").write_text(json.dumps(history))
                ray.train.report(brief, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report(brief)


def train_ddp(
    cfg: RunConfig, address: str | None = None, progress: Callable[[str], None] | None = print, keep_net: bool = False
) -> tuple[dict[str, Any], Any]:
    """Train method bp data-parallel with Ray Train; return the result JSON (and the trained net)."""
    import ray
    from ray.train import RunConfig as TrainRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from growpipe.data import load_data
    from growpipe.nn.net import GrowableNet, plan_blocks
    from growpipe.nn.specs import InputInfo
    from growpipe.report import epoch_row, format_epoch, summarize
    from growpipe.runtime.gpipe import check_gpipe
    from growpipe.runtime.pipeline import connect
    from growpipe.tracking import resolve_tracking

    check_gpipe(cfg)
    cfg = resolve_tracking(cfg)
    owns, dashboard = connect(cfg, address)
    try:
        workers = cfg.runtime.ddp_workers or cfg.net.blocks
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and cfg.runtime.gpus_per_stage != 0
        if progress:
            if dashboard:
                progress(f"ray    dashboard {dashboard}")
            progress(f"net    bp (data-parallel, Ray Train) on {cfg.net.backbone}: {workers} DDP workers, "
                     f"global batch {cfg.data.batch_size}")  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="growpipe-ddp-") as storage:
            trainer = TorchTrainer(
                _worker_loop,
                train_loop_config={"cfg": cfg.model_dump(mode="json")},
                scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus,
                                             resources_per_worker={"CPU": cfg.runtime.cpus_per_stage}),
                run_config=TrainRunConfig(storage_path=storage, name=cfg.name),
            )  # fmt: skip
            result = trainer.fit()
            with result.checkpoint.as_directory() as d:
                states = torch.load(Path(d) / "blocks.pt", map_location="cpu", weights_only=True)
                history = json.loads((Path(d) / "history.json").read_text())
        bundle = load_data(cfg.data)
        info = InputInfo.from_bundle(bundle)
        k = cfg.net.blocks
        n = len(bundle.train)
        rows = []
        for h in history:
            rows.append(epoch_row(h["epoch"], cfg, k, k, {f"b{k - 1}.ce": h["loss"]}, h["ev"], n, h["seconds"]))
            if progress:
                progress(format_epoch(rows[-1]))
        ev = history[-1]["ev"]
        summary = summarize(cfg, k, rows, [], ev, sum(h["seconds"] for h in history), n * len(rows))
        summary.update(runtime="ray-train-ddp", schedule="data-parallel (Ray Train DDP)", workers=workers)
        topology = [s.to_dict() for s in plan_blocks(cfg, info)]
        net = GrowableNet.from_states(cfg, info, topology, states)
        _record(cfg, rows, summary, net, progress)
        return summary, (net if keep_net else None)
    finally:
        if owns:
            ray.shutdown()


def _record(cfg: RunConfig, rows: list[dict[str, Any]], summary: dict[str, Any], net: Any, progress: Any) -> None:
    """The run's MLflow record (tracking.mlflow), written once training is over."""
    from growpipe.callbacks import notify, run_callbacks

    say = progress or (lambda _line: None)
    callbacks = run_callbacks(cfg, cfg.name, say)
    notify(callbacks, "on_start", say=say)
    for row in rows:
        notify(callbacks, "after_epoch", row, say=say)
    notify(callbacks, "on_finish", summary, say=say)
    notify(callbacks, "on_final_net", net, summary, say=say)
    notify(callbacks, "close", say=say)
