"""Grow requests to a running controller, and the per-stage statistics of an epoch cut by a growth."""

from __future__ import annotations

import math
import threading
from typing import Any

from growpipe.config import GrowRequest
from growpipe.errors import ShapeError
from growpipe.nn.backbones import output_shape
from growpipe.nn.specs import BlockSpec, InputInfo


class GrowOrder:
    """One grow request between the caller's thread (waiting on `done`) and the controller's run loop."""

    def __init__(self, ask: GrowRequest):
        self.ask = ask
        self.slot: Any = None  # the placed and built stage, once prepared
        self.answer: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def succeed(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.done.set()

    def fail(self, error: str) -> None:
        self.error = error
        self.done.set()


def check_input_size(ask: GrowRequest, info: InputInfo, last: BlockSpec) -> None:
    """Raise ShapeError when the request names an input size the last block does not produce."""
    if ask.input_size is None:
        return
    shape, _ = output_shape(last.encoder, info)
    features = math.prod(shape)
    if ask.input_size != features:
        raise ShapeError(
            f"grow request: input_size {ask.input_size} does not match block {last.index}'s output "
            f"{tuple(shape)} = {features} features; drop input_size or use {features}"
        )


def merge_stage_stats(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One stats dict per stage from the pieces of an epoch (a growth pauses it; new stages join late)."""
    by_stage: dict[int, list[dict[str, Any]]] = {}
    for part in parts:
        for s in part:
            by_stage.setdefault(s["stage"], []).append(s)
    merged = []
    for stage in sorted(by_stage):
        pieces = by_stage[stage]
        batches = sum(p["batches"] for p in pieces)
        loss_keys = {k for p in pieces for k in p["loss"]}
        hops = sorted(p["hop_ms_median"] for p in pieces if p["hop_ms_median"] is not None)
        merged.append(
            {
                **pieces[-1],
                "samples": sum(p["samples"] for p in pieces),
                "batches": batches,
                "busy_s": sum(p["busy_s"] for p in pieces),
                "wait_input_s": sum(p["wait_input_s"] for p in pieces),
                "blocked_s": sum(p["blocked_s"] for p in pieces),
                "hop_ms_median": hops[len(hops) // 2] if hops else None,
                "hops": sum(p["hops"] for p in pieces),
                "max_inflight": max(p["max_inflight"] for p in pieces),
                "loss": {k: _mean_over(pieces, k) for k in loss_keys},
                "events": [e for p in pieces for e in p["events"]],
            }
        )
    return merged


def _mean_over(pieces: list[dict[str, Any]], key: str) -> float:
    """A loss averaged over the batches of the pieces that trained (a frozen piece reports none)."""
    having = [p for p in pieces if key in p["loss"]]
    return sum(p["loss"][key] * p["batches"] for p in having) / max(sum(p["batches"] for p in having), 1)
