"""Training batches of an epoch, for every engine: the shuffled order, micro-batches, data-parallel shards and
reading ahead.

Whichever engine reads them (the reference trainer, the pipeline's first stage, GPipe, 1F1B, a DDP worker), a
mini-batch holds the same samples, cut into the same micro-batches and augmented alike, so the engines stay
exact against the reference trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from growpipe.data.bundle import Split, batch_order
from growpipe.data.stream import prefetch
from growpipe.nn.packet import Packet


def micro_slices(n: int, micro_batches: int) -> list[np.ndarray]:
    """Positions of a batch of n samples split into at most `micro_batches` nearly equal micro-batches (one empty
    one when n is 0: a data-parallel worker's shard of a last batch smaller than the world)."""
    return np.array_split(np.arange(n), max(1, min(micro_batches, n)))


@dataclass
class Batch:
    """One mini-batch of an epoch: its place in the epoch's order, its samples in all shards, and this shard's
    micro-batches in order (one when the mini-batch is not split)."""

    index: int
    samples: int
    parts: list[Packet]


def epoch_batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    start_batch: int = 0,
    side_groups: tuple[str, ...] | list[str] = (),
    augment: bool = False,
    micro_batches: int = 1,
    shard: tuple[int, int] = (0, 1),
    read_ahead: int | None = None,
) -> Generator[Batch, None, None]:
    """The mini-batches of `batch_size` samples of an epoch in `batch_order` (which depends only on (seed, epoch)
    when shuffled), from batch `start_batch` on (an epoch resumed after a mid-epoch growth).

    `augment`: as the split augments epoch `epoch` (when it has augmentation). `shard=(rank, world)`: worker
    rank's samples of each mini-batch, every world-th from the rank-th. `micro_batches`: the shard cut into that
    many nearly equal micro-batches (`micro_slices`), each read on its own. `read_ahead`: threads reading the next
    batches while this one trains (None: the split's data.read_workers when read from disk, none in memory).
    """
    rank, world = shard
    order = batch_order(len(split), batch_size, shuffle=shuffle, seed=seed, epoch=epoch, start_batch=start_batch)

    def read(job: tuple[int, torch.Tensor]) -> Batch:
        b, idx = job
        mine = idx[rank::world]
        parts = [_packet(split, mine[s], b, side_groups, epoch if augment else None)
                 for s in micro_slices(len(mine), micro_batches)]  # fmt: skip
        return Batch(b, len(idx), parts)

    if read_ahead is None:
        read_ahead = split.x.spec.read_workers if split.streamed else 0
    yield from prefetch(order, read, read_ahead, ahead=2 * max(read_ahead, 1))


def _packet(split: Split, idx: torch.Tensor, b: int, side_groups: tuple[str, ...] | list[str],
            epoch: int | None) -> Packet:  # fmt: skip
    x, y, idx = split.read(idx, epoch)
    return Packet(x=x, y=y, side={g: split.side[g][idx] for g in side_groups}, index=b)


def iterate_batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
    side_groups: tuple[str, ...] | list[str] = (),
    start_batch: int = 0,
    augment: bool = False,
) -> Iterator[Packet]:
    """`epoch_batches` as one packet per mini-batch (no micro-batches, no shards)."""
    for batch in epoch_batches(split, batch_size, shuffle=shuffle, seed=seed, epoch=epoch, start_batch=start_batch,
                               side_groups=side_groups, augment=augment):  # fmt: skip
        yield batch.parts[0]


class BatchReader:
    """The batches of an epoch asked for one at a time by index, as a pipeline's first stage is asked for them.

    While the asks follow the epoch's order they come from one running `epoch_batches` (so its read-ahead works
    ahead, and the epoch is shuffled once); an ask for the batch just served gives it again; any other ask (a new
    epoch, a resumed or skipped-to batch) starts the epoch anew at that batch.
    """

    def __init__(self, open_epoch: Callable[[int, int], Generator[Batch, None, None]]):
        """`open_epoch(epoch, start_batch)`: the epoch's batches from `start_batch` on."""
        self._open = open_epoch
        self._epoch: int | None = None
        self._batches: Generator[Batch, None, None] | None = None
        self._last: Batch | None = None

    def get(self, epoch: int, index: int) -> Batch:
        """Batch `index` of epoch `epoch`."""
        if self._last is not None and (self._epoch, self._last.index) == (epoch, index):
            return self._last
        following = next(self._batches, None) if self._batches is not None and self._epoch == epoch else None
        if following is None or following.index != index:
            self.close()
            self._epoch, self._batches = epoch, self._open(epoch, index)
            following = next(self._batches)
        self._last = following
        return following

    def close(self) -> None:
        """Stop the running epoch (its reader threads) and forget it."""
        if self._batches is not None:
            self._batches.close()
        self._epoch, self._batches, self._last = None, None, None
