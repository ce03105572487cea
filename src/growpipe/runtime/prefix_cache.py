"""The frozen-prefix cache: every training sample's output of the frozen blocks, computed once.

Once the blocks below a new block are frozen (eval mode, no dropout, no augmentation in growpipe's
loaders), their output for a sample never changes. The stage that trains the new block keeps those
outputs, in sample order, and streams its own epochs from them: the frozen stages stop computing.
Memory is bounded: past `max_mb` the cache lives in memory-mapped files on local disk (or is refused).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from growpipe.data.bundle import batch_order
from growpipe.errors import StageError
from growpipe.nn.packet import Packet

_FIELDS = ("x", "y", "t", "mask")


class PrefixCache:
    """`n` samples' packets from the frozen prefix, filled in order by `append`, read back in batches."""

    def __init__(self, n: int, max_mb: float, spill: bool, spill_dir: str | None = None):
        self.n = n
        self.max_mb = max_mb
        self.spill = spill
        self.spill_root = spill_dir
        self.filled = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.dir: Path | None = None

    @property
    def complete(self) -> bool:
        return self.filled == self.n

    @property
    def on_disk(self) -> bool:
        return self.dir is not None

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for t in self.tensors.values())

    def append(self, p: Packet) -> None:
        """Store the next `p.batch_size` samples (packets arrive in sample order)."""
        rows = _rows(p)
        if not self.tensors:
            self._allocate(rows)
        end = self.filled + p.batch_size
        if end > self.n or set(rows) != set(self.tensors):
            raise StageError(f"prefix cache: packet {p.index} does not fit ({end} > {self.n} samples or new fields)")
        for k, v in rows.items():
            self.tensors[k][self.filled : end] = v.cpu()
        self.filled = end

    def packets(self, batch_size: int, seed: int, epoch: int, start_batch: int = 0) -> Iterator[Packet]:
        """The epoch's batches, in the same order the data loader would give (`batch_order`)."""
        if not self.complete:
            raise StageError(f"prefix cache holds {self.filled} of {self.n} samples; the cache pass did not finish")
        for b, idx in batch_order(self.n, batch_size, shuffle=True, seed=seed, epoch=epoch, start_batch=start_batch):
            fields = {k: self.tensors[k][idx] for k in _FIELDS if k in self.tensors}
            side = {k.removeprefix("side/"): v[idx] for k, v in self.tensors.items() if k.startswith("side/")}
            yield Packet(**fields, side=side, index=b)

    def close(self) -> None:
        """Forget the samples (and delete the files when on disk)."""
        self.tensors = {}
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def describe(self) -> str:
        where = f"on disk in {self.dir}" if self.dir else "in memory"
        return f"{self.n} samples, {self.nbytes / 2**20:.1f} MB {where}"

    def _allocate(self, rows: dict[str, torch.Tensor]) -> None:
        per_sample = sum(v.element_size() * math.prod(v.shape[1:]) for v in rows.values())
        need_mb = per_sample * self.n / 2**20
        if need_mb <= self.max_mb:
            self.tensors = {k: torch.empty((self.n, *v.shape[1:]), dtype=v.dtype) for k, v in rows.items()}
            return
        if not self.spill:
            raise StageError(
                f"the frozen-prefix cache needs {need_mb:.3g} MB, more than grow.cache.max_memory_mb="
                f"{self.max_mb:g}; raise it, or set grow.cache.spill: true to keep it on local disk"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="growpipe-cache-", dir=self.spill_root))
        for k, v in rows.items():
            bf16 = v.dtype == torch.bfloat16  # numpy has no bfloat16: its bits are kept as int16
            arr = np.lib.format.open_memmap(
                self.dir / f"{k.replace('/', '_')}.npy",
                mode="w+",
                dtype=np.int16 if bf16 else v.numpy().dtype,
                shape=(self.n, *v.shape[1:]),
            )
            self.tensors[k] = torch.from_numpy(arr).view(torch.bfloat16) if bf16 else torch.from_numpy(arr)


def _rows(p: Packet) -> dict[str, torch.Tensor]:
    rows = {k: getattr(p, k) for k in _FIELDS if getattr(p, k) is not None}
    rows.update({f"side/{k}": v for k, v in p.side.items()})
    return rows
