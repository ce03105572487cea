"""The peer: PyTorch's own GPipe (torch.distributed.pipelining) on growpipe's BP blocks.

K processes, one per stage, on gloo (on NCCL with a GPU each when cfg.device resolves to CUDA); stage r
holds a contiguous run of the same blocks (same seeded initial weights) that growpipe's BP runtimes
train, the last stage adds the classifier. Text masks travel between
stages as a float tensor next to the features. Only full mini-batches train (the schedule fixes its
micro-batch shapes on the first step): keep data.limit_train a multiple of data.batch_size for the same
batches as growpipe's runtimes. After every epoch each stage saves its weights; the driver
rebuilds the net and evaluates it, so the peer gets the same accuracy-vs-wall-time history as the others.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from growpipe.config import RunConfig, build_config
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.nn.backbones import head_features
from growpipe.nn.block import make_optimizer


class StageModule(nn.Module):
    """A contiguous run of blocks' encoders; the last stage adds the classifier.

    Takes (features[, mask as float]) and returns the same, or the logits on the last stage."""

    def __init__(self, modules: list[nn.ModuleDict], last: bool):
        super().__init__()
        self.blocks = nn.ModuleList(modules)
        self.last = last

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        m = None if mask is None else mask > 0.5
        for b in self.blocks:
            x, m = b["f"](x, m, {})
        if self.last:
            return self.blocks[-1]["cls"](head_features(x, m))
        return x if m is None else (x, m.float())


def stage_ranges(blocks: int, stages: int) -> list[range]:
    """Contiguous, near-equal runs of block indices, one per stage."""
    if stages > blocks:
        raise ValueError(f"stages: {stages} stages for {blocks} blocks; use at most {blocks}")
    cuts = [round(i * blocks / stages) for i in range(stages + 1)]
    return [range(cuts[i], cuts[i + 1]) for i in range(stages)]


def stage_device(cfg: RunConfig, rank: int) -> torch.device:
    """The device of stage `rank`: its own GPU when cfg.device resolves to CUDA (one per stage, as the stage
    actors get), else the CPU."""
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        return torch.device("cuda", rank)
    return device


def _build_blocks(cfg: RunConfig) -> tuple[Any, Any, list[Any], list[Any]]:
    from growpipe.data import load_data
    from growpipe.nn.methods import build_block
    from growpipe.nn.net import plan_blocks
    from growpipe.nn.specs import InputInfo

    bundle = load_data(cfg.data)
    info = InputInfo.from_bundle(bundle)
    specs = plan_blocks(cfg.net, cfg.rule(), info)
    return bundle, info, specs, [build_block(cfg.rule(), s, info) for s in specs]


def _worker(rank: int, cfg_json: dict, stages: int, micro: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from growpipe.data.batches import iterate_batches

    cfg = build_config(cfg_json, "torch GPipe peer config")
    device = stage_device(cfg, rank)
    if device.type == "cpu":
        set_cpu_threads(max(1, int(cfg.runtime.cpus_per_stage)))  # as a stage actor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=stages)
    try:
        bundle, _, _, blocks = _build_blocks(cfg)
        mine = stage_ranges(len(blocks), stages)[rank]
        module = StageModule([blocks[i].modules for i in mine], last=rank == stages - 1).to(device)
        stage = PipelineStage(module, rank, stages, device)
        schedule = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=F.cross_entropy)
        opt = make_optimizer(module.parameters(), cfg.train)
        bs, seconds, samples = cfg.data.batch_size, [], []
        for epoch in range(1, cfg.train.epochs + 1):
            module.train()
            dist.barrier()
            t0, n = time.perf_counter(), 0
            for p in iterate_batches(bundle.train, bs, shuffle=True, seed=cfg.seed, epoch=epoch):
                if p.batch_size != bs:
                    continue
                opt.zero_grad(set_to_none=True)
                inputs = (p.x.to(device),) if rank == 0 else ()
                schedule.step(*inputs, target=p.y.to(device) if rank == stages - 1 else None)
                opt.step()
                n += bs
            dist.barrier()
            seconds.append(time.perf_counter() - t0)
            samples.append(n)
            weights = {k: v.cpu() for k, v in module.state_dict().items()}
            torch.save(weights, Path(out_dir) / f"epoch{epoch}-stage{rank}.pt")
        if rank == 0:
            (Path(out_dir) / "times.json").write_text(json.dumps({"seconds": seconds, "samples": samples}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_torch_gpipe(cfg: RunConfig, stages: int, micro_batches: int = 4) -> dict[str, Any]:
    """Train cfg's BP net with torch's ScheduleGPipe on `stages` processes; returns a result with the same
    keys the comparison reads from growpipe's summaries (history, test_accuracy, samples_per_second)."""
    import torch.multiprocessing as mp

    from growpipe.evaluation import evaluate_net
    from growpipe.nn.net import GrowableNet
    from growpipe.report import epoch_row, summarize

    if cfg.method != "bp":
        raise ValueError(f"method: the torch GPipe peer trains end-to-end BP; got {cfg.method!r}")
    if cfg.data.batch_size < micro_batches:
        raise ValueError(f"data.batch_size: {cfg.data.batch_size} is fewer samples than {micro_batches} micro-batches")
    if resolve_device(cfg.device).type == "cuda" and stages > torch.cuda.device_count():
        raise ValueError(f"stages: {stages} stages need a GPU each (NCCL), this machine has "
                         f"{torch.cuda.device_count()}; use fewer stages or device: cpu")  # fmt: skip
    ranges = stage_ranges(cfg.net.blocks, stages)
    with tempfile.TemporaryDirectory(prefix="growpipe-torch-gpipe-") as tmp:
        args = (cfg.model_dump(mode="json"), stages, micro_batches, _free_port(), tmp)
        mp.spawn(_worker, args=args, nprocs=stages, join=True)
        times = json.loads((Path(tmp) / "times.json").read_text())
        bundle, info, specs, _ = _build_blocks(cfg)
        topology = [s.to_dict() for s in specs]
        history, ev = [], None
        for epoch, (sec, n) in enumerate(zip(times["seconds"], times["samples"], strict=True), start=1):
            states: list[dict[str, Any]] = []
            for rank, mine in enumerate(ranges):
                sd = torch.load(Path(tmp) / f"epoch{epoch}-stage{rank}.pt", map_location="cpu", weights_only=True)
                for j in range(len(mine)):
                    prefix = f"blocks.{j}."
                    mods = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
                    states.append({"modules": mods, "optimizers": {}, "frozen": False, "steps": 0})
            ev = evaluate_net(GrowableNet.from_states(cfg.rule(), info, topology, states), bundle, cfg.eval)
            k = cfg.net.blocks
            history.append(epoch_row(epoch, cfg, k, k, {}, ev, n, sec))
    assert ev is not None
    summary = summarize(cfg, cfg.net.blocks, history, [], ev, sum(times["seconds"]), sum(times["samples"]))
    summary.update(runtime="torch.distributed.pipelining", schedule=f"ScheduleGPipe, {micro_batches} micro-batches")
    return summary
