"""Pixels to floats and per-channel standardisation, one way for data in memory and data read from disk, so
a dataset gives the same inputs (bit for bit) whichever path reads it. Statistics come from the rows a run
trains on (after data.limit_train and the validation hold-out): a seeded sample of data.stats_rows of them,
the same positions whichever format holds the rows, or all of them."""

from __future__ import annotations

import numpy as np
import torch

STATS_BATCH = 64  # rows per float64 partial sum: the same chunks in memory and on disk give the same sums


def unit_float(x: np.ndarray) -> torch.Tensor:
    """uint8 pixels as float32 in [0, 1]; anything else as float32 unchanged."""
    pixels = np.asarray(x).dtype == np.uint8
    a = np.ascontiguousarray(x, dtype=np.float32)
    if not a.flags.writeable:  # Arrow buffers and memory maps: torch must not share a read-only array
        a = a.copy()
    t = torch.from_numpy(a)
    return t.div_(255.0) if pixels else t


def channel_axes(ndim: int) -> tuple[int, ...]:
    """The axes to reduce over for per-channel (images: N, C, H, W) or per-feature (N, F) statistics."""
    return (0, *range(2, ndim))


class Moments:
    """Running float64 sums of the float32 inputs, per channel; added a chunk of rows at a time."""

    def __init__(self, channels: int):
        self.total = np.zeros(channels)
        self.squares = np.zeros(channels)
        self.count = 0
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        """Add a float32 batch (N, C, ...) to the sums."""
        d = x.numpy().astype(np.float64)
        axes = channel_axes(d.ndim)
        self.total += d.sum(axis=axes)
        self.squares += np.square(d).sum(axis=axes)
        self.count += d.size // d.shape[1]
        self.rows += d.shape[0]

    def stats(self) -> dict[str, list[float]]:
        """Mean and sample standard deviation (at least 1e-6; 1 from a single row) per channel."""
        n = max(self.count, 1)
        mean = self.total / n
        var = np.maximum(self.squares / n - mean**2, 0.0) * n / max(n - 1, 1)
        std = np.maximum(np.sqrt(var), 1e-6) if self.rows > 1 else np.ones_like(mean)
        return {"mean": mean.tolist(), "std": std.tolist()}


def stats_sample(rows: int, stats_rows: int | str, seed: int) -> np.ndarray:
    """The positions (ascending) of the rows read at load out of `rows`: every one when data.stats_rows is all
    or not below `rows`, else that many drawn without replacement from `seed` (the run's), so every format
    holding the rows in the same order picks the same ones."""
    if stats_rows == "all" or int(stats_rows) >= rows:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, int(stats_rows), replace=False))


def tensor_stats(x: torch.Tensor, rows: np.ndarray) -> dict[str, list[float]]:
    """Per-channel statistics of the rows `rows` of a float32 tensor held in memory, summed in the chunks a
    disk scan uses."""
    m = Moments(x.shape[1])
    for start in range(0, len(rows), STATS_BATCH):
        m.add(x[torch.from_numpy(rows[start : start + STATS_BATCH])])
    return m.stats()


def standardise(x: torch.Tensor, stats: dict[str, list[float]] | None, axis: int) -> torch.Tensor:
    """(x - mean) / std along `axis` (the channel or feature axis); x unchanged without stats."""
    if stats is None:
        return x
    mean, std = _along(stats, x.dim(), axis, x.dtype)
    return (x - mean) / std


def unstandardise(x: torch.Tensor, stats: dict[str, list[float]] | None, axis: int) -> torch.Tensor:
    """Undo `standardise`: x * std + mean along `axis`, computed in float64; x unchanged without stats."""
    if stats is None:
        return x
    mean, std = _along(stats, x.dim(), axis, torch.float64)
    return (x.double() * std + mean).to(x.dtype)


def _along(stats: dict[str, list[float]], ndim: int, axis: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The mean and std of `stats` shaped to broadcast along `axis` of an `ndim`-dimensional tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return tuple(torch.tensor(stats[k], dtype=dtype).reshape(shape) for k in ("mean", "std"))
