"""A BP block in its own actor for pipelined backpropagation (GPipe): the forward of a micro-batch keeps its
autograd graph until that micro-batch's backward, which sends the gradient of the block's input upstream.

The engine submits, per mini-batch, every micro-batch's forward, then the backwards in reverse order, then
one optimizer step, which the last stage decides first (the divergence guard: a non-finite loss or gradient
skips the mini-batch on every stage) and hands its verdict to the others. Ray runs an actor's calls in the
order they were submitted and passes outputs between actors as ObjectRefs, so stage i works on micro-batch
m+1 while stage i+1 works on m. A frozen block (the net grew on top of it) only forwards, as in
single-process BP.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from growpipe import faults
from growpipe.config import RunConfig
from growpipe.data.batches import Batch, BatchReader, epoch_batches
from growpipe.errors import NonFiniteError, StageError
from growpipe.loop.stats import StageStats
from growpipe.nn.guard import STOP_HINT, clip_gradients, problem_after_backward
from growpipe.nn.methods.bp import BPBlock
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo
from growpipe.runtime.stage_base import StageBase, peak_rss_mb

F_ = TypeVar("F_", bound=Callable[..., Any])


def busy(method: F_) -> F_:
    """Count a stage call's wall time as the stage's busy time (reported per stage, e.g. by `partition`)."""

    @functools.wraps(method)
    def timed(self: BPStage, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.stats.busy_s += time.perf_counter() - t0

    return timed  # type: ignore[return-value]


class BPStage(StageBase):
    """One BP block: forward(micro) keeps the graph; backward(micro, grad) returns the input's gradient;
    step() applies the gradients accumulated over the mini-batch (one synchronous update, as GPipe)."""

    def __init__(self, index: int, cfg: RunConfig):
        super().__init__(index, cfg)
        self.last = False
        self.saved: dict[int, Any] = {}
        self.batch_loss = 0.0  # the last stage: the running mini-batch's loss so far (its micro-batches' shares)
        self.loss_sum = 0.0  # ... and of the mini-batches it stepped on since epoch_stats
        self.loss_batches = 0
        self.backwards = 0  # backward calls this actor ran (for fault injection)
        self.stats = StageStats(index)
        self.reader = BatchReader(self._read_epoch)  # stage 0: its training data, in the engine's order

    def setup(self, spec: BlockSpec, info: InputInfo, last: bool) -> str:
        block = self._build(spec, info)
        if not isinstance(block, BPBlock):
            raise StageError(f"stage {self.index}: pipelined BP needs method bp, got {type(block).__name__}")
        self.block = block
        self.last = last
        self.stats.block = type(block).__name__
        return type(block).__name__

    def _require_block(self) -> BPBlock:
        block = super()._require_block()
        assert isinstance(block, BPBlock), "setup takes BP blocks only"
        return block

    def set_last(self, last: bool) -> None:
        """Whether this stage ends the net (computes the loss): no longer once a block grew on top of it."""
        self.last = last

    @busy
    def forward(
        self, epoch: int, batch: int, micro: int, share: float, upstream: Packet | None = None
    ) -> Packet | None:
        """Micro-batch `micro` of batch `batch` (`share` of its samples): stage 0 cuts it from its data, the
        others take `upstream`. Returns the output without its graph (None on the last stage)."""
        block = self._require_block()
        if upstream is None:
            p, x_in = self._input(epoch, batch, micro), None
        else:
            p = upstream.to(self.device)
            x_in = p.x.detach().requires_grad_(p.x.is_floating_point() and not block.frozen)
            p = Packet(x=x_in, y=p.y, mask=p.mask, side=p.side, index=p.index)
        out = block.forward(p) if block.frozen else block.forward_with_grad(p)
        self.saved[micro] = (x_in, out, share)
        self.stats.samples += p.batch_size
        if self.last:
            return None
        out = out.detached()
        self.stats.sent_bytes += out.nbytes
        return out

    @busy
    def backward(self, micro: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of micro-batch `micro` (the last stage starts from the loss); returns d loss / d input
        (None below a frozen block: nothing there learns)."""
        self.backwards += 1
        faults.maybe_die_at(self.index, self.backwards)  # GROWPIPE_DIE_AT
        block = self._require_block()
        x_in, out, share = self.saved.pop(micro)
        if block.frozen:
            return None
        if self.last:
            with block.computing():
                logits = block.modules["cls"](block.features(out.x, out.mask))
                loss = F.cross_entropy(logits, out.y) * share  # shares sum to 1: the mini-batch's mean loss
            loss.backward()
            self.batch_loss += float(loss.detach())
        else:
            assert grad is not None, "a stage below the last gets its output's gradient"
            out.x.backward(grad.to(self.device, out.x.dtype))
        if x_in is None or x_in.grad is None:
            return None
        self.stats.sent_bytes += x_in.grad.numel() * x_in.grad.element_size()
        return x_in.grad.detach().cpu()

    @busy
    def verdict(self, batch: int) -> NonFiniteError | None:
        """After mini-batch `batch`'s backward: why this stage may not step (its gradients, and on the last stage
        the mini-batch's loss, not finite), or None."""
        block = self._require_block()
        if block.frozen:
            return None
        losses = {"ce": self.batch_loss} if self.last else {}
        problem = problem_after_backward(losses, [block.optimizers["all"]])
        return None if problem is None else NonFiniteError(problem, STOP_HINT, self.name(), batch=batch)

    @busy
    def step(self, batch: int, *verdicts: NonFiniteError | None) -> NonFiniteError | None:
        """One optimizer step with the gradients accumulated over mini-batch `batch`, unless it is skipped.

        `verdicts`: every stage's `verdict` for the mini-batch: if any says no, no stage steps (the first such
        one is returned; the engine raises it under train.on_nonfinite: stop). A skipped mini-batch drops
        every stage's gradients and leaves its weights and optimizer state as they were (counted in the
        stage's skipped batches)."""
        block = self._require_block()
        if self.saved:
            raise StageError(f"stage {self.index}: {len(self.saved)} micro-batch(es) had no backward before step")
        self.stats.batches += 1
        if block.frozen:
            return None
        opt = block.optimizers["all"]
        verdict = next((v for v in verdicts if v is not None), None)
        if self.last:
            if verdict is None:
                self.loss_sum += self.batch_loss
                self.loss_batches += 1
            self.batch_loss = 0.0
        if verdict is None:
            clip_gradients([opt], block.grad_clip)  # the mini-batch's gradients, summed over its micro-batches
            block.set_scheduled_lr()
            opt.step()
        else:
            key = f"b{block.index}"
            self.stats.skipped[key] = self.stats.skipped.get(key, 0) + 1
        opt.zero_grad(set_to_none=True)
        block.steps += 1
        return verdict

    def name(self) -> str:
        """How messages name this stage, e.g. "stage 1 (block 1, BPBlock)"."""
        block = self._require_block()
        return f"stage {self.index} (block {block.index}, {type(block).__name__})"

    def epoch_stats(self) -> StageStats:
        """This stage's statistics since the last call (the last stage's mean training loss over the
        mini-batches it stepped on among them), reset for the next."""
        stats, self.stats = self.stats, StageStats(self.index, self.stats.block)
        stats.peak_rss_mb = peak_rss_mb()
        if self.last and self.loss_batches:
            stats.loss_sums = {f"b{self._require_block().index}.ce": self.loss_sum}
            stats.loss_batches = {f"b{self._require_block().index}.ce": self.loss_batches}
        self.loss_sum, self.loss_batches = 0.0, 0
        return stats

    def _micro_batches(self) -> int:
        """Micro-batches a mini-batch is cut into (GPipe: bp_pipeline.micro_batches)."""
        return self.cfg.bp_pipeline.micro_batches

    def _read_epoch(self, epoch: int, start_batch: int) -> Generator[Batch, None, None]:
        return epoch_batches(self._data().train, self.cfg.data.batch_size, seed=self.cfg.seed, epoch=epoch,
                             start_batch=start_batch, augment=True, micro_batches=self._micro_batches())  # fmt: skip

    def _input(self, epoch: int, batch: int, micro: int = 0) -> Packet:
        """Stage 0: micro-batch `micro` of mini-batch `batch` of the training data, on this stage's device."""
        return self.reader.get(epoch, batch).parts[micro].to(self.device)
