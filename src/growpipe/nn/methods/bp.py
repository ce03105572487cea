"""End-to-end backpropagation over the same blocks: the baseline every figure is compared with.

Each block keeps its own optimizer over its own parameters; with element-wise optimizers (SGD, Adam) that
is the same update as one optimizer over the whole net. Only the last block's classifier is trained.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from growpipe.config import RuleSettings
from growpipe.errors import NonFiniteError
from growpipe.nn.block import Block, block_seed, make_optimizer, seeded
from growpipe.nn.guard import guarded_update
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo


class BPBlock(Block):
    def __init__(self, spec: BlockSpec, info: InputInfo, rule: RuleSettings):
        super().__init__(spec, info, rule)
        if spec.has_exit:
            self.modules["cls"] = nn.Linear(self.head_dim, spec.num_classes)
        self.optimizers = {"all": make_optimizer(self.modules.parameters(), rule.optim)}

    def forward_with_grad(self, p: Packet) -> Packet:
        """Forward in train mode keeping the autograd graph (for end-to-end training)."""
        self.modules.train()
        with self.computing():
            s, mask, side = self.encode(p)
        return self.handed_on(Packet(x=s, y=p.y, mask=mask, side=side, index=p.index))

    def train_step(self, p: Packet) -> tuple[Packet, dict[str, float]]:
        """A block trained alone end to end (the only trainable block of its net)."""
        if self.frozen:
            return self.forward(p), {}
        return train_chain([self], p)


def train_chain(blocks: list[BPBlock], p: Packet) -> tuple[Packet, dict[str, float]]:
    """One end-to-end step: frozen blocks forward without grad, the rest with; cross-entropy at the last
    block's classifier; one backward; every trainable block steps its optimizer (through the divergence
    guard: a non-finite loss or gradient skips every block's step, or stops, naming the last block), its
    gradients clipped at train.grad_clip block by block, as a pipeline stage clips its own."""
    last = blocks[-1]
    if last.frozen or "cls" not in last.modules:
        raise ValueError(
            f"BP needs a trainable classifier on the last block (block {last.index}); train the whole net "
            "end to end (GrowableNet.train_step) or grow a new block"
        )
    trainable = [b for b in blocks if not b.frozen]
    with seeded(block_seed(last.seed, last.index, last.steps)):
        for b in trainable:
            b.set_scheduled_lr()
        for b in blocks:
            p = b.forward(p) if b.frozen else b.forward_with_grad(p)
        with last.computing():
            logits = last.modules["cls"](last.features(p.x, p.mask))
            loss = F.cross_entropy(logits, p.labels())
        try:
            metrics = guarded_update({"ce": loss}, [b.optimizers["all"] for b in trainable], last.on_nonfinite,
                                     grad_clip=last.grad_clip)  # fmt: skip
        except NonFiniteError as e:
            raise e.located(where=last.name, batch=p.index) from None
        for b in trainable:
            b.steps += 1
    return p.detached(), metrics
