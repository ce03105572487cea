"""Where the blocks run when the cluster changes: one policy, functions of the cluster's and the run's state
that return a decision the loop has the engine execute (the shape of Ray Train v2's scaling policy).

- after a lost worker: Replace (every block's home bundle is placed again: same layout), Wait (capacity may
  still come), Shrink (pack the blocks whose home is gone into surviving actors) or Fail (nothing left);
- at an epoch boundary: Expand (a shrunk run's homes are all placed again: every block back in its own
  actor).

A block's home is the placement-group bundle its own actor uses; `placed[i]` says whether block i's home is
on a live node now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Layout:
    """hosts[i]: the block whose actor runs block i after its own (None: its own actor); homes[i]: the block
    whose home bundle block i's own actor uses (None for a packed block)."""

    hosts: tuple[int | None, ...]
    homes: tuple[int | None, ...]

    @classmethod
    def spread(cls, hosts: list[int | None]) -> Layout:
        """Each block with an actor of its own in its own home (blocks packed by growth stay packed)."""
        return cls(tuple(hosts), tuple(i if h is None else None for i, h in enumerate(hosts)))

    @property
    def actors(self) -> int:
        return sum(h is None for h in self.hosts)


@dataclass(frozen=True)
class TopologyView:
    """What the engine says of where the blocks run: the layout now, the spread one it came from, and
    whether each block's home is placed on a live node."""

    layout: Layout
    spread: Layout
    placed: list[bool]
    nodes: list[str]
    """The node of each block's actor now ('' when none)."""
    wait_placed: Callable[[float], bool] = field(compare=False)
    """Block until the homes not placed now are placed again (or the run's reservations are released), at most
    that many seconds; True when they are (what a capacity wait waits on)."""


@dataclass(frozen=True)
class Replace:
    """Replace the lost actors in their homes: the layout stays."""

    layout: Layout


@dataclass(frozen=True)
class Wait:
    """Not yet: `why` (said once)."""

    why: str


@dataclass(frozen=True)
class Shrink:
    """Go on without the lost homes: blocks `moved` run packed into surviving actors."""

    layout: Layout
    moved: tuple[int, ...]


@dataclass(frozen=True)
class Fail:
    message: str


def after_loss(layout: Layout, placed: list[bool], waited_s: float, timeout_s: float, on_lost_node: str,
               lost: str = "a node") -> Replace | Wait | Shrink | Fail:  # fmt: skip
    """What to do once a worker was lost, `waited_s` seconds after the loss (runtime.on_lost_node: shrink,
    wait or fail; runtime.placement_timeout_s = `timeout_s`)."""
    homes = [h for h in layout.homes if h is not None]
    missing = [h for h in homes if not placed[h]]
    if not missing:
        return Replace(layout)
    short = f"the home bundle(s) of block(s) {missing} ({lost} is gone)"
    if on_lost_node == "wait" or waited_s < timeout_s:
        return Wait(f"waiting for capacity for {short}")
    if on_lost_node == "fail":
        return Fail(f"{short} could not be placed again within runtime.placement_timeout_s={timeout_s:g}s "
                    "(runtime.on_lost_node: fail); add a node, or set on_lost_node: shrink to go on")  # fmt: skip
    survivors = [h for h in homes if placed[h]]
    if not survivors:
        return Fail(f"no worker is left to run on: {short}, and no other home is placed; add a node with a "
                    "stage's resources (the newest checkpoint is kept: growpipe train --resume goes on)")  # fmt: skip
    return shrink(len(layout.hosts), survivors, missing)


def shrink(blocks: int, survivors: list[int], missing: list[int]) -> Shrink:
    """Group the blocks around the surviving homes, in order: block i runs in the actor of the nearest
    surviving home at or before it (blocks before the first survivor join the first group, whose actor
    then starts at block 0 in that home)."""
    survivors = sorted(survivors)
    hosts: list[int | None] = []
    homes: list[int | None] = []
    for i in range(blocks):
        before = [s for s in survivors if s <= i]
        group_home = before[-1] if before else survivors[0]
        start = 0 if group_home == survivors[0] else group_home
        hosts.append(None if i == start else start)
        homes.append(group_home if i == start else None)
    return Shrink(Layout(tuple(hosts), tuple(homes)), tuple(missing))


def expand(layout: Layout, spread: Layout, placed: list[bool]) -> bool:
    """Spread a shrunk run out again: it runs fewer actors than its spread layout and every home of that
    layout is placed again."""
    homes = [h for h in spread.homes if h is not None]
    return layout.actors < spread.actors and all(placed[h] for h in homes)
