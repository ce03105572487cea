"""Balanced partitioning: profile every layer's training-step time and memory on the target device, then
cut the layers into K contiguous stages so that the slowest stage is as fast as possible (the pipeline's
throughput is set by it) and every stage fits the device memory. The result is `net.blocks: K` with
`net.layers: [...]`, usable by the local-learning pipeline and by GPipe alike.

Only the MLP backbone is partitioned layer by layer here: its layers all have the same shape, so a block
may hold any number of them. (CNN blocks change resolution and channels, text backbones start with an
embedding block; they are refused with a message.)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from growpipe.config import RunConfig
from growpipe.data import iterate_batches, load_data
from growpipe.data.batches import micro_slices
from growpipe.device import resolve_device, set_cpu_threads
from growpipe.errors import ConfigError
from growpipe.nn.methods import build_block
from growpipe.nn.net import plan_blocks
from growpipe.nn.packet import Packet
from growpipe.nn.specs import InputInfo

ADAM_COPIES = 4
"""Bytes per parameter, in units of the parameter: weights, gradient and Adam's two moments."""


@dataclass
class LayerProfile:
    ms: float
    """Median training-step time of the layer on one mini-batch as part of a stage (`profile_layers`)."""
    memory_mb: float
    """Parameters, gradients and optimizer state, plus the mini-batch's activations it keeps."""


def balanced_cuts(
    costs: list[float], k: int, memory: list[float] | None = None, budget: float | None = None
) -> list[int]:
    """Layers per stage for K contiguous stages that minimise the largest stage cost, each stage's memory
    within `budget` (exact dynamic programme, O(K L^2)). ConfigError when no such cut exists."""
    n = len(costs)
    if k > n:
        raise ConfigError(f"stages: {k} is more than the {n} layers to cut; use at most {n} stages")
    if k < 1:
        raise ConfigError("stages: give at least 1")
    mem = memory or [0.0] * n
    prefix, mprefix = [0.0], [0.0]
    for c, m in zip(costs, mem, strict=True):
        prefix.append(prefix[-1] + c)
        mprefix.append(mprefix[-1] + m)

    def seg(i: int, j: int) -> float:  # layers i..j-1 as one stage
        if budget is not None and mprefix[j] - mprefix[i] > budget:
            return math.inf
        return prefix[j] - prefix[i]

    best = [[math.inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                v = max(best[s - 1][i], seg(i, j))
                if v < best[s][j]:
                    best[s][j], cut[s][j] = v, i
    if math.isinf(best[k][n]):
        largest = max(mem)
        raise ConfigError(
            f"memory: no cut into {k} stages fits {budget:g} MB per stage (the largest layer alone needs "
            f"{largest:.1f} MB, all layers {mprefix[-1]:.1f} MB); use more stages or a device with more memory"
        )
    sizes, j = [], n
    for s in range(k, 0, -1):
        i = cut[s][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def layer_config(cfg: RunConfig) -> RunConfig:
    """The same network with one layer per block (the units the partition is made of)."""
    if cfg.net.backbone != "mlp":
        raise ConfigError(
            f"net.backbone: {cfg.net.backbone} is not partitioned layer by layer yet (its blocks change shape or "
            "start with an embedding); use backbone mlp, or set net.layers by hand"
        )
    if cfg.net.widths is not None and len(set(cfg.net.widths)) > 1:
        raise ConfigError("net.widths: partitioning needs one width for every layer; use net.width")
    total = sum(cfg.net.block_layers(i) for i in range(cfg.net.blocks))
    net = cfg.net.model_copy(update={"blocks": total, "layers_per_block": 1, "layers": None, "widths": None,
                                     "width": cfg.net.block_width(0)})  # fmt: skip
    return cfg.model_copy(update={"net": net})


def profile_layers(cfg: RunConfig, steps: int = 7) -> tuple[list[LayerProfile], float, Any]:
    """Time every layer's training step on the config's device (one mini-batch, median of `steps` after one
    warm-up) and return (per-layer profiles, a per-stage constant in ms, the data description).

    A layer is timed as a one-layer block: t_i, with what its block adds (a local rule's head and loss;
    for BP the classifier and loss on the last layer only), no gradient for its input. Inside a stage a
    layer also computes its input's gradient and shares one head, so a two-layer block is timed too:
    d = t(1+2) - t1 - t2 is what a layer costs more inside a stage than alone. A layer then costs t_i + d
    and a stage sum(t_i + d) - d (local rules: its first layer sends no gradient upstream) or, for BP,
    sum(t_i + d) with layer 0 at t_0 (every stage but the first sends one).
    """
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        set_cpu_threads(max(1, int(cfg.runtime.cpus_per_stage)))
    units = layer_config(cfg)
    bundle = load_data(units.data)
    info = InputInfo.from_bundle(bundle)
    p = next(iterate_batches(bundle.train, units.data.batch_size, shuffle=True, seed=units.seed)).to(device)

    def timed(block: Any, packet: Any) -> tuple[float, Any]:
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            outs = _step(block, packet, units)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        return sorted(times[1:])[steps // 2], _joined(packet, outs)

    out, inputs = [], []
    for spec in plan_blocks(units.net, units.rule(), info):
        block = build_block(units.rule(), spec, info).to(device)
        inputs.append(p)
        ms, nxt = timed(block, p)
        params = sum(t.numel() * t.element_size() for t in block.modules.parameters())
        activations = nxt.x.numel() * nxt.x.element_size()
        out.append(LayerProfile(ms, (params * ADAM_COPIES + activations) / 2**20))
        p = nxt
    d = 0.0
    if len(out) >= 3:  # layers 1 and 2 (same width) as one two-layer block, last in the net only if layer 2 is
        rest = [len(out) - 3] if len(out) > 3 else []
        net = units.net.model_copy(update={"blocks": 2 + len(rest), "layers": [1, 2, *rest]})
        pair = units.model_copy(update={"net": net})
        pair_ms, _ = timed(build_block(pair.rule(), plan_blocks(pair.net, pair.rule(), info)[1], info).to(device),
                           inputs[1])  # fmt: skip
        d = max(pair_ms - out[1].ms - out[2].ms, -0.9 * min(o.ms for o in out))  # noise never makes a cost <= 0
    bp = cfg.method == "bp"
    for i, o in enumerate(out):
        if not (bp and i == 0):
            o.ms += d
    return out, (0.0 if bp else -d), bundle.summary()


def _step(block: Any, p: Packet, cfg: RunConfig) -> list[Packet]:
    """One training step of `block` as its pipeline runs it: the local rule's step, or for BP a forward and
    backward per micro-batch (GPipe's bp_pipeline.micro_batches; 1F1B: the whole batch) and one update.
    Returns the output of every micro-batch, in order."""
    if cfg.method != "bp":
        out, _ = block.train_step(p)
        return [out]
    micro = cfg.bp_pipeline.micro_batches if cfg.engine() == "gpipe" else 1
    outs = []
    for part in micro_slices(p.batch_size, micro):  # contiguous, in order: the outputs concatenate back
        out = block.forward_with_grad(_rows(p, torch.as_tensor(part, device=p.x.device)))
        if "cls" in block.modules:  # the last block: its classifier and loss, as the last stage runs them
            loss = F.cross_entropy(block.modules["cls"](block.features(out.x, out.mask)), out.y)
        else:  # a stand-in loss: the backward from the output is what a stage runs
            loss = out.x.float().square().mean()
        loss.backward()
        outs.append(out.detached())
    block.optimizers["all"].step()
    block.optimizers["all"].zero_grad(set_to_none=True)
    return outs


def _joined(p: Packet, outs: list[Packet]) -> Packet:
    """The micro-batches' outputs as one packet of p's samples (they are contiguous and in order)."""
    if len(outs) == 1:
        return outs[0]
    masks = [o.mask for o in outs if o.mask is not None]  # every micro-batch has one, or none has
    return replace(p, x=torch.cat([o.x for o in outs]), mask=torch.cat(masks) if masks else None)


def _rows(p: Packet, idx: torch.Tensor) -> Packet:
    """The packet's samples at `idx`."""
    pick = lambda v: None if v is None else v.index_select(0, idx)
    return replace(p, x=p.x.index_select(0, idx), y=pick(p.y), t=pick(p.t), mask=pick(p.mask),
                   side={k: v.index_select(0, idx) for k, v in p.side.items()})  # fmt: skip


def plan_partition(cfg: RunConfig, stages: int, memory_mb: float | None = None) -> dict[str, Any]:
    """Profile, cut into `stages`, and report: layers per stage, predicted ms per stage, the config."""
    profiles, per_stage, data = profile_layers(cfg)
    # the same constant in every stage: it moves no cut, only the predicted times
    sizes = balanced_cuts([p.ms for p in profiles], stages, [p.memory_mb for p in profiles], memory_mb)
    predicted, mem, i = [], [], 0
    for size in sizes:
        predicted.append(per_stage + sum(p.ms for p in profiles[i : i + size]))
        mem.append(sum(p.memory_mb for p in profiles[i : i + size]))
        i += size
    net = cfg.net.model_copy(update={"blocks": stages, "layers": sizes, "layers_per_block": 1, "widths": None,
                                     "width": cfg.net.block_width(0)})  # fmt: skip
    return {
        "data": data,
        "layer_ms": [round(p.ms, 3) for p in profiles],
        "stage_constant_ms": round(per_stage, 3),
        "layer_memory_mb": [round(p.memory_mb, 3) for p in profiles],
        "layers": sizes,
        "predicted_stage_ms": [round(v, 3) for v in predicted],
        "stage_memory_mb": [round(v, 3) for v in mem],
        "config": cfg.model_copy(update={"net": net}),
    }
