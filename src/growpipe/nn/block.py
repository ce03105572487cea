"""The Block: one trainable unit of a growable net, with the same small surface for every learning rule.

- `train_step(packet) -> (packet, metrics)`: forward on the detached input, local loss, then `learn`:
  backward and optimizer step through the divergence guard (growpipe.nn.guard); a frozen block only
  forwards. The returned packet is detached.
- `forward(packet) -> packet`: the same without learning.
- `exit(out_packet) -> logits or code or None`: the prediction this depth can make from its own output.
  For rules whose exits live in a label-code space (AL), `exit_decodes` is True and the code is turned
  into logits by `decode` of each lower block in turn.
- `state_dict()` / `load_state_dict()`: modules and optimizer state.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from growpipe import faults
from growpipe.config import OptimSpec, RuleSettings
from growpipe.device import COMPUTE_DTYPES, compute_context
from growpipe.errors import NonFiniteError
from growpipe.nn.backbones import build_encoder, dummy_input, dummy_side, encoder_of, output_shape
from growpipe.nn.guard import guarded_update
from growpipe.nn.lr_schedule import BASE_LR, set_scheduled_lr
from growpipe.nn.macs import count_macs
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo


def make_optimizer(params, optim: OptimSpec, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer named in the config over `params`."""
    lr = lr or optim.lr
    params = list(params)
    if optim.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
    fused = optim.fused or None  # None: torch's default choice
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=optim.weight_decay, fused=fused)
    return torch.optim.Adam(params, lr=lr, weight_decay=optim.weight_decay, fused=fused)


def block_seed(seed: int, index: int, step: int = -1) -> int:
    """The RNG seed of block `index` at training step `step` (-1: its initial weights).

    Every block draws its initial weights and its dropout masks from its own stream, so a block produces the
    same numbers whether it runs in one process with the others or alone in a Ray actor.
    """
    return (seed * 1_000_003 + index * 10_007 + step + 1) % (2**63 - 1)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's global RNG (CPU and current CUDA device) seeded, then restore it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class Block:
    """Base class: holds the encoder `f`, the rule's heads, and one optimizer per independent part.

    Rules implement `local_step`; `train_step` wraps it with the block's own RNG stream and step count.
    """

    exit_decodes = False

    def __init__(self, spec: BlockSpec, info: InputInfo, rule: RuleSettings):
        faults.check_own_block(spec.index)  # GROWPIPE_OWN_BLOCKS_ONLY: a stage builds only its own blocks
        self.spec = spec
        self.info = info
        self.seed = rule.seed
        self.on_nonfinite = rule.optim.on_nonfinite
        self.grad_clip = rule.optim.grad_clip
        self.lr_schedule = rule.optim.lr_schedule
        self.precision = rule.optim.precision
        self.steps = 0
        self.index = spec.index
        self.modules = nn.ModuleDict({"f": build_encoder(spec.encoder, info)})
        self.out_shape, _ = output_shape(spec.encoder, info)
        self.head_dim = self._head_dim()
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.frozen = False
        self.lr_scale = 1.0  # grow.joint's lr_factor after a thaw
        self._thawable: list[str] = []  # the parameters a freeze stopped (not those the net keeps fixed)
        self.device = torch.device("cpu")
        self._costs: tuple[int, int, int, int, bool, bool] | None = None

    # ---- construction helpers ---------------------------------------------------------------------
    def _head_dim(self) -> int:
        with torch.no_grad():
            x = torch.zeros((2, *self.out_shape))
            mask = torch.ones(2, self.out_shape[0], dtype=torch.bool) if len(self.out_shape) == 2 else None
            return int(self.features(x, mask).shape[1])

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.spec.encoder.in_shape

    @property
    def name(self) -> str:
        """How messages name this block, e.g. "block 1 (SCPLBlock)"."""
        return f"block {self.index} ({type(self).__name__})"

    # ---- the interface ------------------------------------------------------------------------------
    def encode(self, p: Packet) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """Run the encoder f on a packet: (features, mask, the side tensors for the next block: the packet's
        plus what f hands on, in a new dict so that `p` stays as it was)."""
        f = encoder_of(self.modules)
        s, mask = f(p.x, p.mask, p.side)
        handoff = f.handoff()
        return s, mask, ({**p.side, **handoff} if handoff else p.side)

    def train_step(self, p: Packet) -> tuple[Packet, dict[str, float]]:
        """One local learning step on `p` (a frozen block only forwards); returns the detached output."""
        if self.frozen:
            return self.forward(p), {}
        self.modules.train()
        with seeded(block_seed(self.seed, self.index, self.steps)), self.computing():
            try:
                out, metrics = self.local_step(p)
            except NonFiniteError as e:
                raise e.located(where=self.name, batch=p.index) from None
        self.steps += 1
        return self.handed_on(out), metrics

    def computing(self) -> Any:
        """The context forward passes and losses run in (train.precision: bf16 autocast, or nothing)."""
        return compute_context(self.device, self.precision)

    def handed_on(self, out: Packet) -> Packet:
        """The output as the next block gets it: activations in the compute dtype (bf16 halves a hop)."""
        if self.precision == "fp32":
            return out
        dtype = COMPUTE_DTYPES[self.precision]
        cast = lambda v: v.to(dtype) if v is not None and v.is_floating_point() else v  # noqa: E731
        return replace(out, x=cast(out.x), t=cast(out.t))

    def local_step(self, p: Packet) -> tuple[Packet, dict[str, float]]:
        """The rule's forward and losses, then `learn` (modules are in train mode)."""
        raise NotImplementedError

    def learn(self, losses: dict[str, torch.Tensor]) -> dict[str, float]:
        """Backward the sum of `losses` and step every optimizer of the block (its gradients clipped at
        train.grad_clip), through the divergence guard: the losses as floats, or {"skipped": 1.0}
        (train.on_nonfinite: skip_batch); NonFiniteError (stop)."""
        self.set_scheduled_lr()
        return guarded_update(losses, list(self.optimizers.values()), self.on_nonfinite, grad_clip=self.grad_clip)

    def set_scheduled_lr(self) -> None:
        """Every optimizer of the block at train.lr_schedule's rate for the step it is about to take, times
        `lr_scale` (grow.joint's lr_factor once the joint phase began)."""
        set_scheduled_lr(self.optimizers.values(), self.steps, self.lr_schedule, self.lr_scale)

    @torch.no_grad()
    def forward(self, p: Packet) -> Packet:
        """The block's output packet, without learning (eval mode)."""
        self.modules.eval()
        with self.computing():
            s, mask, side = self.encode(p)
            out = Packet(x=s, y=p.y, t=self._forward_code(p), mask=mask, side=side, index=p.index)
        return self.handed_on(out)

    def _forward_code(self, p: Packet) -> torch.Tensor | None:
        """The label code passed on by forward (AL only)."""
        return None

    def exit(self, out: Packet) -> torch.Tensor | None:
        """Exit head output for the block's output packet (None when this depth has no exit).

        The default is the classifier `cls` on the pooled features, when the block has one.
        """
        if "cls" not in self.modules:
            return None
        return self.modules["cls"](self.features(out.x, out.mask))

    def features(self, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """What this block's local heads see of its output (the encoder's pooling)."""
        return encoder_of(self.modules).pool(s, mask)

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        """Map a code from this block's label space to the one below (AL)."""
        raise NotImplementedError(f"{type(self).__name__} has no decoder")

    def decoder(self) -> nn.Module | None:
        """The module `decode` runs (AL's label-side h: code_dim wide, whatever the block's width), for the
        stages above that read exits through it; None for rules whose exits give logits directly."""
        return None

    @property
    def has_exit(self) -> bool:
        return self.spec.has_exit

    # ---- freezing, devices, state -------------------------------------------------------------------
    def freeze(self) -> None:
        """Stop learning: parameters no longer require grad, eval mode for good (BatchNorm stats fixed); the
        optimizers' state (moments) is dropped."""
        if not self.frozen:
            self._thawable = [n for n, prm in self.modules.named_parameters() if prm.requires_grad]
        self.frozen = True
        for prm in self.modules.parameters():
            prm.requires_grad_(False)
        self.modules.eval()
        for opt in self.optimizers.values():
            opt.state.clear()

    def thaw(self, lr_scale: float) -> None:
        """Learn again after a freeze (grow.joint), at `lr_scale` times the learning rate, the optimizers'
        moments starting afresh; a parameter the net keeps fixed (net.freeze_embeddings) stays fixed."""
        if self.frozen:
            params = dict(self.modules.named_parameters())
            for name in self._thawable:
                params[name].requires_grad_(True)
        self.frozen, self.lr_scale = False, lr_scale

    def to(self, device: torch.device | str) -> Block:
        """Move modules (and optimizer state) to `device`."""
        self.device = torch.device(device)
        self.modules.to(self.device)
        for opt in self.optimizers.values():
            for state in opt.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v):
                        state[k] = v.to(self.device)
        return self

    def state_dict(self) -> dict[str, Any]:
        """Modules, optimizers and the frozen flag (tensors and plain values only)."""
        return {
            "modules": self.modules.state_dict(),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "frozen": self.frozen,
            "steps": self.steps,
            "lr_scale": self.lr_scale,
        }

    def checksum(self) -> str:
        """SHA-256 of every module tensor (parameters and buffers): equal iff the weights are bit-identical."""
        return checksum_of(self.modules.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.modules.load_state_dict(state["modules"])
        self.steps = int(state.get("steps", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        if state.get("frozen"):
            self.freeze()
        elif self.frozen:  # a state from before the freeze, or after a thaw
            self.thaw(self.lr_scale)
        for k, s in state.get("optimizers", {}).items():
            if k in self.optimizers:
                opt = self.optimizers[k]
                lrs = [g.get(BASE_LR, g["lr"]) for g in opt.param_groups]  # the rule's rates win over the saved
                opt.load_state_dict(s)
                for g, lr in zip(opt.param_groups, lrs, strict=True):
                    g["lr"] = g[BASE_LR] = lr

    def parameters(self):
        return self.modules.parameters()

    # ---- cost -----------------------------------------------------------------------------------------
    def encoder_macs(self) -> int:
        """MACs per sample of the encoder f."""
        x = dummy_input(self.in_shape, self.spec.encoder.in_dtype)
        mask = torch.ones(x.shape[:2], dtype=torch.bool) if len(self.in_shape) == 2 else None
        side = dummy_side(self.info)
        return count_macs(self.modules["f"], lambda f: f(x, mask, side), 2)

    def exit_macs(self) -> int:
        """MACs per sample of this block's exit head alone (0 when it has none)."""
        if "cls" not in self.modules:
            return 0
        return count_macs(self.modules["cls"], lambda m: m(torch.zeros(2, self.head_dim)), 2)

    def decode_macs(self) -> int:
        """MACs per sample of `decode` (0 for rules whose exits give logits directly)."""
        return 0

    def cost_parts(self) -> tuple[int, int, int, int, bool, bool]:
        """(index, encoder MACs, exit-head MACs, decoder MACs, has an exit, its exit decodes) per sample:
        what growpipe.nn.inference.exit_costs adds up (counted once, by a forward with hooks)."""
        if self._costs is None:
            self._costs = (self.index, self.encoder_macs(), self.exit_macs(), self.decode_macs(), self.has_exit,
                           self.exit_decodes)  # fmt: skip
        return self._costs


def checksum_of(modules: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a block's module tensors (its state's "modules"), by name: Block.checksum of a loaded state."""
    h = hashlib.sha256()
    for name, t in sorted(modules.items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
