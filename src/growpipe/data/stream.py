"""Images read from disk a batch at a time (bounded memory): an image folder's files or a Hugging Face
dataset's memory-mapped Arrow table. A split keeps only the row positions and labels; `tensor(idx)`
decodes, converts, resizes and standardises the rows of one batch. `prefetch` decodes the next batches in
background threads while the first block trains."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch

from growpipe.config import DataSpec
from growpipe.data.images import open_fs, open_image, stack_images
from growpipe.errors import DataError

T = TypeVar("T")
STATS_BATCH = 64


class ImageRows:
    """Rows of images on disk: `len`, `shape` (C, H, W), `tensor(idx)` (standardised float batch), `take`."""

    def __init__(self, source: Any, positions: np.ndarray, spec: DataSpec, name: str, shape: tuple[int, ...]):
        self.source = source  # FolderSource | ArrowSource: reads raw images by position
        self.positions = positions
        self.spec = spec
        self.name = name
        self.shape = shape
        self.stats: dict[str, list[float]] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def read(self, idx: Iterable[int]) -> np.ndarray:
        """(n, C, H, W) uint8 of the rows `idx` (positions in this split)."""
        pos = self.positions[np.asarray(list(idx), dtype=np.int64)]
        arr = stack_images(self.source.images(pos), self.spec, self.name)
        if self.shape and arr.shape[1:] != self.shape:
            raise DataError(f"{self.name}: the images at rows {pos[:3].tolist()}... are {arr.shape[1:]} but "
                            f"earlier ones {self.shape} (C, H, W); set data.image_size and data.channels")  # fmt: skip
        return arr

    def tensor(self, idx: torch.Tensor | Iterable[int]) -> torch.Tensor:
        """The rows `idx` as floats in [0, 1], standardised with `stats` when set."""
        from growpipe.data.sources import standardise

        x = torch.from_numpy(self.read(idx.tolist() if torch.is_tensor(idx) else idx)).float().div_(255.0)
        return standardise(x, self.stats, 1)

    def take(self, idx: torch.Tensor | np.ndarray) -> ImageRows:
        """The rows `idx` as a split of their own (same source, same statistics)."""
        rows = ImageRows(self.source, self.positions[np.asarray(idx, dtype=np.int64)], self.spec, self.name, self.shape)
        rows.stats = self.stats
        return rows

    def scan(self, skip_bad: bool) -> tuple[dict[str, list[float]], list[int]]:
        """One pass over every row: per-channel mean and std (float64 sums) and the rows that do not decode
        (skipped when `skip_bad`, else the first raises DataError naming its file)."""
        total = np.zeros(self.shape[0], dtype=np.int64)  # exact integer sums of the uint8 pixels
        squares = np.zeros(self.shape[0], dtype=np.int64)
        count = 0
        bad: list[int] = []
        for start in range(0, len(self), STATS_BATCH):
            chunk = range(start, min(start + STATS_BATCH, len(self)))
            try:
                parts = [self.read(chunk)]
            except DataError:
                if not skip_bad:
                    raise
                parts = []
                for i in chunk:  # find the bad ones row by row
                    try:
                        parts.append(self.read([i]))
                    except DataError:
                        bad.append(i)
            for x in parts:
                total += x.sum(axis=(0, 2, 3), dtype=np.int64)
                squares += np.square(x, dtype=np.int32).sum(axis=(0, 2, 3), dtype=np.int64)
                count += x.shape[0] * x.shape[2] * x.shape[3]
        total, squares = total / 255.0, squares / 255.0**2
        mean = total / max(count, 1)
        var = np.maximum(squares / max(count, 1) - mean**2, 0.0) * count / max(count - 1, 1)
        return {"mean": mean.tolist(), "std": np.maximum(np.sqrt(var), 1e-6).tolist()}, bad

    def fingerprint(self) -> str:
        """What identifies these rows (source and positions) for the run's dataset record."""
        return f"{self.source.fingerprint()}:{hash(self.positions.tobytes()) & 0xFFFFFFFF:08x}"


class FolderSource:
    """Image files (fsspec paths under `uri`) read by position."""

    def __init__(self, uri: str, files: list[str]):
        self.uri = uri
        self.files = files

    def images(self, positions: np.ndarray) -> Iterator[tuple[str, Any]]:
        fs, _ = open_fs(self.uri)
        for p in positions.tolist():
            with fs.open(self.files[p], "rb") as fh:
                yield self.files[p], open_image(fh.read(), self.files[p])

    def fingerprint(self) -> str:
        return f"{self.uri}:{len(self.files)}"


class ArrowSource:
    """An Image column of a Hugging Face dataset (memory-mapped Arrow), read undecoded by position."""

    def __init__(self, ds: Any, column: str, split: str):
        import datasets

        self.ds = ds.select_columns([column]).cast_column(column, datasets.Image(decode=False))
        self.column = column
        self.split = split

    def images(self, positions: np.ndarray) -> Iterator[tuple[str, Any]]:
        for p, raw in zip(positions.tolist(), self.ds[positions.tolist()][self.column], strict=True):
            where = f"{self.split} row {p}" + (f" ({raw['path']})" if isinstance(raw, dict) and raw.get("path") else "")
            yield where, open_image(raw, where)

    def fingerprint(self) -> str:
        return f"{self.split}:{getattr(self.ds, '_fingerprint', '')}"


def prefetch(jobs: Iterable[T], work: Callable[[T], Any], workers: int, ahead: int) -> Iterator[Any]:
    """work(job) for each job in order, computed by `workers` threads up to `ahead` jobs in advance."""
    if workers <= 0:
        yield from (work(j) for j in jobs)
        return
    pending: deque[Future[Any]] = deque()
    it = iter(jobs)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="growpipe-reader") as pool:
        try:
            for job in it:
                pending.append(pool.submit(work, job))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
