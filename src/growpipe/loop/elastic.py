"""The loop's hand on the topology policy (growpipe.loop.topology): it asks the engine where the blocks run,
asks the policy what to do, waits when it says wait, and records every change (the result JSON's
`topology_changes`, MLflow through the callbacks)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from growpipe.config import RunConfig
from growpipe.errors import PipelineError
from growpipe.loop.callbacks import RunCallback, notify
from growpipe.loop.engine import Engine
from growpipe.loop.topology import Fail, Layout, Replace, Shrink, TopologyView, Wait, after_loss, expand

WAIT_SAY_S = 60.0
"""While a run waits for capacity, how often it says so."""
SETTLE_S = (0.05, 1.0)
"""When Ray says the homes are placed but the engine still sees one on no live node (its tables catching up on a
node's loss): the first and the longest pause before asking again, doubling in between."""


class Topology:
    """Where a run's blocks go when nodes come and go, for engines that can tell (PipelineEngine)."""

    def __init__(self, cfg: RunConfig, engine: Engine, callbacks: list[RunCallback], say: Callable[[str], None],
                 stopped: Callable[[], bool]):  # fmt: skip
        self.cfg = cfg
        self.engine = engine
        self.callbacks = callbacks
        self.say = say
        self.stopped = stopped
        self.changes: list[dict[str, Any]] = []
        self.nodes: list[str] = []  # each block's node when last seen alive

    def view(self) -> TopologyView | None:
        """The engine's view (None: it does not place blocks in bundles)."""
        return self.engine.topology()

    def note(self) -> None:
        """Remember where the blocks run now (to name the node when one is lost)."""
        if (view := self.view()) is not None:
            self.nodes = list(view.nodes)

    def after_loss(self, saved: dict[str, Any] | None, blocks: int, epoch: int, batch: int) -> Layout | None:
        """Where the `blocks` blocks of a checkpoint go after a lost worker (None: the engine's own way).
        Waits while the policy says wait; PipelineError when it says fail."""
        start = time.monotonic()
        spoke = 0.0
        settle = 0.0
        spread = Layout.spread(list((saved or {}).get("hosts") or [None] * blocks))
        while True:
            view = self.view()
            if view is None:
                return None
            placed = (view.placed + [False] * blocks)[:blocks]
            gone = sorted({n[:12] for n, p in zip(self.nodes, placed, strict=False) if n and not p})
            lost = f"node {', '.join(gone)}" if gone else "a node"
            waited = time.monotonic() - start
            d = after_loss(spread, placed, waited, self.cfg.runtime.placement_timeout_s, self.cfg.runtime.on_lost_node,
                           lost)  # fmt: skip
            if isinstance(d, Replace):
                self.record("replace", epoch, batch, "lost stage actors replaced in their bundles", d.layout)
                return d.layout
            if isinstance(d, Shrink):
                self.record("shrink", epoch, batch, f"{lost} lost: blocks {list(d.moved)} packed", d.layout)
                return d.layout
            if isinstance(d, Fail):
                raise PipelineError(d.message)
            assert isinstance(d, Wait)
            if self.stopped():
                raise PipelineError("stopped while waiting for capacity")
            if not spoke or waited - spoke >= WAIT_SAY_S:
                self.say(f"wait   {d.why} (runtime.on_lost_node: {self.cfg.runtime.on_lost_node}, "
                         f"placement_timeout_s {self.cfg.runtime.placement_timeout_s:g})")  # fmt: skip
                spoke = max(waited, 1e-9)
            settle = self._wait(view, waited, spoke, settle)

    def _wait(self, view: TopologyView, waited: float, spoke: float, settle: float) -> float:
        """Wait until the lost homes are placed again, the policy's deadline or the next line saying so; the
        pause before asking again next time (see SETTLE_S)."""
        timeout = self.cfg.runtime.placement_timeout_s
        deadline = timeout - waited if self.cfg.runtime.on_lost_node != "wait" and waited < timeout else math.inf
        wait_s = max(min(deadline, spoke + WAIT_SAY_S - waited), 0.0)
        if settle:  # placed, Ray said last time, yet not seen so: let its tables catch up first
            time.sleep(min(settle, wait_s))
        if not view.wait_placed(wait_s):
            return 0.0
        return min(max(2 * settle, SETTLE_S[0]), SETTLE_S[1])

    def expand_due(self) -> Layout | None:
        """The spread layout when a shrunk run can spread out again (every home placed again)."""
        view = self.view()
        if view is None or not expand(view.layout, view.spread, view.placed):
            return None
        return view.spread

    def record(self, change: str, epoch: int, batch: int, why: str, layout: Layout) -> None:
        event = {"epoch": epoch, "batch": batch, "change": change, "why": why, "actors": layout.actors,
                 "hosts": list(layout.hosts), "time": time.time()}  # fmt: skip
        self.changes.append(event)
        self.say(f"topo   {change}: {why}; {layout.actors} stage actor(s) for {len(layout.hosts)} blocks")
        notify(self.callbacks, "on_topology", event, say=self.say)
