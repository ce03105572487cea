"""The DDP engine's net (growpipe.runtime.ddp): its blocks built from a topology and the checkpoint it stands on,
the same blocks as one module for DDP, and the one-off tasks that read the data's description or evaluate it."""

from __future__ import annotations

from typing import Any

import ray
import torch
from torch import nn

from growpipe.checkpoint import load_states
from growpipe.config import RunConfig, build_config
from growpipe.data import load_data
from growpipe.evaluation import evaluate_net, measure_early_exit
from growpipe.nn.backbones import encoder_of
from growpipe.nn.block import Block
from growpipe.nn.methods import build_block
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import BlockSpec, InputInfo


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


def assemble(cfg: RunConfig, info: InputInfo, topology: list[dict[str, Any]], frozen: int,
             start: dict[str, Any] | None, device: torch.device | str = "cpu",
             thaw: float | None = None) -> list[Block]:  # fmt: skip
    """The blocks of `topology` (seeded: equal wherever built), with the states checkpoint `start` ({fs, path,
    shards}) holds loaded (a block it does not hold stays fresh: a growth), the first `frozen` frozen (`thaw`:
    then every one thawed at that learning-rate factor, grow.joint), on `device`."""
    blocks = [build_block(cfg.rule(), BlockSpec.from_dict(d), info) for d in topology]
    if start:
        held = [b for b in blocks if any(b.index in e["blocks"] for e in start["shards"])]
        for b, state in zip(held, load_states(start["fs"], start["path"], start["shards"], [b.index for b in held]),
                            strict=True):  # fmt: skip
            b.load_state_dict(state)
    for b in blocks[:frozen]:
        if not b.frozen:
            b.freeze()
    for b in blocks:
        if thaw is not None:
            b.thaw(thaw)
    return [b.to(device) for b in blocks]


def as_net(cfg: RunConfig, info: InputInfo, blocks: list[Block], device: torch.device | str = "cpu") -> GrowableNet:
    """The blocks as one net on `device` (the blocks' own: GrowableNet.append moves a block in place)."""
    net = GrowableNet(cfg.rule(), info, device)
    for b in blocks:
        net.append(b)
    return net


@ray.remote(num_cpus=0)
def describe_data(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The input description the blocks are planned from, and the data's record (DataBundle.describe)."""
    cfg = build_config(config, "ddp config")
    bundle = load_data(cfg.data, cfg.seed)
    return InputInfo.from_bundle(bundle, cfg.net).to_dict(), bundle.describe()


@ray.remote
def measure_net(config: dict[str, Any], topology: list[dict[str, Any]], frozen: int, start: dict[str, Any] | None,
                threshold: float | None = None, early_exit: bool = False) -> dict[str, Any]:  # fmt: skip
    """Evaluate the net checkpoint `start` holds (or its real early exit at `threshold`) on the test split."""
    cfg = build_config(config, "ddp config")
    bundle = load_data(cfg.data, cfg.seed)
    info = InputInfo.from_bundle(bundle, cfg.net)
    net = as_net(cfg, info, assemble(cfg, info, topology, frozen, start))
    if early_exit:
        return measure_early_exit(net, bundle, cfg.eval, threshold)
    return evaluate_net(net, bundle, cfg.eval)
