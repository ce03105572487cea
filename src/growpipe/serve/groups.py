"""A net too big for one replica, served as block groups (`growpipe serve --stages S`): group i holds only its
own contiguous blocks (loaded from the checkpoint's shards, no other block's weights), runs real early exit
on them and hands only the undecided rows to group i + 1. AL's exits decode through the label-side decoders
of every block below them: a group keeps those small modules (code_dim wide) of the blocks under it, built
one block at a time and the rest of each dropped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from growpipe.checkpoint import open_checkpoint
from growpipe.nn.inference import EarlyExit, Exited, early_exit_through
from growpipe.nn.methods import build_block
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.saved_config import inference_rule
from growpipe.serve.predictor import NetVersion


def group_blocks(n_blocks: int, groups: int, index: int) -> range:
    """The blocks of group `index` of `groups`: contiguous, sizes differing by at most one, the larger first
    (a net with fewer blocks than groups leaves the last groups empty: they pass nothing on)."""
    base, extra = divmod(n_blocks, groups)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


@dataclass
class BlockGroupNet:
    """Blocks `indices` of a checkpoint's net, the decoders below them, and the depth of the net's last exit."""

    blocks: list[Any]
    below: list[torch.nn.Module]
    """Decoders of the blocks under this group's first block, the nearest first (AL; empty otherwise)."""
    last_depth: int
    version: NetVersion

    @classmethod
    def load(cls, checkpoint: str | Path, groups: int, index: int, device: torch.device | str = "cpu") -> BlockGroupNet:
        """Load group `index` of `groups` of the net in checkpoint directory `checkpoint` (hash-checked), from the
        manifest's specs and input alone (its saved config is not read; optimizer states are not loaded)."""
        store, target, manifest = open_checkpoint(checkpoint)
        info, topology, rule = InputInfo.from_dict(manifest["input"]), manifest["topology"], inference_rule(manifest)

        def built(i: int, state: dict[str, Any]) -> Any:
            block = build_block(rule, BlockSpec.from_dict(topology[i]), info)
            block.load_state_dict({**state, "optimizers": {}})
            return block.to(device)

        mine = list(group_blocks(len(topology), groups, index))
        blocks = [built(i, s) for i, s in zip(mine, store.load_blocks(target, manifest["shards"], mine), strict=True)]
        below: list[torch.nn.Module] = []
        if any(b.exit_decodes for b in blocks):
            for i in reversed(range(mine[0])):  # one lower block at a time; only its decoder is kept
                decoder = built(i, store.load_block(target, manifest["shards"], i)).decoder()
                below.append(decoder.eval())
        last_depth = max(d["index"] + 1 for d in topology if d["has_exit"])
        return cls(blocks, below, last_depth, NetVersion.of(target, manifest))

    @torch.no_grad()
    def run(self, p: Packet, threshold: float | None, kind: str) -> tuple[Exited, Packet | None]:
        """Early exit over this group's blocks: the rows that left here, and the undecided rest (None: none)."""
        exits = EarlyExit(threshold, kind, self.last_depth)
        rows = p.rows if p.rows is not None else torch.arange(p.batch_size)
        rest = early_exit_through(self.blocks, p, rows, exits, self.below)
        return exits.result(), rest
