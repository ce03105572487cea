"""The divergence guard every learning rule's update goes through (train.on_nonfinite).

`guarded_update` zeroes the gradients, runs the backward, then reads the losses and whether every gradient is
finite in ONE host sync (the floats the metrics need anyway) and steps the optimizers only when all of them
are finite. Otherwise the gradients are dropped, the parameters and optimizer state stay as they were, and
the step either raises NonFiniteError (stop) or reports itself skipped (skip_batch). A guarded step never
makes a weight non-finite from a non-finite loss or gradient.

`clip_gradients` (train.grad_clip) runs between the check and the step, on every engine: each optimizer's
gradients are scaled to a total 2-norm of at most grad_clip, over the parameters that optimizer steps (one
block, or for AL one of its two parts), never over the whole net: a pipeline stage holds one block, and 1F1B
steps a stage before the stages above it have their gradients, so this is the one norm every engine can take.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import torch

from growpipe.errors import NonFiniteError

SKIPPED = "skipped"
"""The metric a skipped step reports instead of its losses; the engines count it per block."""

STOP_HINT = "lower train.lr, or set train.on_nonfinite=skip_batch to skip such batches"
"""The fix the stop message names."""


def gradients(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """Every gradient the optimizers would apply."""
    return [p.grad for opt in optimizers for g in opt.param_groups for p in g["params"] if p.grad is not None]


def nonfinite_flag(grads: list[torch.Tensor]) -> torch.Tensor | None:
    """1.0 when some gradient holds a NaN or an infinity, else 0.0, on the gradients' device, without a host
    sync: the fused check torch's GradScaler uses (an unscale by 1, which leaves the gradients as they are).
    None without gradients."""
    if not grads:
        return None
    flags = []
    for device in dict.fromkeys(g.device for g in grads):
        found = torch.zeros((), device=device)
        on_device = [g for g in grads if g.device == device]
        torch._amp_foreach_non_finite_check_and_unscale_(on_device, found, torch.ones((), device=device))
        flags.append(found.to(grads[0].device))
    return flags[0] if len(flags) == 1 else torch.stack(flags).amax()


def nonfinite_problem(losses: dict[str, float], grads_finite: bool = True, judge_losses: bool = True) -> str | None:
    """What is non-finite among a step's losses and gradients, in words (None: all finite). Without
    `judge_losses` only the gradients count (the losses are only shown)."""
    bad = {k: v for k, v in losses.items() if judge_losses and not math.isfinite(v)}
    if bad:
        return "non-finite loss (" + ", ".join(f"{k}={v}" for k, v in bad.items()) + ")"
    if not grads_finite:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in losses.items())
        return "non-finite gradient" + (f" (loss {shown})" if shown else "")
    return None


def problem_after_backward(losses: dict[str, float], optimizers: Sequence[torch.optim.Optimizer]) -> str | None:
    """For losses already read as floats: what is non-finite, the losses first, then the gradients the
    optimizers hold (one host sync, only when the losses are finite). None: the step may go on."""
    return nonfinite_problem(losses) or nonfinite_problem(losses, grads_finite(optimizers))


def check_step(losses: dict[str, torch.Tensor], optimizers: Sequence[torch.optim.Optimizer],
               judge_losses: bool = True) -> tuple[dict[str, float], str | None]:  # fmt: skip
    """After the backward: the losses as floats and the problem (None: the step may go on), in one host sync
    (on the CPU, where reading a value waits for nothing, each is read directly: cheaper than stacking)."""
    flag = nonfinite_flag(gradients(optimizers))
    if next(iter(losses.values())).device.type == "cpu":
        floats = {k: v.item() for k, v in losses.items()}
        finite = flag is None or flag.item() == 0.0
    else:
        parts = [v.detach().reshape(()) for v in losses.values()]
        values = torch.stack(parts if flag is None else [*parts, flag]).tolist()
        floats = dict(zip(losses, values, strict=False))
        finite = flag is None or values[-1] == 0.0
    return floats, nonfinite_problem(floats, finite, judge_losses)


def grads_finite(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Whether every gradient the optimizers hold is finite (one host sync)."""
    flag = nonfinite_flag(gradients(optimizers))
    return flag is None or flag.item() == 0.0


def clip_gradients(optimizers: Sequence[torch.optim.Optimizer], max_norm: float | None) -> None:
    """Scale each optimizer's gradients (the fp32 ones the step applies, under bf16 too) so that their total
    2-norm is at most `max_norm`, each optimizer on its own (None: leave them as they are). No host sync."""
    if max_norm is None:
        return
    for opt in optimizers:
        if grads := [p for g in opt.param_groups for p in g["params"] if p.grad is not None]:
            torch.nn.utils.clip_grad_norm_(grads, max_norm)


def guarded_update(losses: dict[str, torch.Tensor], optimizers: Sequence[torch.optim.Optimizer], on_nonfinite: str,
                   replicated: bool = False, grad_clip: float | None = None) -> dict[str, float]:  # fmt: skip
    """One update: zero the gradients, backward the sum of `losses`, check, clip (`grad_clip`), step.

    Returns the losses as floats, or {SKIPPED: 1.0} when skip_batch dropped the update; raises NonFiniteError
    (without a place: the caller adds it) under stop. `replicated`: a data-parallel replica, whose backward
    averages the gradients over every worker; only those decide, so every replica takes the same step."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    total = functools.reduce(operator.add, losses.values())
    with torch.autocast(device_type=total.device.type, enabled=False):  # backward outside any bf16 autocast
        total.backward()
    floats, problem = check_step(losses, optimizers, judge_losses=not replicated)
    if problem is None:
        clip_gradients(optimizers, grad_clip)
        for opt in optimizers:
            opt.step()
        return floats
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if on_nonfinite == "skip_batch":
        return {SKIPPED: 1.0}
    raise NonFiniteError(problem, STOP_HINT)
