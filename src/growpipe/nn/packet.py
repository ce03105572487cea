"""The unit of work that flows from block to block."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Packet:
    """A micro-batch between blocks: only tensors (and the batch index) cross block or actor boundaries.

    x: the features (block input, then each block's output); y: class labels; t: AL's label code;
    mask: token mask for text (True where a real token is); side: named side-feature groups.
    """

    x: torch.Tensor
    y: torch.Tensor | None = None
    t: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    side: dict[str, torch.Tensor] = field(default_factory=dict)
    index: int = 0

    def to(self, device: torch.device | str) -> Packet:
        """A copy with every tensor on `device`."""

        def mv(v: torch.Tensor | None) -> torch.Tensor | None:
            return None if v is None else v.to(device, non_blocking=True)

        return Packet(
            x=mv(self.x),
            y=mv(self.y),
            t=mv(self.t),
            mask=mv(self.mask),
            side={k: v.to(device, non_blocking=True) for k, v in self.side.items()},
            index=self.index,
        )

    def detached(self) -> Packet:
        """A copy whose tensors carry no autograd history."""

        def dt(v: torch.Tensor | None) -> torch.Tensor | None:
            return None if v is None else v.detach()

        return replace(self, x=dt(self.x), t=dt(self.t))

    @property
    def batch_size(self) -> int:
        return int(self.x.shape[0])
