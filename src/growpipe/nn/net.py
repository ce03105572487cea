"""GrowableNet: an ordered list of Blocks that can be appended to, frozen, and read out at any depth."""

from __future__ import annotations

from typing import Any

import torch

from growpipe.config import GrowStep, NetSpec, RuleSettings
from growpipe.errors import ConfigError, ShapeError
from growpipe.nn.backbones import FEATURE_FAMILIES, growth_encoder, output_shape, plan_encoders
from growpipe.nn.block import Block
from growpipe.nn.guard import SKIPPED
from growpipe.nn.inference import Decode, EarlyExit, Exited, early_exit_through, exit_costs
from growpipe.nn.methods import RULES, block_arch, build_block
from growpipe.nn.methods.bp import train_chain
from growpipe.nn.packet import Packet
from growpipe.nn.preserve import exit_state, gated, preserve_problem, start_from_exit
from growpipe.nn.specs import BlockSpec, InputInfo


def plan_blocks(net: NetSpec, rule: RuleSettings, info: InputInfo) -> list[BlockSpec]:
    """Specs of the initial blocks: the backbone cut into net.blocks pieces, exits as the learning rule wants,
    each with the rule and its architecture choices (block_arch), so the spec alone rebuilds the block."""
    encoders = plan_encoders(net, info)
    known, arch = RULES[rule.method], block_arch(rule)
    return [
        BlockSpec(i, enc, known.exit_everywhere or i == len(encoders) - 1, info.num_classes, rule.method, arch)
        for i, enc in enumerate(encoders)
    ]


def plan_growth_block(net: NetSpec, info: InputInfo, last: BlockSpec, step: GrowStep, preserve: bool = False,
                      request: bool = False) -> BlockSpec:  # fmt: skip
    """The spec of the block a growth step appends on top of `last`: the encoder the step describes, the rule
    and architecture choices of `last` (a net's heads agree: AL's label codes pass from block to block). With
    `preserve` (grow.init: preserve) gated to start as the identity, or ConfigError saying why it cannot (in a
    grow request's terms with `request`)."""
    shape, _ = output_shape(last.encoder, info)
    enc = growth_encoder(net, info, last.encoder, shape, step)
    if preserve:
        if why := preserve_problem(last, enc, info, net, request):
            raise ConfigError(f"grow.init: preserve: {why}")
        enc = gated(enc)
    return BlockSpec(last.index + 1, enc, True, info.num_classes, last.method, dict(last.arch))


class GrowableNet:
    """Blocks in order. Block i+1's input shape is block i's output shape (checked on append)."""

    def __init__(self, rule: RuleSettings, info: InputInfo, device: torch.device | str = "cpu"):
        self.settings = rule
        self.info = info
        self.rule = RULES[rule.method]
        self.device = torch.device(device)
        self.blocks: list[Block] = []

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def build(cls, rule: RuleSettings, net_spec: NetSpec, info: InputInfo, device: torch.device | str = "cpu"
              ) -> GrowableNet:  # fmt: skip
        """The initial net: the backbone `net_spec` cut into net_spec.blocks blocks."""
        net = cls(rule, info, device)
        for spec in plan_blocks(net_spec, rule, info):
            net.append(build_block(rule, spec, info))
        return net

    @classmethod
    def from_topology(
        cls,
        rule: RuleSettings,
        info: InputInfo,
        topology: list[dict[str, Any]],
        device: torch.device | str = "cpu",
    ) -> GrowableNet:
        """Rebuild a net (fresh weights) from `topology()` output."""
        net = cls(rule, info, device)
        for d in topology:
            net.append(build_block(rule, BlockSpec.from_dict(d), info))
        return net

    @classmethod
    def from_states(cls, rule: RuleSettings, info: InputInfo, topology: list[dict[str, Any]],
                    states: list[dict[str, Any]], device: torch.device | str = "cpu") -> GrowableNet:  # fmt: skip
        """Rebuild a trained net from its topology and every block's state (e.g. the stages' final states)."""
        net = cls.from_topology(rule, info, topology, device)
        net.load_state_dict({"blocks": states})
        return net

    def topology(self) -> list[dict[str, Any]]:
        """Serialisable block specs, enough to rebuild the net's structure."""
        return [b.spec.to_dict() for b in self.blocks]

    def append(self, block: Block) -> None:
        """Add a block on top; its input shape must equal the current output shape."""
        if self.blocks:
            prev = self.blocks[-1]
            if tuple(block.in_shape) != tuple(prev.out_shape):
                raise ShapeError(
                    f"block {len(self.blocks)} takes input of shape {tuple(block.in_shape)} but block "
                    f"{prev.index} produces {tuple(prev.out_shape)}; build it with in_shape={tuple(prev.out_shape)}"
                )
        elif tuple(block.in_shape) != tuple(self.info.shape):
            raise ShapeError(
                f"block 0 takes input of shape {tuple(block.in_shape)} but the data has shape {self.info.shape}"
            )
        if block.index != len(self.blocks):
            raise ShapeError(
                f"block index {block.index} appended at position {len(self.blocks)}; "
                f"build it with index {len(self.blocks)}"
            )
        self.blocks.append(block.to(self.device))

    def grow(self, net_spec: NetSpec, step: GrowStep, preserve: bool = False) -> Block:
        """Append the block a growth step describes (on the backbone `net_spec`; `preserve`: starting where the
        net stands, growpipe.nn.preserve). Whether the earlier blocks are frozen first is the caller's decision."""
        spec = plan_growth_block(net_spec, self.info, self.blocks[-1].spec, step, preserve)
        block = build_block(self.settings, spec, self.info)
        if preserve:
            start_from_exit(block, exit_state(self.blocks[-1]))
        self.append(block)
        return block

    def freeze(self, upto: int | None = None) -> None:
        """Freeze blocks [0, upto) (all current blocks by default)."""
        for b in self.blocks[: len(self.blocks) if upto is None else upto]:
            if not b.frozen:
                b.freeze()

    @property
    def depth(self) -> int:
        return len(self.blocks)

    def side_groups(self) -> tuple[str, ...]:
        """Side feature groups some block reads."""
        return tuple(b.spec.encoder.params["group"] for b in self.blocks if b.spec.encoder.family in FEATURE_FAMILIES)

    # ---- training ------------------------------------------------------------------------------------
    def train_step(self, p: Packet) -> dict[str, float]:
        """One training step on a packet through every block; metrics keyed 'b{i}.{name}'."""
        p = p.to(self.device)
        if self.rule.end_to_end:
            _, m = train_chain(self.blocks, p)  # type: ignore[arg-type]
            if SKIPPED in m:  # the chain's one update was skipped: every trainable block skipped it
                return {f"b{b.index}.{SKIPPED}": 1.0 for b in self.blocks if not b.frozen}
            return {f"b{self.blocks[-1].index}.{k}": v for k, v in m.items()}
        metrics: dict[str, float] = {}
        for b in self.blocks:
            p, m = b.train_step(p)
            metrics.update({f"b{b.index}.{k}": v for k, v in m.items()})
        return metrics

    # ---- inference -----------------------------------------------------------------------------------
    def exit_depths(self) -> list[int]:
        """1-based depths that have an exit."""
        return [b.index + 1 for b in self.blocks if b.has_exit]

    @torch.no_grad()
    def exit_logits(self, p: Packet, upto: int | None = None) -> dict[int, torch.Tensor]:
        """Logits at every exit depth <= upto (1-based), one forward pass through the blocks."""
        p = p.to(self.device)
        out: dict[int, torch.Tensor] = {}
        for b in self.blocks[: upto or len(self.blocks)]:
            p = b.forward(p)
            if b.has_exit:
                out[b.index + 1] = self._to_logits(b, p)
        return out

    def _to_logits(self, block: Block, out: Packet) -> torch.Tensor:
        with block.computing():
            z = block.exit(out)
            assert z is not None, f"{block.name} has no exit"
            if block.exit_decodes:
                for decode in self.decoders_below(block.index):
                    z = decode(z)
        return z.float()

    def decoders_below(self, index: int) -> list[Decode]:
        """The decoders of the blocks under block `index`, the nearest first (an AL exit is decoded by them)."""
        return [b.decode for b in reversed(self.blocks[:index])]

    @torch.no_grad()
    def early_exit(self, p: Packet, threshold: float | None, kind: str = "max_prob") -> Exited:
        """Adaptive inference that stops computing: a sample `threshold` confident at an exit leaves there and
        the blocks above never see it (threshold None: the full path). Rows are p.rows, else 0..n-1."""
        p = p.to(self.device)
        rows = p.rows if p.rows is not None else torch.arange(p.batch_size)
        exits = EarlyExit(threshold, kind, self.exit_depths()[-1])
        early_exit_through(self.blocks, p, rows, exits)
        return exits.result()

    @torch.no_grad()
    def predict(
        self, x: torch.Tensor, depth: int | None = None, side: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Logits of the full path (depth None) or the shortcut at `depth` (1-based) for inputs x."""
        depth = depth or self.depth
        if depth not in self.exit_depths():
            raise ValueError(f"depth {depth} has no exit; exits are at {self.exit_depths()}")
        return self.exit_logits(Packet(x=x, side=side or {}), upto=depth)[depth]

    def exit_costs(self) -> dict[int, tuple[int, int]]:
        """Per exit depth: (MACs per sample of the encoders up to it, MACs of its head incl. decoders below)."""
        return exit_costs([b.cost_parts() for b in self.blocks])

    # ---- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"blocks": [b.state_dict() for b in self.blocks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["blocks"]) != len(self.blocks):
            raise ShapeError(
                f"state has {len(state['blocks'])} blocks but the net has {len(self.blocks)}; "
                "load it into a net built from the same topology"
            )
        for b, s in zip(self.blocks, state["blocks"], strict=True):
            b.load_state_dict(s)
            b.to(self.device)
