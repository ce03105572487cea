"""Exit read-out and adaptive (early-exit) inference: the accounting of every threshold from one pass that
computes every exit (stored per-exit predictions), and real early exit, where a sample that is confident at
an exit leaves and the blocks after it never see it (`EarlyExit`). The same code runs in one process
(GrowableNet) and spread over stage actors (each runs its own blocks and passes on the undecided rows)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from growpipe.nn.packet import Packet

Decode = Callable[[torch.Tensor], torch.Tensor]


def exit_probs(block: Any, out: Packet, decoders: Sequence[Decode]) -> torch.Tensor | None:
    """Class probabilities at `block`'s exit from its output packet `out` (None: no exit at this depth). An
    exit in a label-code space (AL) is decoded by `decoders`: the decoders of the blocks below it, the
    nearest first."""
    if not block.has_exit:
        return None
    with block.computing():
        z = block.exit(out)
        if block.exit_decodes:
            for decode in decoders:
                z = decode(z)
    return torch.softmax(z.float(), 1)


@dataclass
class Exited:
    """Samples that have left: their row in the split, predicted class, exit depth (1-based) and confidence."""

    rows: torch.Tensor
    prediction: torch.Tensor
    depth: torch.Tensor
    confidence: torch.Tensor

    @staticmethod
    def cat(parts: Sequence[Exited]) -> Exited:
        """Parts from several exits (or stages) as one, ordered by row."""
        rows = torch.cat([p.rows for p in parts]) if parts else torch.zeros(0, dtype=torch.long)
        order = rows.argsort()

        def join(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.cat([getattr(p, name) for p in parts])[order] if parts else torch.zeros(0, dtype=dtype)

        return Exited(rows[order], join("prediction", torch.long), join("depth", torch.long),
                      join("confidence", torch.float32))  # fmt: skip


class EarlyExit:
    """Real early exit: at each exit the samples at least `threshold` confident leave (every one left at
    `last_depth`, none before it when `threshold` is None: the full path); `take` returns the others, the only
    rows the next blocks compute."""

    def __init__(self, threshold: float | None, kind: str, last_depth: int):
        if threshold is not None:
            check_threshold(threshold)
        self.threshold, self.kind, self.last_depth = threshold, kind, last_depth
        self.parts: list[Exited] = []

    def take(self, depth: int, probs: torch.Tensor, p: Packet, rows: torch.Tensor) -> Packet | None:
        """Record the samples of `p` (split rows `rows`) that leave at exit `depth`; the rest, or None."""
        conf = confidence(probs, self.kind)
        if depth >= self.last_depth:
            leave = torch.ones_like(conf, dtype=torch.bool)
        elif self.threshold is None:
            leave = torch.zeros_like(conf, dtype=torch.bool)
        else:
            leave = conf >= self.threshold
        if leave.any():
            cut = leave.cpu()
            depths = torch.full((int(cut.sum()),), depth, dtype=torch.long)
            self.parts.append(Exited(rows[cut], probs.argmax(1).cpu()[cut], depths, conf.cpu()[cut]))
        if leave.all():
            return None
        rest = p.select(~leave)
        rest.rows = rows[~leave.cpu()]
        return rest

    def result(self) -> Exited:
        """Every sample recorded so far, ordered by row."""
        return Exited.cat(self.parts)


def early_exit_through(blocks: Sequence[Any], p: Packet, rows: torch.Tensor, exits: EarlyExit,
                       below: Sequence[Decode] = ()) -> Packet | None:  # fmt: skip
    """Real early exit through consecutive `blocks`: each exit's confident rows of `p` (split rows `rows`) are
    recorded in `exits`; returns the undecided rest with its rows (None: every row left). `below` are the
    decoders of the blocks under the first one, the nearest first (AL's exits decode through them)."""
    below = list(below)
    for block in blocks:
        p = block.forward(p)
        probs = exit_probs(block, p, below)
        if block.decoder() is not None:
            below = [block.decode, *below]
        if probs is None:
            continue
        rest = exits.take(block.index + 1, probs, p, rows)
        if rest is None:
            return None
        p, rows = rest, rest.rows  # type: ignore[assignment]
    p.rows = rows
    return p


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
        labels.append(p.labels().cpu())
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
    adaptive_cost = list(adaptive_costs(costs).values())
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


def adaptive_costs(costs: dict[int, tuple[int, int]]) -> dict[int, int]:
    """MACs per sample of a sample that leaves at each exit depth: the encoders up to it and every exit head
    consulted on the way (`costs[d]`: encoder MACs up to d, exit-head MACs at d)."""
    out, heads = {}, 0
    for d in sorted(costs):
        heads += costs[d][1]
        out[d] = costs[d][0] + heads
    return out


def exit_costs(blocks: Sequence[tuple[int, int, int, int, bool, bool]]) -> dict[int, tuple[int, int]]:
    """Per exit depth: (MACs per sample of the encoders up to it, MACs of its head with the decoders below)
    from each block's (index, encoder MACs, exit-head MACs, decoder MACs, has exit, exit decodes)."""
    out = {}
    for index, _, exit_macs, _, has_exit, decodes in sorted(blocks):
        if has_exit:
            encoders = sum(b[1] for b in blocks if b[0] <= index)
            decoders = sum(b[3] for b in blocks if b[0] < index) if decodes else 0
            out[index + 1] = (encoders, exit_macs + decoders)
    return out


def chosen_threshold(ev: dict[str, Any], given: float | None, within: float = 0.005) -> float | None:
    """The threshold real early exit is measured at: `given` (eval.exit_threshold), else the lowest of the
    table's thresholds that costs less than the full path and keeps accuracy within `within` of it, else None
    (the full path: every threshold either costs more, since a sample that reaches the last exit has paid for
    every head on the way, or loses accuracy)."""
    if given is not None:
        return given
    rows = sorted(ev["adaptive"], key=lambda r: r["threshold"])
    good = [r["threshold"] for r in rows
            if r["macs_saved_fraction"] > 0 and r["accuracy"] >= ev["full_accuracy"] - within]  # fmt: skip
    return good[0] if good else None


def early_exit_report(threshold: float | None, early: Exited, labels: torch.Tensor, seconds: float, full_seconds: float,
                      costs: dict[int, tuple[int, int]]) -> dict[str, Any]:  # fmt: skip
    """What real early exit did at `threshold` (None: the full path): accuracy, mean exit depth, measured seconds
    per sample against the full path's, and the MACs per sample its exits cost (the accounting's figure for the
    same exits)."""
    n = max(len(labels), 1)
    cost = adaptive_costs(costs)
    last = max(costs)
    full_macs = costs[last][0] + costs[last][1]  # the full path: every encoder and the last exit's head
    macs = float(sum(cost[int(d)] for d in early.depth)) / n
    per, full_per = seconds / n, full_seconds / n
    return {
        "threshold": threshold,
        "accuracy": float((early.prediction == labels).float().mean()),
        "mean_depth": float(early.depth.float().mean()),
        "seconds_per_sample": per,
        "full_path_seconds_per_sample": full_per,
        "time_saved_fraction": 1.0 - per / full_per if full_per > 0 else 0.0,
        "macs_saved_fraction": 1.0 - macs / full_macs if full_macs else 0.0,
    }
