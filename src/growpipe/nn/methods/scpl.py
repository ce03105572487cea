"""Supervised Contrastive Parallel Learning (SCPL): per block a supervised-contrastive loss on a projection
of its features; a classifier, trained on detached features, on the last block only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from growpipe.config import RuleSettings
from growpipe.nn.block import Block, make_optimizer
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo


def supcon_loss(z: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """Supervised-contrastive loss (Khosla et al., L_out) of L2-normalised embeddings `z` with labels `y`.

    For each anchor i with at least one positive: -mean over positives p of
    log(exp(z_i.z_p / T) / sum over a != i of exp(z_i.z_a / T)); averaged over those anchors.
    """
    n = z.shape[0]
    logits = z @ z.T / temperature
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(self_mask, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positives = (y.unsqueeze(0) == y.unsqueeze(1)) & ~self_mask
    counts = positives.sum(1)
    has_pos = counts > 0
    if not has_pos.any():
        return z.sum() * 0.0
    pos_log_prob = log_prob.masked_fill(~positives, 0.0).sum(1)
    return -(pos_log_prob[has_pos] / counts[has_pos]).mean()


def make_projector(kind: str, in_dim: int, out_dim: int) -> nn.Module:
    """identity, linear, or a two-layer MLP projection head."""
    if kind == "identity":
        return nn.Identity()
    if kind == "linear":
        return nn.Linear(in_dim, out_dim)
    return nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(), nn.Linear(in_dim, out_dim))


def make_classifier(kind: str, in_dim: int, classes: int, hidden: int | None = None, norm: bool = False) -> nn.Module:
    """linear, or mlp: Linear-Tanh-Linear with `hidden` units (default in_dim); with `norm`, a LayerNorm on
    its input first."""
    if kind == "linear":
        head: nn.Module = nn.Linear(in_dim, classes)
    else:
        width = hidden or in_dim
        head = nn.Sequential(nn.Linear(in_dim, width), nn.Tanh(), nn.Linear(width, classes))
    return nn.Sequential(nn.LayerNorm(in_dim), head) if norm else head


class SCPLBlock(Block):
    def __init__(self, spec: BlockSpec, info: InputInfo, rule: RuleSettings):
        super().__init__(spec, info, rule)
        self.temperature = rule.scpl.temperature
        arch = spec.arch  # the heads' shapes: from the spec, never the run config
        self.modules["proj"] = make_projector(arch["projector"], self.head_dim, arch["proj_dim"])
        if spec.has_exit:
            self.modules["cls"] = make_classifier(arch["classifier"], self.head_dim, spec.num_classes,
                                                  arch["classifier_hidden"], arch["classifier_norm"])  # fmt: skip
        self.optimizers = {"all": make_optimizer(self.modules.parameters(), rule.optim)}

    def local_step(self, p: Packet) -> tuple[Packet, dict[str, float]]:
        s, mask, side = self.encode(p)
        feats = self.features(s, mask)
        z = F.normalize(self.modules["proj"](feats), dim=1)
        contrast = supcon_loss(z, p.labels(), self.temperature)
        losses = {"supcon": contrast}
        if "cls" in self.modules:
            losses["ce"] = F.cross_entropy(self.modules["cls"](feats.detach()), p.labels())
        metrics = self.learn(losses)
        return Packet(x=s.detach(), y=p.y, mask=mask, side=side, index=p.index), metrics
