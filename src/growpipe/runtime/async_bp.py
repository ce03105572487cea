"""Asynchronous 1F1B pipelined backprop (PipeDream style) on the stage actors, with weight stashing or
SpecTrain weight prediction (method bp, runtime.engine: 1f1b).

Every mini-batch is a micro-batch with its own optimizer step, and there is no flush inside an epoch:
stage i runs K-i-1 forwards ahead, then alternates one forward and one backward. Between the forward and
the backward of a micro-batch, stage i applies K-i-1 other updates, so its weights move on:

- weight stashing: the forward runs on a copy of the weights of that moment and the backward on the same
  copy (the gradient is still applied to the live weights);
- SpecTrain (`bp_pipeline.spectrain: true`): the forward and backward run on a prediction of the weights the
  live ones will have when the gradient is applied, W - s * (the optimizer's next step), s = K-i-1 steps
  ahead, the step taken from the optimizer's smoothed gradient (Adam's moments, or SGD's momentum).

Each stage reports the staleness: the distance between the weights a micro-batch used and the live
weights its gradient is applied to.

The divergence guard: the last stage checks the mini-batch's loss and its own gradients before its step; a
non-finite one raises NonFiniteError (train.on_nonfinite: stop; the stages above never get a gradient of
that mini-batch, so none steps on it) or hands no gradient upstream (skip_batch: every stage skips it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from growpipe import faults
from growpipe.config import RunConfig
from growpipe.errors import ConfigError, NonFiniteError, StageError
from growpipe.nn.backbones import encoder_of
from growpipe.nn.guard import STOP_HINT, clip_gradients, problem_after_backward
from growpipe.nn.packet import Packet
from growpipe.runtime.bp_checks import one_f_one_b_problem
from growpipe.runtime.bp_stage import BPStage, busy


class _Encode(nn.Module):
    """The block's encoder (and, on the last stage, its classifier) as one module for functional_call."""

    def __init__(self, modules: nn.ModuleDict, last: bool):
        super().__init__()
        self.m = modules
        self.last = last

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, side: dict) -> tuple[Any, Any, Any, dict]:
        f = encoder_of(self.m)
        s, mask = f(x, mask, side)
        handoff = f.handoff()
        side = {**side, **handoff} if handoff else side
        return s, mask, (self.m["cls"](f.pool(s, mask)) if self.last else None), side


def next_step(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    """The optimizer's next update of parameter p if its gradient matched the smoothed one (SpecTrain's
    prediction direction): Adam's lr * m_hat / (sqrt(v_hat) + eps), SGD's lr * momentum buffer; 0 before
    the first step."""
    state, group = opt.state.get(p, {}), opt.param_groups[0]
    if "exp_avg" in state:
        step = float(state["step"])
        b1, b2 = group["betas"]
        m_hat = state["exp_avg"] / (1 - b1**step)
        v_hat = state["exp_avg_sq"] / (1 - b2**step)
        return group["lr"] * m_hat / (v_hat.sqrt() + group["eps"])
    if state.get("momentum_buffer") is not None:
        return group["lr"] * state["momentum_buffer"]
    return torch.zeros_like(p)


class AsyncBPStage(BPStage):
    """A BP block for 1F1B: each micro-batch's forward keeps its own weights (stashed or predicted) until
    its backward, whose gradient then updates the live weights at once."""

    def setup(self, spec: Any, info: Any, last: bool, stages: int = 1, spectrain: bool = False) -> str:
        name = super().setup(spec, info, last)
        self.spectrain = spectrain
        self.stale_sum, self.stale_n = 0.0, 0
        self.set_depth(stages, last)
        return name

    def set_depth(self, stages: int, last: bool) -> None:
        """The pipeline has `stages` stages (it grew): this stage runs stages-index-1 forwards ahead."""
        self.ahead = stages - self.index - 1  # updates between a micro-batch's forward and its backward
        self.last = last
        self.wrapped = _Encode(self._require_block().modules, last)

    def set_last(self, last: bool) -> None:
        self.set_depth(self.index + 1 if last else self.index + 2, last)

    @busy
    def forward(self, epoch: int, batch: int, upstream: Packet | None = None) -> Packet | None:  # type: ignore[override]
        block = self._require_block()
        if block.frozen:  # the net grew on top of it: forward only
            p = self._input(epoch, batch) if upstream is None else upstream.to(self.device)
            self.saved[batch] = None
            self.stats.samples += p.batch_size
            return block.forward(p)
        block.modules.train()
        opt = block.optimizers["all"]
        if self.spectrain and self.ahead:
            block.set_scheduled_lr()  # predict with the rate of the block's next step (a restore resets it)
        weights = {}
        for n, param in block.modules.named_parameters():
            w = (
                param.detach() - self.ahead * next_step(opt, param)
                if self.spectrain and self.ahead
                else param.detach().clone()
            )
            weights[n] = w.requires_grad_(param.requires_grad)  # a frozen embedding (net.freeze_embeddings) stays
        if upstream is None:
            p = self._input(epoch, batch)
            x_in = None
        else:
            p = upstream.to(self.device)
            x_in = p.x.detach().requires_grad_(p.x.is_floating_point())
        x = p.x if x_in is None else x_in
        with block.computing():
            s, mask, logits, side = functional_call(self.wrapped, {f"m.{n}": w for n, w in weights.items()},
                                                    (x, p.mask, p.side))  # fmt: skip
            result = F.cross_entropy(logits, p.labels()) if self.last else s
        self.saved[batch] = (x_in, result, weights)
        self.stats.samples += p.batch_size
        return None if self.last else block.handed_on(Packet(x=s.detach(), y=p.y, mask=mask, side=side, index=batch))

    @busy
    def backward(self, batch: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        self.backwards += 1
        faults.maybe_die_at(self.index, self.backwards)  # GROWPIPE_DIE_AT
        block = self._require_block()
        saved = self.saved.pop(batch)
        self.stats.batches += 1
        if saved is None:  # frozen
            return None
        x_in, result, weights = saved
        if self.last:
            result.backward()
            loss = float(result.detach())
        elif grad is None:  # the last stage skipped this mini-batch (train.on_nonfinite: skip_batch)
            self._skip(block)
            return None
        else:
            result.backward(grad.to(self.device, result.dtype))
        live = dict(block.modules.named_parameters())
        for n, p in live.items():
            p.grad = weights[n].grad
        opt = block.optimizers["all"]
        # every stage judges its own gradients before it steps (the last one the loss too); the stages after it
        # have stepped on this mini-batch already: 1F1B does not wait for the whole pipeline
        problem = problem_after_backward({"ce": loss} if self.last else {}, [opt])
        if problem is not None:
            opt.zero_grad(set_to_none=True)
            if block.on_nonfinite == "stop":
                raise NonFiniteError(problem, STOP_HINT, self.name(), batch=batch)
            self._skip(block)
            return None
        if self.last:
            self.loss_sum += loss
            self.loss_batches += 1
        dist = sum(float((weights[n].detach() - p.detach()).square().sum()) for n, p in live.items())
        self.stale_sum += math.sqrt(dist)
        self.stale_n += 1
        clip_gradients([opt], block.grad_clip)
        block.set_scheduled_lr()
        opt.step()
        opt.zero_grad(set_to_none=True)
        block.steps += 1
        return None if x_in is None or x_in.grad is None else x_in.grad.detach().cpu()

    def _skip(self, block: Any) -> None:
        """Count a skipped mini-batch (a step of the block, as every engine counts it: its dropout stream and
        learning-rate schedule go on); no gradient goes upstream, so the stages above skip it too."""
        key = f"b{block.index}"
        self.stats.skipped[key] = self.stats.skipped.get(key, 0) + 1
        block.steps += 1
        return None

    def staleness(self) -> float:
        """Mean distance between the weights micro-batches used and the live weights they updated."""
        return self.stale_sum / max(self.stale_n, 1)

    def _micro_batches(self) -> int:
        return 1  # every mini-batch is a micro-batch


def one_f_one_b_order(stages: int, batches: int) -> list[list[tuple[str, int]]]:
    """Per stage, its operations in 1F1B order: K-i-1 forwards ahead, then forward/backward pairs, then the
    remaining backwards."""
    orders = []
    for i in range(stages):
        ahead = min(stages - i - 1, batches)
        ops = [("F", m) for m in range(ahead)]
        for m in range(batches - ahead):
            ops += [("F", m + ahead), ("B", m)]
        ops += [("B", m) for m in range(batches - ahead, batches)]
        orders.append(ops)
    return orders


class Stretch:
    """One stretch of an epoch (`batches` mini-batches from batch `first` on) submitted in 1F1B order to the stage
    actors (each actor runs its calls in submission order), a few mini-batches at a time (`submit`), so that it can
    end early between two mini-batches (`end_before`) with nothing but a shorter stretch's drain: its order is a
    prefix of the longer one's up to the first forward not submitted, then that stretch's remaining backwards."""

    def __init__(self, stages: list[Any], epoch: int, first: int, batches: int):
        self.stages, self.epoch, self.first = stages, epoch, first
        self.batches = batches  # mini-batches in the stretch (fewer once ended early)
        self._orders = one_f_one_b_order(len(stages), batches)
        self._pos = [0] * len(stages)
        self._fwd: dict[tuple[int, int], Any] = {}
        self._bwd: dict[tuple[int, int], Any] = {}
        self.submitted = 0  # mini-batches whose forward stage 0 has been given

    def submit(self, upto: int) -> None:
        """Submit every call of the first `upto` mini-batches that its order lets through (a call once the call it
        depends on has been); no forward of a later one."""
        upto = min(upto, self.batches)
        k = len(self.stages)
        progressed = True
        while progressed:
            progressed = False
            for i in range(k):
                progressed = self._submit_stage(i, upto) or progressed
        self.submitted = max(self.submitted, upto)
        if upto == self.batches and any(pos < len(ops) for pos, ops in zip(self._pos, self._orders, strict=True)):
            raise StageError("1F1B schedule deadlocked (a bug in the order)")

    def _submit_stage(self, i: int, upto: int) -> bool:
        """Submit stage i's next calls until one waits for another stage's or is a forward of mini-batch `upto`
        or later; whether any was."""
        k, ops, before = len(self.stages), self._orders[i], self._pos[i]
        while self._pos[i] < len(ops):
            op, m = ops[self._pos[i]]
            b = self.first + m
            if op == "F":
                if m >= upto or (i > 0 and (i - 1, b) not in self._fwd):
                    break
                args = (self.epoch, b) if i == 0 else (self.epoch, b, self._fwd[(i - 1, b)])
                self._fwd[(i, b)] = self.stages[i].forward.remote(*args)
            else:
                if i < k - 1 and (i + 1, b) not in self._bwd:
                    break
                self._bwd[(i, b)] = self.stages[i].backward.remote(b, None if i == k - 1 else self._bwd[(i + 1, b)])
            self._pos[i] += 1
        return self._pos[i] > before

    def end_before(self, batches: int) -> None:
        """End the stretch after its first `batches` mini-batches, all of whose forwards stage 0 has (no fewer:
        those are trained)."""
        assert self.submitted <= batches <= self.batches, "a stretch ends after the forwards it has given"
        self.batches = batches
        self._orders = one_f_one_b_order(len(self.stages), batches)

    def last_call(self, m: int) -> Any:
        """The ref of mini-batch `m`'s (of the stretch) last call: stage 0's backward (submitted)."""
        return self._bwd[(0, self.first + m)]


def check_1f1b(cfg: RunConfig, batches: int) -> None:
    """Raise ConfigError when an epoch of `batches` batches is too short for 1F1B (see one_f_one_b_problem)."""
    if why := one_f_one_b_problem(cfg, batches):
        raise ConfigError(why)
