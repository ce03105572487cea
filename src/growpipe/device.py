"""The one place that decides which torch device code runs on."""

from __future__ import annotations

import torch

from growpipe.errors import ConfigError


def resolve_device(preference: str = "auto") -> torch.device:
    """Map a config's `device` (auto, cpu, cuda, cuda:N) to a torch.device.

    `auto` picks CUDA when torch sees a GPU (a Ray actor started with num_gpus=1 sees exactly its own one),
    else the CPU.
    """
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(preference)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {preference!r} asked for but torch sees no CUDA device; use device: auto or cpu")
    return dev


def set_cpu_threads(n: int) -> None:
    """Limit torch's intra-op threads (0 leaves torch's default)."""
    if n > 0:
        torch.set_num_threads(n)
