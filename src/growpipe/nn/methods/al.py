"""Associated Learning (AL): per block an encoder f, a bridge b into label-code space, a label encoder g and
a decoder h.

Block i maps features s_{i-1} -> s_i = f(s_{i-1}) and label codes t_{i-1} -> t_i = g(t_{i-1}) (t_0 is the
one-hot label). Losses: association ||b(reduce(s_i)) - t_i.detach()||^2 trains f and b; auto-encoder
h(t_i) vs t_{i-1} (cross-entropy against the class on block 1, squared error above) trains g and h. Both pairs have
their own optimizer. Prediction at depth k: h_1(...h_k(b_k(s_k))).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from growpipe.config import RuleSettings
from growpipe.nn.block import Block, make_optimizer
from growpipe.nn.macs import count_macs
from growpipe.nn.packet import Packet
from growpipe.nn.specs import BlockSpec, InputInfo


def squared_distance(a: torch.Tensor, b: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """||a - b||^2 per sample averaged over the batch ("sum"), or the mean over every element ("mean")."""
    d = (a - b).pow(2)
    return d.sum(dim=1).mean() if reduction == "sum" else d.mean()


def association_loss(bridged: torch.Tensor, t: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """||b(s_i) - t_i||^2 with t_i detached (batch mean): pulls the features' bridge onto the label code."""
    return squared_distance(bridged, t.detach(), reduction)


def autoencoder_loss(recon: torch.Tensor, t_prev: torch.Tensor, y: torch.Tensor, first: bool,
                     reduction: str = "sum") -> torch.Tensor:  # fmt: skip
    """Reconstruction of t_{i-1} from t_i: cross-entropy against the class on block 1, ||.||^2 above."""
    if first:
        return F.cross_entropy(recon, y)
    return squared_distance(recon, t_prev.detach(), reduction)


ACTIVATIONS = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


class ALBlock(Block):
    exit_decodes = True

    def __init__(self, spec: BlockSpec, info: InputInfo, rule: RuleSettings):
        super().__init__(spec, info, rule)
        arch = spec.arch  # the heads' shapes: from the spec, never the run config
        code = arch["code_dim"]
        self.first = spec.index == 0
        label_in = spec.num_classes if self.first else code
        bridge: nn.Module
        if arch["bridge_hidden"]:
            bridge = nn.Sequential(
                nn.Linear(self.head_dim, arch["bridge_hidden"]),
                nn.ReLU(),
                nn.Linear(arch["bridge_hidden"], code),
            )
        else:
            bridge = nn.Linear(self.head_dim, code)
        act = ACTIVATIONS[arch["activation"]]
        self.reduction = rule.al.loss_reduction
        self.modules["b"] = nn.Sequential(bridge, act())
        self.modules["g"] = nn.Sequential(nn.Linear(label_in, code), act())
        decoder = nn.Linear(code, label_in)
        self.modules["h"] = nn.Sequential(decoder, act()) if arch["decoder_activation"] and not self.first else decoder
        m = self.modules
        self.optimizers = {
            "fb": make_optimizer([*m["f"].parameters(), *m["b"].parameters()], rule.optim),
            "gh": make_optimizer(
                [*m["g"].parameters(), *m["h"].parameters()], rule.optim, rule.optim.lr * rule.al.label_lr_scale
            ),
        }

    def label_input(self, p: Packet) -> torch.Tensor:
        """t_{i-1}: the one-hot class for block 1, the previous block's code above."""
        if self.first:
            return F.one_hot(p.labels(), self.spec.num_classes).float()
        if p.t is None:
            raise ValueError(f"AL block {self.index} needs the label code t from block {self.index - 1}")
        return p.t

    def local_step(self, p: Packet) -> tuple[Packet, dict[str, float]]:
        m = self.modules
        s, mask, side = self.encode(p)
        t_prev = self.label_input(p)
        t = m["g"](t_prev)
        assoc = association_loss(m["b"](self.features(s, mask)), t, self.reduction)
        ae = autoencoder_loss(m["h"](t), t_prev, p.labels(), self.first, self.reduction)
        metrics = self.learn({"assoc": assoc, "ae": ae})  # disjoint parameter sets: f+b get only assoc, g+h only ae
        out = Packet(x=s.detach(), y=p.y, t=t.detach(), mask=mask, side=side, index=p.index)
        return out, metrics

    def _forward_code(self, p: Packet) -> torch.Tensor | None:
        if p.y is None or (not self.first and p.t is None):
            return None
        return self.modules["g"](self.label_input(p))

    def exit(self, out: Packet) -> torch.Tensor:
        m = self.modules
        return m["h"](m["b"](self.features(out.x, out.mask)))

    def decode(self, code: torch.Tensor) -> torch.Tensor:
        return self.modules["h"](code)

    def decoder(self) -> nn.Module:
        return self.modules["h"]

    def exit_macs(self) -> int:
        feats = torch.zeros(2, self.head_dim)
        return count_macs(nn.Sequential(self.modules["b"], self.modules["h"]), lambda m: m(feats), 2)

    def decode_macs(self) -> int:
        """MACs per sample of this block's decoder h (paid by every exit above it)."""
        return count_macs(self.modules["h"], lambda m: m(torch.zeros(2, self._code_dim())), 2)

    def _code_dim(self) -> int:
        return next(m for m in self.modules["g"].modules() if isinstance(m, nn.Linear)).out_features
