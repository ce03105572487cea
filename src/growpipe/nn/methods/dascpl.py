"""DASCPL: SCPL plus a classifier head (cross-entropy on detached features) on every block, so every depth
is an exit: forward shortcuts, early exit and dynamic depth."""

from __future__ import annotations

from growpipe.nn.methods.scpl import SCPLBlock


class DASCPLBlock(SCPLBlock):
    """An SCPL block that always carries its own classifier (the rule plans has_exit=True everywhere)."""
