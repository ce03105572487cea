"""Activations that skip Ray's object store (pipeline.transport): Ray Direct Transport (RDT) between the
local-learning pipeline's stage actors.

With a direct backend (gloo between CPU stages, nccl between GPU stages) every stage actor joins one collective
group, made by the engine when it wires the stages (again after growth and after recovery, which change the
actors). A stage still hands its packets on with the next stage's `push`, but their tensors leave through an
RDT object: the stage calls its own `emit_tensors` with `tensor_transport=<backend>` (Ray keeps the returned
tensors in the actor), and passes that ref to `push`; Ray then moves the tensors straight from actor to actor
over the group while the rest of the call (which fields each packet has, its batch index) travels as before.
The object store stays the default (pipeline.transport: object_store) and the path of every other call.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray
import torch
import torch.distributed as dist

from growpipe.config import RunConfig
from growpipe.errors import ConfigError
from growpipe.nn.packet import Packet
from growpipe.runtime.placement import stage_bundle

OBJECT_STORE = "object_store"
DIRECT = ("gloo", "nccl")
_FIELDS = ("x", "y", "t", "mask")

Layout = tuple[int, tuple[str, ...], tuple[str, ...]]
"""What travels in the call for one packet: (batch index, fields present, side-feature names), in the order
its tensors are in the RDT object."""


# ---- the decision (pure) --------------------------------------------------------------------------------
def resolve(setting: str, method: str, device: str, gpus_per_stage: float) -> str:
    """The backend the stages use: object_store, compiled (a Ray Compiled Graph, runtime/compiled.py), gloo or
    nccl. `auto` is nccl when every stage has a whole GPU of its own (NCCL takes one rank per GPU), else
    object_store; method bp never uses another backend."""
    if method == "bp" or setting == OBJECT_STORE:
        return OBJECT_STORE
    if setting == "auto":
        return "nccl" if device != "cpu" and gpus_per_stage >= 1 else OBJECT_STORE
    return setting


def transport_problem(cfg: RunConfig) -> str | None:
    """Why pipeline.transport cannot work for this config, in one line (None: it can); checked before Ray
    starts. The cluster's GPUs are only known once it runs: nccl on a cluster without any fails at the start."""
    setting, gpus = cfg.pipeline.transport, cfg.runtime.gpus_per_stage
    if setting not in DIRECT:
        return None
    if setting == "nccl" and (gpus == 0 or cfg.device == "cpu"):
        why = "runtime.gpus_per_stage is 0" if gpus == 0 else "device is cpu"
        return (f"pipeline.transport: nccl sends tensors between GPUs but {why}; use gloo between CPU stages, or give "
                "each stage a GPU (runtime.gpus_per_stage: 1)")  # fmt: skip
    if setting == "nccl" and gpus is not None and gpus < 1:
        return (f"pipeline.transport: nccl needs a whole GPU per stage, runtime.gpus_per_stage={gpus:g} shares one "
                "between stages (NCCL takes one rank per GPU); set runtime.gpus_per_stage: 1 or use gloo")  # fmt: skip
    return None


def check_transport(cfg: RunConfig) -> None:
    """ConfigError (exit 2) when pipeline.transport cannot work for this config."""
    if why := transport_problem(cfg):
        raise ConfigError(why)


def stage_backend(cfg: RunConfig, gpus_per_stage: float) -> str:
    """The backend of a run whose stages each get `gpus_per_stage` GPUs (known once Ray runs)."""
    backend = resolve(cfg.pipeline.transport, cfg.method, cfg.device, gpus_per_stage)
    if backend == "nccl" and gpus_per_stage < 1:
        raise ConfigError("pipeline.transport: nccl needs a GPU per stage and this cluster has none; use gloo or "
                          "object_store, or join a cluster with GPUs")  # fmt: skip
    return backend


def run_backend(cfg: RunConfig) -> str:
    """The backend of a run on the Ray cluster this process is connected to."""
    return stage_backend(cfg, stage_bundle(cfg, ray.cluster_resources().get("GPU", 0) > 0).get("GPU", 0.0))


def actor_options(cfg: RunConfig) -> dict[str, Any]:
    """ray.remote options a stage actor class needs for the run's backend (Ray reads enable_tensor_transport
    from ray.remote only, not from .options())."""
    return {"enable_tensor_transport": True} if run_backend(cfg) in DIRECT else {}


# ---- packets as layouts plus a flat list of tensors (pure) --------------------------------------------------
def split_packets(packets: list[Packet], device: torch.device | str) -> tuple[list[Layout], list[torch.Tensor]]:
    """Each packet's layout, and all their tensors in one list on `device`, detached and contiguous (what a
    collective send takes)."""
    layouts: list[Layout] = []
    tensors: list[torch.Tensor] = []
    for p in packets:
        fields = tuple(f for f in _FIELDS if getattr(p, f) is not None)
        sides = tuple(p.side)
        for v in [*(getattr(p, f) for f in fields), *(p.side[k] for k in sides)]:
            tensors.append(v.detach().to(device).contiguous())
        layouts.append((p.index, fields, sides))
    return layouts, tensors


def join_packets(layouts: list[Layout], tensors: list[torch.Tensor]) -> list[Packet]:
    """The packets split_packets took apart."""
    packets, at = [], 0
    for index, fields, sides in layouts:
        values = dict(zip(fields, tensors[at : at + len(fields)], strict=True))
        at += len(fields)
        side = dict(zip(sides, tensors[at : at + len(sides)], strict=True))
        at += len(sides)
        packets.append(Packet(**values, side=side, index=index))
    if at != len(tensors):
        raise ValueError(f"{len(tensors)} tensors arrived for layouts that take {at}")
    return packets


# ---- the stage actor's side ---------------------------------------------------------------------------------
class DirectEndpoint:
    """Mixed into the stage actor: joining and leaving the group, and handing packets to the next stage by the
    direct backend while in one (else through the object store, as always)."""

    CONCURRENCY_GROUPS = {"transport": 1}
    """emit_tensors answers while the stage trains (run_epoch and push hold the default group)."""

    direct: str | None = None  # the backend while this actor is in a group
    direct_received = 0  # pushes whose tensors came by the direct backend

    device: torch.device  # the stage's own (StageBase)

    def join_transport(self, actors: list[Any], name: str, backend: str) -> None:
        """Use collective group `name` (made over `actors`, this one among them) to send on from now."""
        _know_only_group(actors, name, backend)
        self._me = ray.get_runtime_context().current_actor
        self._stash: dict[int, list[torch.Tensor]] = {}
        self._next_key = 0
        self._direct_device = torch.device("cpu") if backend == "gloo" else self.device  # gloo sends from host memory
        self.direct = backend

    def leave_transport(self) -> None:
        """Forget the group (the engine destroyed it) so that a larger one can be made over these actors."""
        self.direct = None
        _know_only_group([], "", "")
        # Ray's gloo group runs on torch.distributed's default group, made once per process with the first
        # group's size and not destroyed with it; a group over more actors needs it gone.
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def transport_received(self) -> int:
        """Pushes whose tensors came by the direct backend."""
        return self.direct_received

    @ray.method(concurrency_group="transport")
    def emit_tensors(self, key: int) -> list[torch.Tensor]:
        """The tensors stashed under `key` (called with tensor_transport: Ray keeps them here until sent)."""
        return self._stash.pop(key)

    def push_downstream(self, handle: Any, packets: list[Packet], sent_at: float, cache_pass: bool) -> Any:
        """`handle.push` with these packets: the tensors by the direct backend when in a group."""
        if self.direct is None:
            return handle.push.remote(packets, sent_at, cache_pass)
        layouts, tensors = split_packets(packets, self._direct_device)
        key, self._next_key = self._next_key, self._next_key + 1
        self._stash[key] = tensors
        ref = self._me.emit_tensors.options(tensor_transport=self.direct).remote(key)
        return handle.push.remote(layouts, sent_at, cache_pass, ref)

    def received(self, packets: list[Any], tensors: list[torch.Tensor] | None) -> list[Packet]:
        """What push got: the packets themselves, or their layouts and tensors."""
        if tensors is None:
            return packets
        self.direct_received += 1
        return join_packets(packets, tensors)


def _know_only_group(actors: list[Any], name: str, backend: str) -> None:
    """Make group `name` the only one this process knows (none when `name` is empty).

    Ray looks up the group of a transfer in the process that owns the ref, here the sending stage, but only
    records a group in the process that created it (the engine); so each stage records it too, through Ray's
    registry (ray.experimental.collective has no public call for this in Ray 2.60)."""
    # lazy: ray's collectives (about 0.1 s) serve only pipeline.transport gloo and nccl
    from ray.experimental.collective.collective import RemoteCommunicatorManager
    from ray.experimental.collective.communicator import CommunicatorHandle

    manager = RemoteCommunicatorManager.get()
    for old in manager.get_collective_groups():
        manager.remove_remote_communicator(old.name)
    if name:
        manager.add_remote_communicator(CommunicatorHandle(actors, name, backend))


# ---- the engine's side ---------------------------------------------------------------------------------------
class TransportGroup:
    """The engine's collective group over its stage actors (none for object_store or a single actor)."""

    def __init__(self, backend: str, timeout_s: float):
        self.backend = backend
        self.timeout_s = timeout_s
        self.name: str | None = None
        self.members: list[Any] = []
        self.groups_made = 0

    def wire(self, actors: list[Any]) -> None:
        """One group over `actors` (in pipeline order), replacing the previous one."""
        self.drop()
        if self.backend not in DIRECT or len(actors) < 2:
            return
        from ray.experimental.collective import create_collective_group  # lazy: as in _know_only_group

        group = create_collective_group(actors, backend=self.backend)
        self.name, self.members = group.name, list(actors)
        ray.get([a.join_transport.remote(actors, group.name, self.backend) for a in actors],
                timeout=self.timeout_s)  # fmt: skip
        self.groups_made += 1

    def drop(self) -> None:
        """Destroy the group and have its live members leave it (dead ones are skipped)."""
        if self.name is None:
            return
        from ray.experimental.collective import destroy_collective_group  # lazy: as in _know_only_group

        name, members, self.name, self.members = self.name, self.members, None, []
        with contextlib.suppress(ValueError, ray.exceptions.RayError):  # members already dead: nothing to undo
            destroy_collective_group(name)
        for ref in [a.leave_transport.remote() for a in members]:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref, timeout=self.timeout_s)

    def forget(self) -> None:
        """Forget the group without calling its members (they are being killed)."""
        if self.name is not None:
            _know_only_group([], "", "")
            self.name, self.members = None, []

    def describe(self) -> dict[str, Any]:
        """For the result: the backend, and how many times a group was made (start, growth, recovery)."""
        return {"backend": self.backend, "groups_made": self.groups_made}
