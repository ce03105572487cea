"""A prediction request as the HTTP API takes it: checked field by field, each problem one line naming the
field (the server answers it with HTTP 400 and keeps serving)."""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from growpipe.errors import InputError
from growpipe.serve.predictor import check_options

FIELDS = ("inputs", "threshold", "confidence", "side")
MAX_ROWS = 65536
"""Rows one request may carry (a larger batch is split by the client)."""


@dataclass(frozen=True)
class PredictRequest:
    """Inputs (a batch of rows), the exit threshold (1.0: the full path), the confidence kind, side features."""

    inputs: Any
    threshold: float = 1.0
    confidence: str = "max_prob"
    side: dict[str, Any] = field(default_factory=dict)

    @property
    def options(self) -> tuple[float, str]:
        return (self.threshold, self.confidence)


def parse_body(body: bytes | str) -> PredictRequest:
    """The JSON body of POST /predict: {"inputs": [[...], ...], "threshold": 0.9, "confidence": "max_prob"}."""
    try:
        data = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f'body: not valid JSON ({e}); send {{"inputs": [[...], ...]}}') from None
    except RecursionError:
        raise InputError('body: lists or objects nested too deep to read; send {"inputs": [[...], ...]}, a list '
                         "of rows of numbers") from None  # fmt: skip
    return parse_request(data)


def encode_npy(rows: np.ndarray) -> dict[str, str]:
    """Rows as the compact form of `inputs`: {"npy_base64": base64 of the array saved as a .npy file}."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(rows), allow_pickle=False)
    return {"npy_base64": base64.b64encode(buf.getvalue()).decode()}


def decode_npy(inputs: dict[str, Any]) -> np.ndarray:
    """The array `encode_npy` wrote; InputError naming the field when it is something else."""
    if set(inputs) != {"npy_base64"} or not isinstance(inputs["npy_base64"], str):
        raise InputError('inputs: an object must be {"npy_base64": "<base64 of a .npy array>"}; or send a list of rows')
    try:
        return np.load(io.BytesIO(base64.b64decode(inputs["npy_base64"], validate=True)), allow_pickle=False)
    except (ValueError, OSError, binascii.Error) as e:
        raise InputError(f"inputs.npy_base64: not a base64 .npy array ({str(e)[:120]})") from None


def parse_request(data: Any) -> PredictRequest:
    """A request from its fields (the JSON body or a Python handle call's dict)."""
    if not isinstance(data, dict):
        raise InputError(f'body: a JSON {type(data).__name__}, not an object; send {{"inputs": [[...], ...]}}')
    if unknown := sorted(set(data) - set(FIELDS)):
        raise InputError(f"{unknown[0]}: unknown field; a request has {', '.join(FIELDS)}")
    if "inputs" not in data:
        raise InputError('inputs: missing; send {"inputs": [[...], ...]} (one row per sample)')
    inputs = data["inputs"]
    if isinstance(inputs, dict):
        inputs = decode_npy(inputs)
    if not isinstance(inputs, list | np.ndarray) or len(inputs) == 0:  # a handle call may pass an array
        raise InputError("inputs: must be a non-empty list of rows (one per sample)")
    if len(inputs) > MAX_ROWS:
        raise InputError(f"inputs: {len(inputs)} rows; at most {MAX_ROWS} per request, split the batch")
    side = data.get("side") or {}
    if not isinstance(side, dict):
        raise InputError("side: must be an object mapping a feature group to its rows")
    request = PredictRequest(inputs, data.get("threshold", 1.0), data.get("confidence", "max_prob"), side)
    check_options(request.threshold, request.confidence)
    return request
