"""Exit read-out and adaptive (early-exit) inference, computed once from stored per-exit predictions."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from growpipe.nn.packet import Packet


@dataclass
class ExitPredictions:
    """Softmax probabilities at every exit depth for a whole split, and the true labels."""

    depths: list[int]
    probs: dict[int, torch.Tensor]
    labels: torch.Tensor

    def accuracy(self, depth: int) -> float:
        return float((self.probs[depth].argmax(1) == self.labels).float().mean())


def collect_exits(net: Any, batches: Iterable[Packet]) -> ExitPredictions:
    """Run every batch once through `net` (a GrowableNet) and keep the probabilities at each exit."""
    probs: dict[int, list[torch.Tensor]] = {}
    labels: list[torch.Tensor] = []
    for p in batches:
        for d, logits in net.exit_logits(p).items():
            probs.setdefault(d, []).append(torch.softmax(logits.float(), 1).cpu())
        labels.append(p.y.cpu())
    depths = sorted(probs)
    return ExitPredictions(depths, {d: torch.cat(v) for d, v in probs.items()}, torch.cat(labels))


def confidence(probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample confidence in [0, 1]: the top probability, or 1 - entropy / log(classes)."""
    if kind == "max_prob":
        return probs.max(1).values
    if kind == "entropy":
        ent = -(probs * probs.clamp_min(1e-12).log()).sum(1)
        return 1.0 - ent / math.log(probs.shape[1])
    raise ValueError(f"confidence: {kind!r} is not max_prob or entropy")


def check_threshold(threshold: float) -> None:
    """Thresholds are confidences: they must lie in [0, 1]."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold {threshold} is outside [0, 1]; confidences are probabilities")


def adaptive_exit(preds: ExitPredictions, threshold: float, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample leaves at the first exit whose confidence reaches `threshold` (else the last exit).

    Returns (predicted class, index into preds.depths of the exit taken).
    """
    check_threshold(threshold)
    n = preds.labels.shape[0]
    taken = torch.full((n,), len(preds.depths) - 1, dtype=torch.long)
    decided = torch.zeros(n, dtype=torch.bool)
    for j, d in enumerate(preds.depths[:-1]):
        ok = (confidence(preds.probs[d], kind) >= threshold) & ~decided
        taken[ok] = j
        decided |= ok
    stacked = torch.stack([preds.probs[d].argmax(1) for d in preds.depths], dim=1)
    return stacked.gather(1, taken[:, None]).squeeze(1), taken


def evaluate_exits(
    preds: ExitPredictions, thresholds: list[float], kind: str, costs: dict[int, tuple[int, int]]
) -> dict[str, Any]:
    """Accuracy per exit, full-path accuracy, MACs per exit, and the adaptive trade-off per threshold.

    `costs[d]` is (encoder MACs up to depth d, exit-head MACs at d). An adaptive sample leaving at depth d
    has paid for the encoders up to d and for every exit head it consulted on the way.
    """
    depths = preds.depths
    full = depths[-1]
    macs_exit = [costs[d][0] + costs[d][1] for d in depths]
    adaptive_cost = []
    heads_so_far = 0
    for d in depths:
        heads_so_far += costs[d][1]
        adaptive_cost.append(costs[d][0] + heads_so_far)
    full_macs = macs_exit[-1]
    rows = []
    for th in thresholds:
        pred, taken = adaptive_exit(preds, th, kind)
        frac = torch.bincount(taken, minlength=len(depths)).float() / len(taken)
        macs = float(sum(f * c for f, c in zip(frac.tolist(), adaptive_cost, strict=True)))
        rows.append(
            {
                "threshold": th,
                "accuracy": float((pred == preds.labels).float().mean()),
                "mean_depth": float(sum(f * d for f, d in zip(frac.tolist(), depths, strict=True))),
                "exit_fraction": [round(f, 6) for f in frac.tolist()],
                "macs_per_sample": macs,
                "macs_saved_fraction": 1.0 - macs / full_macs if full_macs else 0.0,
            }
        )
    return {
        "exit_depths": depths,
        "exit_accuracy": [preds.accuracy(d) for d in depths],
        "full_accuracy": preds.accuracy(full),
        "macs_per_exit": macs_exit,
        "confidence": kind,
        "adaptive": rows,
    }
