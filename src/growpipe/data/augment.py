"""Training-split image augmentation (torchvision.transforms.v2 functionals), seeded per (seed, epoch, sample):
a sample gets the same crop and flip however the batch around it is cut (micro-batches, data-parallel
shards, a resumed epoch), so every runtime sees the same augmented inputs as the reference trainer."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

KINDS = ("random_crop", "hflip")


class Augment:
    """random_crop (zero padding `padding` on each side, then a crop back to the image size) and hflip
    (probability 1/2), drawn for every sample of a split of `n` at the start of each epoch."""

    def __init__(self, kinds: Sequence[str], padding: int, seed: int, n: int):
        self.kinds = tuple(kinds)
        self.padding = padding
        self.seed = seed
        self.n = n
        self._epoch: int | None = None
        self._offsets = torch.zeros(0, 2, dtype=torch.long)
        self._flips = torch.zeros(0, dtype=torch.bool)
        self._lock = threading.Lock()  # reader threads (streamed data) augment batches concurrently

    def _draw(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            if self._epoch != epoch:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 7)
                self._offsets = torch.randint(0, 2 * self.padding + 1, (self.n, 2), generator=g)
                self._flips = torch.rand(self.n, generator=g) < 0.5
                self._epoch = epoch
            return self._offsets, self._flips

    def __call__(self, x: torch.Tensor, idx: torch.Tensor, epoch: int) -> torch.Tensor:
        """The batch `x` (N, C, H, W) of samples `idx` of the split, augmented as epoch `epoch` draws."""
        # imported here: torchvision pulls in torch._dynamo (about 2 s), which every actor paid at start-up
        from torchvision.transforms.v2 import functional as F

        offsets, flips = self._draw(epoch)
        h, w = x.shape[-2:]
        if "random_crop" in self.kinds and self.padding:
            padded = F.pad(x, [self.padding] * 4, fill=0.0)
            off = offsets[idx]
            x = torch.stack([F.crop(padded[i], int(t), int(s), h, w) for i, (t, s) in enumerate(off.tolist())])
        if "hflip" in self.kinds:
            flip = flips[idx]
            if flip.any():
                x = x.clone()
                x[flip] = F.horizontal_flip(x[flip])
        return x
