"""Multiply-accumulate counts per sample, measured with forward hooks on a dummy batch."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence


def _linear(m: nn.Linear, inp, out) -> int:
    return out.numel() * m.in_features


def _conv(m: nn.Conv2d, inp, out) -> int:
    kh, kw = m.kernel_size
    return out.numel() * (m.in_channels // m.groups) * kh * kw


def _lstm(m: nn.LSTM, inp, out) -> int:
    x = inp[0]
    tokens = x.data.shape[0] if isinstance(x, PackedSequence) else x.shape[0] * x.shape[1]
    dirs = 2 if m.bidirectional else 1
    total, in_size = 0, m.input_size
    for _ in range(m.num_layers):
        total += 4 * m.hidden_size * (in_size + m.hidden_size)
        in_size = m.hidden_size * dirs
    return tokens * dirs * total


def _mha(m: nn.MultiheadAttention, inp, out) -> int:
    q = inp[0]
    b, t, e = q.shape if m.batch_first else (q.shape[1], q.shape[0], q.shape[2])
    projections = 4 * b * t * e * e  # q, k, v and output projections
    attention = 2 * b * t * t * e  # scores and weighted sum
    return projections + attention


_COUNTERS: dict[type, Callable[..., int]] = {
    nn.Linear: _linear,
    nn.Conv2d: _conv,
    nn.LSTM: _lstm,
    nn.MultiheadAttention: _mha,
}


def count_macs(module: nn.Module, run: Callable[[nn.Module], object], batch: int) -> int:
    """MACs per sample of `run(copy_of_module)` on a batch of `batch` samples.

    Counts dense, convolution, LSTM and attention layers (the bulk of the work); the module is deep-copied
    moved to the CPU and run in train mode so fused inference paths do not hide sub-layers and no state of the original
    changes. Linear layers inside attention are counted by the attention counter, not twice.
    """
    m = copy.deepcopy(module).cpu().train()
    total = 0
    inside_mha: set[int] = set()
    for sub in m.modules():
        if isinstance(sub, nn.MultiheadAttention):
            inside_mha.update(id(c) for c in sub.modules() if c is not sub)

    def hook(mod, inp, out):
        nonlocal total
        if id(mod) in inside_mha:
            return
        for kind, fn in _COUNTERS.items():
            if isinstance(mod, kind):
                o = out[0] if isinstance(out, tuple) else out
                if isinstance(o, PackedSequence):
                    o = o.data
                total += fn(mod, inp, o)
                return

    handles = [s.register_forward_hook(hook) for s in m.modules()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            run(m)
    finally:
        for h in handles:
            h.remove()
    return total // batch
