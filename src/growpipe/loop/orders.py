"""Grow requests between a caller's thread and the run loop."""

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
        self.prepared: Any = None  # the placed and built block (growpipe.loop.engine.Prepared), once prepared
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
