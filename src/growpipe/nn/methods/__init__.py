"""Learning rules: each builds Blocks with the same interface (see growpipe.nn.block)."""

from __future__ import annotations

from dataclasses import dataclass

from growpipe.config import RuleSettings
from growpipe.nn.block import Block, block_seed, seeded
from growpipe.nn.methods.al import ALBlock
from growpipe.nn.methods.bp import BPBlock
from growpipe.nn.methods.dascpl import DASCPLBlock
from growpipe.nn.methods.scpl import SCPLBlock
from growpipe.nn.specs import BlockSpec, InputInfo


@dataclass(frozen=True)
class Rule:
    """What the net needs to know about a learning rule."""

    name: str
    block_class: type[Block]
    exit_everywhere: bool
    """Every block has an exit head (else only the block that was last when it was added)."""
    end_to_end: bool
    """Blocks train together through one loss (BP) instead of each on its own."""


RULES: dict[str, Rule] = {
    "al": Rule("al", ALBlock, exit_everywhere=True, end_to_end=False),
    "scpl": Rule("scpl", SCPLBlock, exit_everywhere=False, end_to_end=False),
    "dascpl": Rule("dascpl", DASCPLBlock, exit_everywhere=True, end_to_end=False),
    "bp": Rule("bp", BPBlock, exit_everywhere=False, end_to_end=True),
}


def build_block(rule: RuleSettings, spec: BlockSpec, info: InputInfo) -> Block:
    """Instantiate the block `spec` describes under the learning rule `rule`.

    Initial weights come from the block's own seed (run seed and index), so a block built alone in a Ray
    actor equals the one the reference trainer builds.
    """
    with seeded(block_seed(rule.seed, spec.index)):
        return RULES[rule.method].block_class(spec, info, rule)
