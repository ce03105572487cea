"""Between a DDP trainer and its engine (growpipe.runtime.ddp): the channel actor that carries the trainer's parts
to the engine, at most two ahead, and the engine's stop; and the stop as the workers see it, one answer on all."""

from __future__ import annotations

import asyncio
from typing import Any

import ray
import torch
import torch.distributed as dist


def position_after(part: dict[str, Any]) -> tuple[int, int]:
    """(epoch, batch) a trainer goes on from after `part` (a restore point mid-epoch, or the next epoch)."""
    return (part["epoch"], part["at"]) if part["at"] is not None else (part["epoch"] + 1, 0)


def placed_part(part: dict[str, Any], checkpoint: Any) -> dict[str, Any]:
    """`part` with the place of the Ray Train checkpoint that holds it ({fs, path, shards}, as the engine reads)."""
    return {**part, "checkpoint": {"fs": checkpoint.filesystem, "path": checkpoint.path, "shards": part["shards"]}}


@ray.remote(num_cpus=0)
class Channel:
    """A trainer's parts on their way to the engine, and the engine's stop (async: every wait is an await)."""

    def __init__(self) -> None:
        self.parts: dict[int, dict[str, Any]] = {}
        self.taken = 0  # the next part the engine takes
        self.changed = asyncio.Condition()
        self.stop_event = asyncio.Event()

    async def put(self, part: dict[str, Any]) -> None:
        """Hand in a part; return once the engine has taken the one before it (or was stopped)."""
        async with self.changed:
            if part["seq"] >= self.taken:
                self.parts[part["seq"]] = part
                self.changed.notify_all()
            await self.changed.wait_for(lambda: self.taken >= part["seq"] or self.stop_event.is_set())

    async def take(self, seq: int, wait: bool = True) -> dict[str, Any] | None:
        async with self.changed:
            if wait:
                await self.changed.wait_for(lambda: seq in self.parts)
            part = self.parts.pop(seq, None)
            self.taken = seq + 1 if part is not None else self.taken
            self.changed.notify_all()
            return part

    async def stop(self) -> None:
        async with self.changed:
            self.stop_event.set()
            self.changed.notify_all()

    async def stopped(self) -> bool:
        await self.stop_event.wait()
        return True


class StopFlag:
    """Whether the engine asked to stop, the same answer on every worker (each asks the channel without waiting,
    then every rank takes the largest answer)."""

    def __init__(self, channel: Any, device: torch.device):
        self.ref = channel.stopped.remote()
        self.device = device

    def is_set(self) -> bool:  # this worker's own view (a hold waits on it: growpipe.faults.hold_before)
        return self.wait(0)

    def wait(self, timeout: float) -> bool:
        return bool(ray.wait([self.ref], timeout=timeout)[0])

    def __call__(self) -> bool:
        flag = torch.tensor([float(self.is_set())], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
