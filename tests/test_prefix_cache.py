"""The frozen-prefix cache on its own: order, memory bound, spill to disk, refusal."""

import pytest
import torch

from growpipe.data.batches import iterate_batches
from growpipe.data.bundle import Split
from growpipe.errors import StageError
from growpipe.nn.packet import Packet
from growpipe.runtime.prefix_cache import PrefixCache

N, D = 100, 6


def _split() -> Split:
    g = torch.Generator().manual_seed(0)
    return Split(torch.randn(N, D, generator=g), torch.arange(N) % 10, {"chunk1": torch.randn(N, 3, generator=g)})


def _fill(cache: PrefixCache, split: Split) -> None:
    for p in iterate_batches(split, 32, shuffle=False, side_groups=("chunk1",)):
        cache.append(Packet(x=p.x * 2, y=p.y, t=p.x[:, :2], side=p.side, index=p.index))


@pytest.mark.parametrize("max_mb", [64, 0.001])  # in memory / spilled to disk
def test_cache_yields_the_loader_order_of_every_epoch(max_mb, tmp_path):
    split = _split()
    cache = PrefixCache(N, max_mb=max_mb, spill=True, spill_dir=str(tmp_path))
    _fill(cache, split)
    assert cache.complete and cache.on_disk == (max_mb < 1)
    for epoch in (1, 2):
        want = list(iterate_batches(split, 16, shuffle=True, seed=3, epoch=epoch, side_groups=("chunk1",)))
        got = list(cache.packets(16, seed=3, epoch=epoch))
        assert [p.index for p in got] == [p.index for p in want]
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.x, b.x * 2) and torch.equal(a.y, b.y) and torch.equal(a.t, b.x[:, :2])
            assert torch.equal(a.side["chunk1"], b.side["chunk1"])
    resumed = list(cache.packets(16, seed=3, epoch=1, start_batch=5))
    assert [p.index for p in resumed] == [5, 6]
    files = list(tmp_path.iterdir())
    cache.close()
    assert all(not f.exists() for f in files)


def test_cache_over_its_bound_without_spill_is_refused_before_allocating():
    cache = PrefixCache(10**9, max_mb=1, spill=False)
    with pytest.raises(StageError, match=r"needs 3.82e\+06 MB, more than grow.cache.max_memory_mb=1; raise it"):
        cache.append(Packet(x=torch.zeros(4, 1000), y=torch.zeros(4, dtype=torch.long)))


def test_an_unfinished_cache_cannot_be_read():
    cache = PrefixCache(N, max_mb=64, spill=False)
    cache.append(Packet(x=torch.zeros(4, D), y=torch.zeros(4, dtype=torch.long)))
    with pytest.raises(StageError, match="holds 4 of 100 samples"):
        next(cache.packets(16, seed=0, epoch=1))
