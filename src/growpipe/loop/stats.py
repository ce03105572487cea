"""Where a stage's time went: one dataclass for a piece of an epoch, a whole epoch and a whole run.

A stage fills one between two flushes; the run loop merges the pieces of an epoch (a growth or a batch
checkpoint cuts it) and then adds every epoch into the run's totals with the same `merge`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from growpipe.nn.guard import SKIPPED


@dataclass
class StageStats:
    """Samples, busy/idle seconds, hops, losses (keyed `b{block}.{name}`) and skipped batches (keyed
    `b{block}`) of one stage."""

    stage: int
    block: str = "?"
    node: str = ""
    """The Ray node the stage's actor ran on (its id)."""
    device: str = ""
    """The torch device it trained on (cpu, cuda:0)."""
    samples: int = 0
    batches: int = 0
    busy_s: float = 0.0
    wait_input_s: float = 0.0
    blocked_s: float = 0.0
    wall_s: float = 0.0
    """Wall time of the epochs merged in (the loop sets it): the denominator of the utilisation."""
    hops_ms: list[float] = field(default_factory=list)
    """From handing a packet on to the next stage starting it, queueing excluded (both times in the receiver's
    clock, see runtime/clocks.py)."""
    max_inflight: int = 0
    """The most packets it had handed on that the next stage had not finished (pipeline.window bounds it)."""
    sent_bytes: int = 0
    """Bytes of the activations it handed on to the next stage."""
    peak_rss_mb: float = 0.0
    """The largest resident memory its process has had (its block, optimizer, buffers, activations)."""
    loss_sums: dict[str, float] = field(default_factory=dict)
    loss_batches: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    """Batches whose update a block skipped (train.on_nonfinite: skip_batch), by block (`b{block}`)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Chrome-trace events, when the stage was recording."""

    def add_batch(self, samples: int, metrics: dict[str, float]) -> None:
        """Count one trained batch of `samples` samples and its losses (`add_losses`)."""
        self.batches += 1
        self.samples += samples
        self.add_losses(metrics)

    def add_losses(self, metrics: dict[str, float]) -> None:
        """Count one batch's losses (and the blocks that skipped it)."""
        for k, v in metrics.items():
            block, _, name = k.rpartition(".")
            if name == SKIPPED:
                self.skipped[block] = self.skipped.get(block, 0) + int(v)
                continue
            self.loss_sums[k] = self.loss_sums.get(k, 0.0) + v
            self.loss_batches[k] = self.loss_batches.get(k, 0) + 1

    @property
    def losses(self) -> dict[str, float]:
        """Mean of each loss over the batches that reported it."""
        return {k: v / max(self.loss_batches[k], 1) for k, v in self.loss_sums.items()}

    def merge(self, other: StageStats) -> StageStats:
        """The two pieces of the same stage as one (sums, the larger in-flight peak, every hop and loss)."""
        sums = dict(self.loss_sums)
        counts = dict(self.loss_batches)
        for k, v in other.loss_sums.items():
            sums[k] = sums.get(k, 0.0) + v
            counts[k] = counts.get(k, 0) + other.loss_batches[k]
        skipped = dict(self.skipped)
        for k, n in other.skipped.items():
            skipped[k] = skipped.get(k, 0) + n
        return replace(
            self,
            block=other.block if other.block != "?" else self.block,
            node=other.node or self.node,
            device=other.device or self.device,
            samples=self.samples + other.samples,
            batches=self.batches + other.batches,
            busy_s=self.busy_s + other.busy_s,
            wait_input_s=self.wait_input_s + other.wait_input_s,
            blocked_s=self.blocked_s + other.blocked_s,
            wall_s=self.wall_s + other.wall_s,
            hops_ms=self.hops_ms + other.hops_ms,
            max_inflight=max(self.max_inflight, other.max_inflight),
            sent_bytes=self.sent_bytes + other.sent_bytes,
            peak_rss_mb=max(self.peak_rss_mb, other.peak_rss_mb),
            loss_sums=sums,
            loss_batches=counts,
            skipped=skipped,
            events=self.events + other.events,
        )

    def row(self) -> dict[str, Any]:
        """This stage's row of the per-stage table (result JSON `stages`)."""
        hops = sorted(self.hops_ms)
        return {
            "stage": self.stage,
            "block": self.block,
            "node": self.node,
            "device": self.device,
            "samples": self.samples,
            "samples_per_second": self.samples / self.busy_s if self.busy_s else 0.0,
            "busy_s": round(self.busy_s, 3),
            "wait_input_s": round(self.wait_input_s, 3),
            "blocked_s": round(self.blocked_s, 3),
            "utilisation": self.busy_s / self.wall_s if self.wall_s else 0.0,
            "hop_ms_median": hops[len(hops) // 2] if hops else None,
            "hop_ms_min": hops[0] if hops else None,
            "max_inflight": self.max_inflight,
            "sent_mb": round(self.sent_bytes / 2**20, 3),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }


def merge_by_stage(pieces: Iterable[StageStats]) -> list[StageStats]:
    """One StageStats per stage, in stage order, from pieces of any stages."""
    out: dict[int, StageStats] = {}
    for p in pieces:
        out[p.stage] = out[p.stage].merge(p) if p.stage in out else p
    return [out[i] for i in sorted(out)]
