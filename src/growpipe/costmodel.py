"""A small cost model of the local-learning pipeline, to size a cluster before renting it.

One training epoch of K stages streams `batches` packets through them. A stage spends per packet its step
(forward, local loss, backward, optimizer: `growpipe partition` profiles it alone on a device; `slowdown`
says how much slower it runs beside busy neighbours), taking the packet from the stage before it (a hop's
fixed cost), and, unless it is the last, the hand-off to the next stage: a hop's fixed cost plus the
packet's bytes over the link. In the steady state a new packet leaves the pipeline every `period`: the
slowest stage's time, or, when fewer devices than stages compute at once (stage actors sharing a machine's
cores), the stages' total work spread over those devices. The first packet crosses every stage once.

    epoch = batches x max(max_i c_i, sum_i c_i / min(parallel, K)) + sum_i c_i - max_i c_i
    c_i   = slowdown x step_i + hop_ms [i > 0] + (hop_ms + packet_mb / mb_per_s) [i < K - 1]

bench/scale.py calibrates it on this machine (hop cost and bandwidth measured, step times profiled) and
checks it against measured epochs; `predict` applies it to a described cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hardware:
    """What the stages run on."""

    parallel: int
    """Stages that compute at the same time: the devices (one GPU per stage: K), or a shared machine's cores."""
    hop_ms: float
    """The fixed cost of handing a packet to the next stage (an actor call), in ms."""
    mb_per_s: float
    """The link's bandwidth for a packet's bytes, in MiB/s."""
    slowdown: float = 1.0
    """How much slower a step runs in the pipeline than profiled alone: caches and memory bandwidth shared with
    the stages beside it on one machine (measured by bench/scale.py from one run); 1.0: a device per stage."""


def stage_costs(step_ms: list[float], packet_mb: float, hw: Hardware) -> list[float]:
    """Per stage, the ms it spends per packet: its step, taking the packet in (all but the first stage) and
    handing its output on (all but the last)."""
    hand_off = hw.hop_ms + 1000.0 * packet_mb / hw.mb_per_s
    last = len(step_ms) - 1
    return [hw.slowdown * s + (hw.hop_ms if i > 0 else 0.0) + (hand_off if i < last else 0.0)
            for i, s in enumerate(step_ms)]  # fmt: skip


def epoch_seconds(step_ms: list[float], batches: int, packet_mb: float, hw: Hardware) -> float:
    """Predicted seconds of one training epoch of len(step_ms) stages over `batches` packets."""
    if not step_ms or batches < 1:
        raise ValueError("give at least one stage's step time and one batch")
    cost = stage_costs(step_ms, packet_mb, hw)
    period = max(max(cost), sum(cost) / max(1, min(hw.parallel, len(cost))))
    return (batches * period + sum(cost) - max(cost)) / 1000.0


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    return abs(predicted - measured) / measured if measured else float("inf")


def predict(cluster: dict[str, Any], stages: list[int], batches: int) -> list[dict[str, float]]:
    """Epoch seconds for each K in `stages` on a described cluster: {step_ms: one stage's step on its device
    (every stage one block of the same size), packet_mb: the bytes a packet carries, hop_ms, mb_per_s,
    parallel: stages computing at once (default: every stage its own device), slowdown (default 1)}."""
    out = []
    for k in stages:
        hw = Hardware(int(cluster.get("parallel") or k), float(cluster["hop_ms"]), float(cluster["mb_per_s"]),
                      float(cluster.get("slowdown", 1.0)))  # fmt: skip
        seconds = epoch_seconds([float(cluster["step_ms"])] * k, batches, float(cluster["packet_mb"]), hw)
        out.append({"stages": k, "epoch_seconds": seconds, "batches_per_second": batches / seconds})
    return out
