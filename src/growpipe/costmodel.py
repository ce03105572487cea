"""A small cost model of the local-learning pipeline, to size a cluster before renting it.

One training epoch of K stages streams `batches` packets through them. A stage spends per packet its step
(forward, local loss, backward, optimizer: `growpipe partition` profiles it on a device) and, unless it is
the last, the hand-off to the next stage: a fixed cost per hop plus the packet's bytes over the link. In the
steady state a new packet leaves the pipeline every `period`: the slowest stage's time, or, when fewer
devices than stages compute at once (stage actors sharing a machine's cores), the stages' total work spread
over those devices. The first packet crosses every stage once (filling the pipeline).

    epoch = batches x max(max_i c_i, sum_i c_i / min(parallel, K)) + sum_i c_i - max_i c_i
    c_i   = step_i + (hop_ms + packet_mb / mb_per_s) for every stage but the last

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


def stage_costs(step_ms: list[float], packet_mb: float, hw: Hardware) -> list[float]:
    """Per stage, the ms it spends per packet: its step, and the hand-off unless it is the last stage."""
    hand_off = hw.hop_ms + 1000.0 * packet_mb / hw.mb_per_s
    return [s + (hand_off if i < len(step_ms) - 1 else 0.0) for i, s in enumerate(step_ms)]


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
    parallel: stages computing at once (default: every stage its own device)}."""
    out = []
    for k in stages:
        hw = Hardware(int(cluster.get("parallel") or k), float(cluster["hop_ms"]), float(cluster["mb_per_s"]))
        seconds = epoch_seconds([float(cluster["step_ms"])] * k, batches, float(cluster["packet_mb"]), hw)
        out.append({"stages": k, "epoch_seconds": seconds, "batches_per_second": batches / seconds})
    return out
