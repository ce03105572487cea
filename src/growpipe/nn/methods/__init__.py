"""Learning rules: each builds Blocks with the same interface (see growpipe.nn.block)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    section: str = ""
    """The RuleSettings section holding the rule's options ("al", "scpl"; "": none)."""
    arch_fields: tuple[str, ...] = ()
    """The options of that section that shape a block (its heads), kept in every BlockSpec's `arch`; the
    others (temperature, loss reduction, label-side rate) are training settings read from the run config."""


AL_ARCH = ("code_dim", "bridge_hidden", "activation", "decoder_activation")
SCPL_ARCH = ("projector", "proj_dim", "classifier", "classifier_hidden", "classifier_norm")
RULES: dict[str, Rule] = {
    "al": Rule("al", ALBlock, exit_everywhere=True, end_to_end=False, section="al", arch_fields=AL_ARCH),
    "scpl": Rule("scpl", SCPLBlock, exit_everywhere=False, end_to_end=False, section="scpl", arch_fields=SCPL_ARCH),
    "dascpl": Rule(
        "dascpl", DASCPLBlock, exit_everywhere=True, end_to_end=False, section="scpl", arch_fields=SCPL_ARCH
    ),
    "bp": Rule("bp", BPBlock, exit_everywhere=False, end_to_end=True),
}


def block_arch(rule: RuleSettings) -> dict[str, Any]:
    """The architecture choices of `rule`'s blocks (a BlockSpec's `arch`), e.g. {"code_dim": 128, ...} for AL."""
    known = RULES[rule.method]
    options = getattr(rule, known.section) if known.section else None
    return {name: getattr(options, name) for name in known.arch_fields}


def build_block(rule: RuleSettings, spec: BlockSpec, info: InputInfo) -> Block:
    """Instantiate the block `spec` describes: its rule (spec.method), encoder and heads (spec.arch) from the
    spec alone; from `rule` only its training settings (seed, optimizer, losses' temperature and weights).

    Initial weights come from the block's own seed (run seed and index), so a block built alone in a Ray
    actor equals the one the reference trainer builds.
    """
    if spec.method not in RULES:
        raise ValueError(f"block {spec.index}: unknown learning rule {spec.method!r}; one of {', '.join(RULES)}")
    with seeded(block_seed(rule.seed, spec.index)):
        return RULES[spec.method].block_class(spec, info, rule)
