"""A trained net loaded for inference: raw inputs in, early-exit answers out.

The one inference path that `growpipe serve` (every replica and block group), the MLflow model and
`growpipe evaluate`'s early exit share: inputs as the data reads them (images as floats in [0, 1], tables as
their numbers, token ids for text), standardised with the training split's statistics (data.normalize), then
real early exit (`GrowableNet.early_exit`): a sample `threshold` confident at an exit leaves there and the
blocks above never compute it; threshold 1.0 takes the full path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from growpipe.checkpoint import load_net, open_checkpoint
from growpipe.data.moments import standardise
from growpipe.errors import InputError
from growpipe.nn.backbones import FEATURE_FAMILIES
from growpipe.nn.inference import Exited
from growpipe.nn.packet import Packet
from growpipe.nn.specs import InputInfo

BATCH = 512
"""Rows per forward pass: a large request is computed in slices of this many."""

MAX_INPUT = 1e6
"""Largest magnitude of an input value, as the net sees it (standardised with the training statistics when the
net has them, else as given): a million standard deviations off is no sample of the data, and far beyond it
float32 arithmetic overflows (a LayerNorm squares its input; 1e20 already gives non-finite confidences)."""

CONFIDENCE_KINDS = ("max_prob", "entropy")


@dataclass(frozen=True)
class NetVersion:
    """Which net answers: the run, its checkpoint, how far it trained and how many blocks it has."""

    run: str
    checkpoint: str
    epoch: int
    blocks: int
    written_at: float = 0.0

    @classmethod
    def of(cls, checkpoint_dir: str | Path, manifest: dict[str, Any]) -> NetVersion:
        return cls(str(manifest.get("run") or ""), str(checkpoint_dir).rstrip("/").rpartition("/")[2],
                   int(manifest.get("epoch", 0)), len(manifest.get("topology", [])),
                   float(manifest.get("written_at", 0.0)))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "checkpoint": self.checkpoint, "epoch": self.epoch, "blocks": self.blocks}


@dataclass
class Predictor:
    """A net's inputs (shape, dtype, side groups, statistics), its version and, unless its blocks are served
    as groups elsewhere (`front`), the net itself; `predict` answers a batch of raw inputs."""

    info: Any
    side_groups: tuple[str, ...]
    version: NetVersion
    net: Any = None

    @classmethod
    def load(cls, checkpoint: str | Path, device: torch.device | str = "cpu") -> Predictor:
        """Load any checkpoint directory (a run folder: its newest complete checkpoint), hash-checked."""
        _, target, _ = open_checkpoint(checkpoint)
        net, manifest = load_net(target, device)
        return cls(net.info, net.side_groups(), NetVersion.of(target, manifest), net)

    @classmethod
    def front(cls, checkpoint: str | Path) -> Predictor:
        """The inputs and version of a checkpoint's net, from its manifest alone (no block is loaded)."""
        _, target, manifest = open_checkpoint(checkpoint)
        encoders = [d["encoder"] for d in manifest["topology"]]
        groups = tuple(e["params"]["group"] for e in encoders if e["family"] in FEATURE_FAMILIES)
        return cls(InputInfo.from_dict(manifest["input"]), groups, NetVersion.of(target, manifest))

    def inputs(self, x: Any, side: dict[str, Any] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Raw inputs as tensors of the net's input shape and dtype, or InputError naming the field."""
        info = self.info
        feature = _as_rows("inputs", x, tuple(info.shape), info.dtype, info.normalize)
        if info.dtype == "long" and info.vocab_size and len(feature) and int(feature.max()) >= info.vocab_size:
            raise InputError(f"inputs: token id {int(feature.max())} is outside the vocabulary (ids 0-"
                             f"{info.vocab_size - 1})")  # fmt: skip
        groups = {}
        wanted = self.side_groups
        side = side or {}
        if unknown := sorted(set(side) - set(wanted)):
            raise InputError(f"side: unknown feature group(s) {unknown}; this net reads {list(wanted) or 'none'}")
        for name in wanted:
            if name not in side:
                raise InputError(f"side.{name}: missing; this net's blocks read feature group(s) {list(wanted)}")
            shape, dtype = info.side[name]
            groups[name] = _as_rows(f"side.{name}", side[name], tuple(shape), dtype)
            if len(groups[name]) != len(feature):
                raise InputError(f"side.{name}: {len(groups[name])} rows for {len(feature)} inputs; give one each")
        return feature, groups

    def predict(self, x: Any, threshold: float = 1.0, confidence: str = "max_prob",
                side: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Per input row: predicted class, exit depth (1-based), confidence; and the net's version."""
        check_options(threshold, confidence)
        feature, groups = self.inputs(x, side)
        return self.answers(self.early_exit(feature, groups, threshold, confidence), [len(feature)])[0]

    def answers(self, exited: Exited, sizes: list[int]) -> list[dict[str, Any]]:
        """The answers of consecutive requests of `sizes` rows each, cut from one early-exit pass."""
        out, start = [], 0
        for n in sizes:
            cut = slice(start, start + n)
            out.append({"prediction": exited.prediction[cut].tolist(), "exit_depth": exited.depth[cut].tolist(),
                        "confidence": [round(float(c), 6) for c in exited.confidence[cut]],
                        "version": self.version.to_dict()})  # fmt: skip
            start += n
        return out

    def early_exit(self, x: torch.Tensor, side: dict[str, torch.Tensor], threshold: float, confidence: str) -> Exited:
        """Standardise and run real early exit over `x` in slices of BATCH rows."""
        x = self.standardised(x)
        full_path = threshold >= 1.0  # a saturated softmax reaches 1.0: 1.0 must mean the full path
        rows = torch.arange(len(x))
        parts = []
        for i in range(0, len(x), BATCH):
            cut = slice(i, i + BATCH)
            p = Packet(x=x[cut], side={k: v[cut] for k, v in side.items()}, rows=rows[cut])
            parts.append(self.net.early_exit(p, None if full_path else threshold, confidence))
        return Exited.cat(parts)

    def standardised(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs standardised with the training split's statistics (data.normalize), as the net saw them."""
        return standardise(x, self.info.normalize, 1) if self.info.normalize else x


def check_options(threshold: Any, confidence: Any) -> None:
    """The request's options, or InputError naming the one that is wrong."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        shown = repr(threshold) if len(repr(threshold)) <= 40 else repr(threshold)[:37] + "..."
        raise InputError(f"threshold: {shown} is not a number in [0, 1] (1.0: the full path)")
    if confidence not in CONFIDENCE_KINDS:
        raise InputError(f"confidence: {confidence!r} is not one of {', '.join(CONFIDENCE_KINDS)}")


def _as_rows(field_name: str, x: Any, shape: tuple[int, ...], dtype: str,
             normalize: dict[str, list[float]] | None = None) -> torch.Tensor:  # fmt: skip
    """A batch of rows of `shape` (each row given in that shape or flat), finite and within MAX_INPUT (once
    standardised with `normalize`), of `dtype`; never booleans (JSON's true is no number)."""
    if isinstance(x, list | tuple):
        depth, where = _scan(x, len(shape) + 1)
        if where is not None:
            raise InputError(f"{field_name}{where}: a boolean (true/false), not a number; give each row as "
                             f"{_shape_text(shape)}")  # fmt: skip
        if depth > len(shape) + 1:
            raise InputError(f"{field_name}: lists nested more than {len(shape) + 1} deep; give a list of rows, "
                             f"each {_shape_text(shape)}")  # fmt: skip
    try:
        arr = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x)
    except (ValueError, TypeError, RecursionError):
        raise InputError(f"{field_name}: rows of unequal length; each row is {_shape_text(shape)}") from None
    if arr.dtype == bool:
        raise InputError(f"{field_name}: booleans (true/false), not numbers; give each row as {_shape_text(shape)}")
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"{field_name}: not numbers (dtype {arr.dtype}); give each row as {_shape_text(shape)}")
    size = int(np.prod(shape))
    if arr.ndim == 0 or arr.size % max(size, 1) or (arr.shape[1:] != shape and int(np.prod(arr.shape[1:])) != size):
        raise InputError(f"{field_name}: shape {list(arr.shape)} is not a batch of rows of {_shape_text(shape)}")
    arr = arr.reshape(-1, *shape)
    if dtype == "long":
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
            raise InputError(f"{field_name}: token ids must be whole numbers")
        if arr.size and arr.min() < 0:
            raise InputError(f"{field_name}: token id {int(arr.min())} is negative")
        return torch.as_tensor(arr.astype(np.int64))
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise InputError(f"{field_name}: holds NaN or infinite values; give finite numbers")
    _check_magnitude(field_name, arr, normalize)
    return torch.as_tensor(arr.astype(np.float32))


def _check_magnitude(field_name: str, arr: np.ndarray, normalize: dict[str, list[float]] | None) -> None:
    """InputError naming the row of the first value (standardised with `normalize`) beyond MAX_INPUT."""
    z = arr.astype(np.float64)
    if normalize is not None:
        channels = (1, -1, *([1] * (arr.ndim - 2)))
        with np.errstate(over="ignore"):  # 1e308 / 0.3: inf, beyond the bound all the same
            z = (z - np.reshape(normalize["mean"], channels)) / np.reshape(normalize["std"], channels)
    far = np.abs(z) > MAX_INPUT
    if not far.any():
        return
    at = np.unravel_index(int(np.argmax(far)), arr.shape)
    value, scaled = arr[at], z[at]
    how = f", {abs(scaled):.3g} training standard deviations from its mean" if normalize is not None else ""
    raise InputError(f"{field_name}: row {at[0]} holds {value:.6g}{how}; the net takes values within {MAX_INPUT:g} "
                     f"{'standard deviations' if normalize is not None else 'of 0'} (far beyond, its arithmetic "
                     "overflows); give values on the scale of its training data")  # fmt: skip


def _scan(x: list | tuple, most: int) -> tuple[int, str | None]:
    """How deep the lists of `x` nest (counted up to most + 1) and where its first boolean is (e.g. '[0][3]'),
    level by level: the numbers are only looked at by type, in C."""
    lists: list[Any] = [x]
    for depth in range(1, most + 2):
        types = set(map(type, itertools.chain.from_iterable(lists)))
        if bool in types:
            return depth, _bool_path(x)
        if not types & {list, tuple}:
            return depth, None
        lists = [v for v in itertools.chain.from_iterable(lists) if isinstance(v, list | tuple)]
    return most + 2, None


def _bool_path(x: list | tuple) -> str:
    """The index path of the first boolean in nested lists `x` that hold one, e.g. '[0][3]'."""
    path, node = "", x
    while True:
        for i, v in enumerate(node):
            if type(v) is bool:
                return f"{path}[{i}]"
            if isinstance(v, list | tuple) and _scan(v, 64)[1] is not None:
                path, node = f"{path}[{i}]", v
                break
        else:
            return path


def _shape_text(shape: tuple[int, ...]) -> str:
    size = int(np.prod(shape))
    return f"{list(shape)} ({size} numbers)" if len(shape) > 1 else f"{size} numbers"
