"""The one place that decides which torch device code runs on, and in which precision it computes."""

from __future__ import annotations

import contextlib
from typing import Any

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


COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compute_context(device: torch.device, precision: str) -> Any:
    """Where a forward pass and its losses run: torch.autocast in bfloat16 for train.precision bf16 (fp32
    weights stay fp32), nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=COMPUTE_DTYPES[precision])


def precision_problem(precision: str, preference: str = "auto") -> str | None:
    """Why train.precision cannot run on the config's device (None: it can); checked before the run."""
    if precision != "bf16":
        return None
    dev = resolve_device(preference) if preference != "auto" or torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(dev)
        return (f"train.precision: bf16 needs a GPU with bfloat16 (compute capability 8.0+); {name} has none: use "
                "fp32, or device: cpu")  # fmt: skip
    return None
