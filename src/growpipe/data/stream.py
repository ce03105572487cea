"""Images read from disk a batch at a time (bounded memory): an image folder's files or a Hugging Face
dataset's memory-mapped Arrow table. A split keeps only the row positions and labels; `tensor(idx)`
decodes, converts, resizes and standardises the rows of one batch. `prefetch` decodes the next batches in
background threads while the first block trains."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch

from growpipe.config import DataSpec
from growpipe.data.checks import Origin, column_array
from growpipe.data.images import open_fs, open_image, stack_images
from growpipe.data.moments import STATS_BATCH, Moments, standardise, unit_float
from growpipe.errors import DataError

T = TypeVar("T")


class DiskRows:
    """Rows read from disk by position: `len`, `shape` (per sample), `tensor(idx)` (a standardised float
    batch), `take`, `scan`. Images come as uint8 and are read as floats in [0, 1]; number columns as they
    are (reshaped to data.image_shape when set; integer pixels 0-255 scaled like images after `scan`)."""

    def __init__(self, source: Any, positions: np.ndarray, spec: DataSpec, name: str, shape: tuple[int, ...]):
        self.source = source  # FolderSource | ArrowSource | ColumnsSource: `read(positions, spec, name)`
        self.positions = positions
        self.spec = spec
        self.name = name
        self.shape = shape
        self.images = getattr(source, "images", None) is not None
        self.pixels = self.images  # uint8 read as floats in [0, 1]
        self.stats: dict[str, list[float]] | None = None
        self.skipped = 0

    def __len__(self) -> int:
        return len(self.positions)

    def read(self, idx: Iterable[int]) -> np.ndarray:
        """The rows `idx` (positions in this split) as stored, shaped (n, *shape)."""
        pos = self.positions[np.asarray(list(idx), dtype=np.int64)]
        arr = self.source.read(pos, self.spec, self.name)
        if self.shape and int(np.prod(arr.shape[1:])) == int(np.prod(self.shape)) and arr.ndim == 2:
            arr = arr.reshape(len(arr), *self.shape)  # number columns viewed as images (data.image_shape)
        if self.shape and arr.shape[1:] != self.shape:
            raise DataError(f"{self.name}: {self.source.where(int(pos[0]))} is {arr.shape[1:]} but the first row "
                            f"{self.shape}; {self._fix(arr.shape[1:])}")  # fmt: skip
        if self.pixels and not self.images:
            self._check_pixels(arr, pos)
        return arr

    def _fix(self, shape: tuple[int, ...]) -> str:
        if not self.images:
            return "give every row as many values"
        if shape[0] != self.shape[0]:
            return "set data.channels (1 or 3) to convert every image"
        return "set data.image_size: [height, width] to resize every image"

    def _check_pixels(self, arr: np.ndarray, pos: np.ndarray) -> None:
        """DataError naming the first row of `arr` that is not pixels 0-255, as the rows read at load were."""
        flat = arr.reshape(len(arr), -1)
        odd = (flat < 0) | (flat > 255)  # an Arrow column has one type: integers in every row, as in the sample
        if odd.any():
            i = int(np.flatnonzero(odd.any(axis=1))[0])
            raise DataError(f"{self.source.where(int(pos[i]))}: holds {flat[i][odd[i]][0]}, not a pixel 0-255 like the "
                            "rows checked at load (data.stats_rows); set data.stats_rows: all to read every row as "
                            "numbers, or fix the row")  # fmt: skip

    def tensor(self, idx: torch.Tensor | Iterable[int]) -> torch.Tensor:
        """The rows `idx` as floats (images in [0, 1]), standardised with `stats` when set."""
        return standardise(self._floats(self.read(idx.tolist() if torch.is_tensor(idx) else idx)), self.stats, 1)

    def tensor_skipping(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`tensor(idx)` without the rows that no longer decode, and the `idx` kept: each skipped row is
        counted in `skipped` and named on stderr (data.skip_bad_files for a file that went bad mid-run)."""
        try:
            return self.tensor(idx), idx
        except DataError:
            parts, kept = [], []
            for i in idx.tolist():
                try:
                    parts.append(self.tensor([i]))
                    kept.append(i)
                except DataError as e:
                    self.skipped += 1
                    print(f"warning: skipped ({self.skipped} so far, data.skip_bad_files): {e}", file=sys.stderr,
                          flush=True)  # fmt: skip
        if not parts:
            raise DataError(f"{self.name}: none of the {len(idx)} rows of a batch could be read; check the data")
        return torch.cat(parts), torch.tensor(kept, dtype=idx.dtype)

    def _floats(self, arr: np.ndarray) -> torch.Tensor:
        return unit_float(arr.astype(np.uint8, copy=False) if self.pixels else arr.astype(np.float32, copy=False))

    def take(self, idx: torch.Tensor | np.ndarray) -> DiskRows:
        """The rows `idx` as a split of their own (same source, same statistics)."""
        rows = DiskRows(self.source, self.positions[np.asarray(idx, dtype=np.int64)], self.spec, self.name, self.shape)
        rows.pixels, rows.stats = self.pixels, self.stats
        return rows

    def scan(self, rows: np.ndarray, skip_bad: bool,
             measure: bool = True) -> tuple[dict[str, list[float]] | None, list[int]]:  # fmt: skip
        """One pass over the rows `rows` (positions in this split, ascending; see `stats_sample`), read by
        data.read_workers threads: their per-channel (per-feature) mean and std (`Moments`, summed in the
        chunks used for data in memory; None unless `measure`) and those that do not decode (skipped when
        `skip_bad`, else the first raises DataError naming its file). Integer columns that hold only 0-255
        under data.image_shape are pixels, read like images."""
        as_read, as_pixels = Moments(self.shape[0]), Moments(self.shape[0])
        maybe_pixels = not self.pixels and self.spec.image_shape is not None
        bad: list[int] = []

        def read_chunk(chunk: np.ndarray) -> tuple[list[np.ndarray], list[int]]:
            try:
                return [self.read(chunk)], []
            except DataError:
                if not skip_bad:
                    raise
            parts, failed = [], []
            for i in chunk.tolist():  # find the bad ones row by row
                try:
                    parts.append(self.read([i]))
                except DataError:
                    failed.append(i)
            return parts, failed

        chunks = (rows[start : start + STATS_BATCH] for start in range(0, len(rows), STATS_BATCH))
        workers = self.spec.read_workers
        for parts, failed in prefetch(chunks, read_chunk, workers, ahead=2 * max(workers, 1)):
            bad += failed
            for x in parts:
                maybe_pixels = maybe_pixels and np.issubdtype(x.dtype, np.integer) and x.min() >= 0 and x.max() <= 255
                if measure:
                    as_read.add(self._floats(x))
                    if maybe_pixels:
                        as_pixels.add(unit_float(x.astype(np.uint8)))
        if maybe_pixels:
            self.pixels = True
        if not measure:
            return None, bad
        return (as_pixels if maybe_pixels else as_read).stats(), bad

    def fingerprint(self) -> str:
        """What identifies these rows (source and positions) for the run's dataset record."""
        return f"{self.source.fingerprint()}:{hash(self.positions.tobytes()) & 0xFFFFFFFF:08x}"


class FolderSource:
    """Image files (fsspec paths under `uri`) read by position."""

    def __init__(self, uri: str, files: list[str]):
        self.uri = uri
        self.files = files

    def read(self, positions: np.ndarray, spec: DataSpec, name: str) -> np.ndarray:
        return stack_images(self.images(positions), spec, name)

    def images(self, positions: np.ndarray) -> Iterator[tuple[str, Any]]:
        fs, _ = open_fs(self.uri)
        for p in positions.tolist():
            with fs.open(self.files[p], "rb") as fh:
                yield self.files[p], open_image(fh.read(), self.files[p])

    def where(self, position: int) -> str:
        return self.files[position]

    def fingerprint(self) -> str:
        return f"{self.uri}:{len(self.files)}"


class ArrowSource:
    """An Image column of a Hugging Face dataset (memory-mapped Arrow), read undecoded by position."""

    def __init__(self, ds: Any, column: str, origin: Origin):
        import datasets

        self.ds = ds.select_columns([column]).cast_column(column, datasets.Image(decode=False))
        self.column = column
        self.origin = origin

    def read(self, positions: np.ndarray, spec: DataSpec, name: str) -> np.ndarray:
        return stack_images(self.images(positions), spec, name)

    def images(self, positions: np.ndarray) -> Iterator[tuple[str, Any]]:
        for p, raw in zip(positions.tolist(), self.ds[positions.tolist()][self.column], strict=True):
            where = self.where(p) + (f" ({raw['path']})" if isinstance(raw, dict) and raw.get("path") else "")
            yield where, open_image(raw, where)

    def where(self, position: int) -> str:
        return self.origin.row(position)

    def fingerprint(self) -> str:
        return f"{self.origin.split}:{getattr(self.ds, '_fingerprint', '')}"


class ColumnsSource:
    """Number columns of a Hugging Face dataset (memory-mapped Arrow: parquet, csv, json): scalar columns
    and number-list columns, read by position as one (n, features) array; rows that are not all finite
    numbers of one length are refused as in memory (`column_array`)."""

    def __init__(self, ds: Any, columns: list[str], origin: Origin):
        self.ds = ds.select_columns(columns)
        self.columns = columns
        self.origin = origin

    def read(self, positions: np.ndarray, spec: DataSpec, name: str) -> np.ndarray:
        rows = self.ds[positions.tolist()]
        parts = [column_array(rows[c], c, self.origin, positions) for c in self.columns]
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def where(self, position: int) -> str:
        return self.origin.row(position)

    def fingerprint(self) -> str:
        return f"{self.origin.split}:{getattr(self.ds, '_fingerprint', '')}"


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
