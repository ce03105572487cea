"""The one training-batch iterator: order, micro-batches, shards, reading ahead, and a stage's reader."""

import torch

from growpipe.data.batches import BatchReader, epoch_batches, iterate_batches, micro_slices
from growpipe.data.bundle import Split, batch_order

N = 50


def _split() -> Split:
    """Sample i has input row i (so a packet says which samples it holds) and an augmentation that marks the
    epoch into every sample's input."""
    x = torch.arange(N, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
    return Split(x, torch.arange(N), {"g": x[:, :1] * -1}, augment=lambda x, idx, epoch: x + 1000 * epoch)


def _rows(p) -> list[int]:
    return p.y.tolist()


def test_micro_batches_and_shards_cut_each_mini_batch_of_the_epoch_order():
    split = _split()
    order = dict(batch_order(N, 16, shuffle=True, seed=4, epoch=2, start_batch=1))
    for rank in range(3):
        got = list(epoch_batches(split, 16, seed=4, epoch=2, start_batch=1, augment=True, side_groups=("g",),
                                 micro_batches=2, shard=(rank, 3)))  # fmt: skip
        assert [b.index for b in got] == [1, 2, 3] and [b.samples for b in got] == [16, 16, 2]
        for b in got:
            mine = order[b.index][rank::3].tolist()
            assert [_rows(p) for p in b.parts] == [[mine[i] for i in s] for s in micro_slices(len(mine), 2)]
            for p in b.parts:
                assert p.index == b.index and torch.equal(p.x[:, 0], p.y + 2000.0)  # augmented as epoch 2
                assert torch.equal(p.side["g"][:, 0], -p.y.float())  # side groups: not augmented


def test_one_packet_per_batch_and_reading_ahead_change_nothing():
    split = _split()
    plain = list(iterate_batches(split, 8, shuffle=True, seed=1, epoch=3, start_batch=2))
    ahead = list(epoch_batches(split, 8, shuffle=True, seed=1, epoch=3, start_batch=2, read_ahead=2))
    assert [p.index for p in plain] == [b.index for b in ahead] == list(range(2, 7))
    assert all(len(b.parts) == 1 and torch.equal(b.parts[0].x, p.x) for p, b in zip(plain, ahead, strict=True))
    assert torch.equal(plain[0].x[:, 0], plain[0].y.float())  # augment=False: as read


def test_a_stage_reader_follows_one_epoch_and_starts_anew_out_of_order():
    split, opened = _split(), []

    def open_epoch(epoch: int, start: int):
        opened.append((epoch, start))
        return epoch_batches(split, 8, seed=0, epoch=epoch, start_batch=start, micro_batches=3)

    reader = BatchReader(open_epoch)
    fresh = {(e, b.index): b for e in (0, 1) for b in epoch_batches(split, 8, seed=0, epoch=e, micro_batches=3)}
    asks = [(0, 0), (0, 0), (0, 1), (0, 2), (0, 5), (0, 6), (0, 1), (1, 0), (1, 1)]
    for epoch, index in asks:
        got = reader.get(epoch, index)
        want = fresh[(epoch, index)]
        assert got.index == index and [_rows(p) for p in got.parts] == [_rows(p) for p in want.parts]
    assert opened == [(0, 0), (0, 5), (0, 1), (1, 0)]  # in order: one epoch; skipped, back, new epoch: anew
    reader.close()
    assert reader.get(1, 1).index == 1 and opened[-1] == (1, 1)
