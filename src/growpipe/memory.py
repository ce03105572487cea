"""Whether a run fits in memory, said before anything starts: its net built on PyTorch's meta device (no
memory taken) from what the config tells, its weights, gradients, optimizer state and a batch's activations
against this machine's memory (or, on a cluster, one block against a node's); the field to lower named."""

from __future__ import annotations

import copy
import functools
import math

import psutil
import torch

from growpipe.config import RunConfig, config_and_problems
from growpipe.data.presence import planned_input
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo

MEMORY_FIELDS = ("net.width", "net.widths", "net.embed_dim", "net.ff_width", "net.layers_per_block",
                 "net.layers", "net.blocks", "net.heads", "al.code_dim", "al.bridge_hidden", "scpl.proj_dim",
                 "scpl.classifier_hidden", "data.batch_size", "data.vocab_size", "grow.step.width", "grow.schedule",
                 "grow.max_blocks")  # fmt: skip
"""The fields that size a run's net and batch: of a run too big for the machine, the one whose default brings
it down the most is named."""


def run_memory(cfg: RunConfig) -> tuple[float, float, float]:
    """(bytes of every block's weights, gradients and optimizer state, bytes of the largest block's, bytes of
    a batch's activations) of the run once grown as far as it plans, at least: built on PyTorch's meta device
    (no memory taken) on the input the config tells without reading the data (growpipe.data.presence.
    planned_input). inf when a tensor of the net could not even be addressed."""
    shape, dtype, classes, vocab, rows = planned_input(cfg.data, cfg.net.backbone)
    info = InputInfo(shape, dtype, classes, vocab)
    try:
        with torch.device("meta"):
            net = GrowableNet.build(cfg.rule(), cfg.net, info, device="meta")
            steps = [s for s in cfg.grow.schedule if s.kind == "layer"]
            if cfg.grow.policy() in ("every_epochs", "on_plateau") and cfg.grow.step.kind == "layer":
                steps = [cfg.grow.step] * (cfg.max_blocks() - cfg.net.blocks)
            for step in steps:
                net.grow(cfg.net, step)
    except RuntimeError as e:
        if "overflow" in str(e):  # "Storage size calculation overflowed": no allocator could give it
            return math.inf, math.inf, 0.0
        raise
    state = {"adam": 8, "adamw": 8, "sgd": 4 if cfg.train.momentum else 0}[cfg.train.optimizer]
    per_param = 4 + 4 + state  # fp32 weights, gradients, optimizer state
    blocks = [per_param * sum(p.numel() for p in b.parameters()) for b in net.blocks]
    batch = min(cfg.data.batch_size, rows)
    width = sum(math.prod(b.spec.encoder.in_shape) * cfg.net.block_layers(b.spec.index) for b in net.blocks)
    return float(sum(blocks)), float(max(blocks)), 4.0 * 3 * batch * (math.prod(shape) + width)  # value, grad, head


def rough_memory(cfg: RunConfig) -> float:
    """A bound on what run_memory says (weights, gradients and optimizer state of every block, and a batch), from
    the config's sizes alone: every layer (a block's layers and its heads) at most 16 x D^2 numbers, D the largest
    size the config names (a width, a head's size, the input's numbers, resnet18's 512 channels)."""
    net, shape = cfg.net, planned_input(cfg.data, cfg.net.backbone)[0]
    ff = (net.ff_width or 4 * net.width) if net.backbone == "transformer" else 0
    sizes = [net.width, *(net.widths or []), net.embed_dim, ff, cfg.al.code_dim,
             cfg.al.bridge_hidden, cfg.scpl.proj_dim, cfg.scpl.classifier_hidden or 0, cfg.grow.step.width or 0,
             *(s.width or 0 for s in cfg.grow.schedule), math.prod(shape), cfg.data.num_classes or 0,
             512 if net.backbone == "resnet18" else 256]  # fmt: skip
    most, blocks = max(sizes), cfg.max_blocks()
    layers = max([net.layers_per_block, *(net.layers or [])]) + 4
    vocab = min(cfg.data.vocab_size, 20000) if net.backbone in ("embedding", "lstm", "transformer") else 0
    numbers = blocks * layers * 16 * most**2 + (vocab + shape[0]) * net.embed_dim
    return 16.0 * numbers + 12.0 * cfg.data.batch_size * blocks * layers * most * math.prod(shape)


def memory_problem(cfg: RunConfig, here: bool, replicas: int = 1) -> tuple[str | None, str | None]:
    """(why the run cannot fit in this machine's memory, a warning that one block does not fit in it): the
    whole run when its workers run here (`here`: an embedded Ray, or the reference trainer; `replicas`: DDP
    workers, each holding the whole net), one block on a cluster, whose nodes may be larger. The line names
    the field that sizes it (MEMORY_FIELDS)."""
    have = psutil.virtual_memory().total
    if replicas * rough_memory(cfg) < have / 2:  # the usual run: no need to build it (PyTorch's first meta pass: 1 s)
        return None, None
    try:
        total, largest, batch = run_memory(cfg)
    except Exception:  # noqa: BLE001 - a net that cannot be built is the data checks' or the stages' to say
        return None, None
    need = _need((total, largest, batch), here, replicas)
    if need <= have:
        return None, None
    field = _sizing_field(cfg, here, replicas)
    if math.isinf(need):
        return f"{field}: a tensor of the net would hold more numbers than PyTorch can address; lower {field}", None
    whose = "its" if here else "its largest block's"
    what = (f"the run needs at least {_bytes(need)} of memory ({_bytes(need - batch)} for "
            f"{whose} weights, gradients and {cfg.train.optimizer} state, "
            f"{_bytes(batch)} for a batch's activations), more than this machine's {_bytes(have)}")  # fmt: skip
    if here:
        return f"{field}: {what}; lower {field}, or join a cluster of bigger nodes with --address", None
    return None, f"warn   {field}: {what}; each node that runs a block needs that much"


def _sizing_field(cfg: RunConfig, here: bool, replicas: int) -> str:
    """The field of MEMORY_FIELDS whose default brings the run's memory down the most."""
    best, best_need = "net", math.inf
    data = cfg.model_dump(mode="json")
    for dotted in MEMORY_FIELDS:
        raw = copy.deepcopy(data)
        *sections, key = dotted.split(".")
        holder = functools.reduce(lambda node, part: node[part], sections, raw)
        if holder.pop(key, None) is None:  # not set: its default is what the run has
            continue
        smaller, problems = config_and_problems(raw)
        if smaller is None or problems:
            continue
        try:
            need = _need(run_memory(smaller), here, replicas)
        except Exception:  # noqa: BLE001 - this default does not make a net either
            continue
        if need < best_need:
            best, best_need = dotted, need
    return best


def _need(memory: tuple[float, float, float], here: bool, replicas: int) -> float:
    """The bytes a run of `memory` (see run_memory) needs on this machine (`here`) or on a node (one block)."""
    total, largest, batch = memory
    return (replicas * total if here else largest) + batch


def _bytes(n: float) -> str:
    """A size in bytes as KiB ... PiB."""
    if math.isinf(n):
        return "unbounded"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} PiB"
