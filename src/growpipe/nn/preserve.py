"""A grown block that starts where the net stands (grow.init: preserve): its encoder gated to the identity
(backbones.GatedEncoder) and its exit a copy of the exit of the block below, so that at the moment of growth
the net predicts what it predicted before. The spec-level decision (`preserve_problem`, `gated`) is taken when
the block is planned; the engines call `start_from_exit` when they attach it, once the block below has its
final weights."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from growpipe.config import NetSpec
from growpipe.errors import ShapeError
from growpipe.nn.backbones import output_shape
from growpipe.nn.block import Block
from growpipe.nn.specs import BlockSpec, EncoderSpec, InputInfo

ExitState = dict[str, dict[str, torch.Tensor]]
"""The tensors of a block's exit head by module name ("cls", or AL's bridge "b")."""


def pooling(enc: EncoderSpec) -> tuple[Any, ...]:
    """How a block's heads read its output: ("heads",) the pooling every family shares (backbones.head_features),
    ("last", hidden) an LSTM read at its final states."""
    if enc.family == "seqfeature":
        return pooling(EncoderSpec(enc.params["inner"], enc.in_shape, "float", enc.params["body"]))
    if enc.family == "lstm" and enc.params.get("pooling") == "last":
        return ("last", enc.params["hidden"])
    return ("heads",)


def _fix(cause: str, field: str | None, request: bool) -> str:
    """`cause` and its fix: a planned step's is `field` (a config field and its value) or grow.init: fresh; a
    request can change neither on a running job: it is told a run started with `field` can."""
    if request:
        return f"{cause}, whatever the request" + (f"; a run started with {field} can" if field else "")
    return f"{cause}; set {field}, or set grow.init: fresh" if field else f"{cause}; set grow.init: fresh"


def _width_back(enc: EncoderSpec) -> tuple[int, str] | None:
    """The width that gives a block of `enc`'s family its input's shape back, and why that one."""
    shape = enc.in_shape
    if enc.family in ("mlp", "feature") and len(shape) == 1:
        return shape[0], "the features below"
    if enc.family == "conv" and not enc.params.get("pool"):
        return shape[0], "the channels below"
    if enc.family == "lstm" and shape[-1] % 2 == 0:
        return shape[-1] // 2, "a BiLSTM gives 2 x width features"
    return None


def blocks_to_1x1(image: tuple[int, ...]) -> int:
    """How many blocks of the cnn backbone bring `image` (C, H, W) to 1x1 maps: each pools (halves) its maps
    while they are 2x2 or more."""
    side, blocks = min(image[1:]), 0
    while side >= 2:
        side, blocks = side // 2, blocks + 1
    return blocks


def _shape_fix(enc: EncoderSpec, info: InputInfo, net: NetSpec, request: bool) -> str:
    """What would give a block of `enc`'s family its input's shape back: the width a request sends, or the
    field of the step or of the net a planned step sets."""
    if back := _width_back(enc):
        width, why = back
        if request:
            return f"send --width {width} ({why})"
        return f"give the step width {width}{f' ({why})' if enc.family == 'lstm' else ''}, or set grow.init: fresh"
    if enc.family == "conv":  # it pools
        _, h, w = enc.in_shape
        maps = f"a conv block pools {h}x{w} feature maps (it does while they are 2x2 or more)"
        if net.backbone != "cnn":
            return _fix(f"{maps}, and net.blocks does not change the maps {net.backbone} ends in", None, request)
        widths = ", net.widths one per block" if net.widths else ""
        return _fix(maps, f"net.blocks >= {blocks_to_1x1(info.shape)} (its blocks bring them to 1x1{widths})", request)
    if enc.family == "seqfeature":
        return _fix("net.feature_join: sequence makes the sequence longer", "net.feature_join: pooled", request)
    return _fix(f"a {enc.family} block on {math.prod(enc.in_shape)} features changes their shape", None, request)


def preserve_problem(last: BlockSpec, enc: EncoderSpec, info: InputInfo, net: NetSpec, request: bool = False
                     ) -> str | None:  # fmt: skip
    """Why a block with encoder `enc` on top of `last` (of a net on `net`) cannot start as the identity with
    `last`'s exit, and the fix, for a planned step or a grow request (`request`); None: it can (its output has
    its input's shape, its heads read it as `last`'s do, `last` has an exit and, for AL, the new decoder can be
    the identity)."""
    what = f"block {last.index + 1} ({enc.family})"
    out, _ = output_shape(enc, info)
    if tuple(out) != tuple(enc.in_shape):
        return (f"{what} turns block {last.index}'s output {tuple(enc.in_shape)} into {tuple(out)}, so it cannot "
                f"start as the identity; {_shape_fix(enc, info, net, request)}")  # fmt: skip
    if pooling(enc) != pooling(last.encoder):
        return _fix(f"{what} reads its output otherwise than block {last.index} does (net.lstm_pooling), so block "
                    f"{last.index}'s exit does not fit it", "net.lstm_pooling: mean", request)  # fmt: skip
    if not last.has_exit:
        return _fix(f"block {last.index} has no exit to start {what}'s from", None, request)
    if last.method == "al" and last.arch.get("decoder_activation"):
        return _fix("al.decoder_activation ends a new block's decoder in an activation, which cannot start as the "
                    "identity", "al.decoder_activation: false", request)  # fmt: skip
    return None


def gated(enc: EncoderSpec) -> EncoderSpec:
    """`enc` gated: its block starts as the identity (backbones.GatedEncoder)."""
    return replace(enc, params={**enc.params, "gate": True})


def starts_preserved(spec: BlockSpec) -> bool:
    """Whether a block was planned to start where the net stands (its exit is taken from the block below)."""
    return bool(spec.encoder.params.get("gate"))


def _exit_name(block: Block) -> str:
    name = "b" if block.exit_decodes else "cls"
    if name not in block.modules:
        raise ShapeError(f"{block.name} has no exit head for a new block to start from; set grow.init: fresh")
    return name


def exit_state(block: Block) -> ExitState:
    """CPU copies of the tensors of `block`'s exit head (AL: its bridge b; the other rules: its classifier)."""
    name = _exit_name(block)
    return {name: {k: v.detach().cpu().clone() for k, v in block.modules[name].state_dict().items()}}


@torch.no_grad()
def start_from_exit(block: Block, below: ExitState) -> None:
    """Start a new (gated) block's exit as the block below's (`below`: its exit_state): the classifier, or AL's
    bridge, loaded in place (the block's optimizers keep their parameters), and AL's decoder h the identity, so
    that h(b(s)) is the code the block below decoded: every exit above decodes to the same logits."""
    name = _exit_name(block)
    if set(below) != {name}:
        raise ShapeError(f"{block.name} takes an exit head {name!r}, given {sorted(below)}")
    block.modules[name].load_state_dict(below[name])
    if block.exit_decodes:
        h = block.modules["h"]
        if not isinstance(h, nn.Linear) or h.in_features != h.out_features:
            raise ShapeError(f"{block.name}'s decoder cannot start as the identity; set al.decoder_activation: false")
        h.weight.copy_(torch.eye(h.in_features))
        h.bias.zero_()
