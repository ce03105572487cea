"""Encoders per backbone family, and how a backbone is cut into K blocks (or extended by one).

Every encoder maps (x, mask, side) -> (s, mask): `x` is the previous block's output (or the data),
`mask` marks real tokens of text, `side` holds side feature groups for feature blocks.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from growpipe.config import GrowStep, NetSpec
from growpipe.errors import ConfigError, ShapeError
from growpipe.nn.specs import EncoderSpec, InputInfo

IMAGE_BACKBONES = ("cnn", "resnet18")
TEXT_BACKBONES = ("embedding", "lstm", "transformer")


def masked_mean(s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the time axis of (B, T, D), counting only real tokens."""
    if mask is None:
        return s.mean(dim=1)
    m = mask.unsqueeze(-1).to(s.dtype)
    return (s * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


def flat_features(s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Features as (B, F) for a dense layer: images flattened, sequences mean-pooled."""
    if s.dim() == 3:
        return masked_mean(s, mask)
    return s.flatten(1)


def head_features(s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """What local heads (bridge, projector, classifier) see: feature maps pooled to at most 2x2."""
    if s.dim() == 4:
        h, w = s.shape[2:]
        s = F.adaptive_avg_pool2d(s, (min(h, 2), min(w, 2)))
    return flat_features(s, mask)


class Encoder(nn.Module):
    """Base: forward(x, mask, side) -> (s, mask); pool(s, mask) -> what the block's local heads see."""

    def forward(self, x, mask=None, side=None):  # pragma: no cover - overridden
        raise NotImplementedError

    def pool(self, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """(B, F) features of this encoder's output for the bridge, projector and classifiers."""
        return head_features(s, mask)

    def handoff(self) -> dict[str, torch.Tensor]:
        """Side tensors the last forward passes on to the next block (detached, batch first); none here."""
        return {}


def encoder_of(modules: nn.ModuleDict) -> Encoder:
    """A block's encoder `f` as its class (a ModuleDict hands out plain Modules)."""
    return cast(Encoder, modules["f"])


class MLPEncoder(Encoder):
    """(Linear, ReLU, Dropout) x layers over the flattened input; with `residual` (and in_features == width)
    the input is added to the output."""

    def __init__(self, in_features: int, width: int, layers: int, dropout: float, residual: bool = False):
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [nn.Linear(in_features if i == 0 else width, width), nn.ReLU()]
            if dropout:
                mods.append(nn.Dropout(dropout))
        self.body = nn.Sequential(*mods)
        self.residual = residual and in_features == width

    def forward(self, x, mask=None, side=None):
        flat = flat_features(x, mask)
        out = self.body(flat)
        return (flat + out if self.residual else out), None


class ConvEncoder(Encoder):
    """VGG-style stage: (3x3 conv, BatchNorm, ReLU) x layers, then 2x2 max-pool when it fits."""

    def __init__(self, in_channels: int, channels: int, layers: int, pool: bool, dropout: float):
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [
                nn.Conv2d(in_channels if i == 0 else channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
            ]
        if pool:
            mods.append(nn.MaxPool2d(2))
        if dropout:
            mods.append(nn.Dropout2d(dropout))
        self.body = nn.Sequential(*mods)

    def forward(self, x, mask=None, side=None):
        return self.body(x), mask


RESNET18_UNITS = [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]
"""ResNet-18's eight BasicBlocks as (planes, stride)."""


class ResNetEncoder(Encoder):
    """A contiguous slice of ResNet-18's basic blocks (torchvision's BasicBlock); slice 0 holds the stem."""

    def __init__(self, in_channels: int, start: int, end: int, image_size: int):
        from torchvision.models.resnet import BasicBlock  # here: importing torchvision costs every actor ~2 s

        super().__init__()
        mods: list[nn.Module] = []
        inplanes = RESNET18_UNITS[start - 1][0] if start else 64
        if start == 0:
            if image_size >= 64:  # ImageNet stem
                mods += [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(True)]
                mods.append(nn.MaxPool2d(3, 2, 1))
            else:  # small-image (CIFAR) stem
                mods += [nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(True)]
        for planes, stride in RESNET18_UNITS[start:end]:
            down = None
            if stride != 1 or inplanes != planes:
                down = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
            mods.append(BasicBlock(inplanes, planes, stride, down))
            inplanes = planes
        self.body = nn.Sequential(*mods)

    def forward(self, x, mask=None, side=None):
        return self.body(x), mask


class EmbeddingEncoder(Encoder):
    """Token ids (B, T) -> embeddings (B, T, D) and the mask of real tokens; optional learned positions.

    With pooling="tfidf" it returns one vector per document instead: the token embeddings weighted by
    sublinear term frequency times inverse document frequency, L2-normalised over the document's words,
    i.e. a learned linear map of the document's TF-IDF vector. With `word_dropout` p, training drops each
    token (reads it as padding) with probability p first.
    """

    idf: torch.Tensor  # a buffer, with pooling="tfidf" only

    def __init__(self, vocab: int, dim: int, positions: int, dropout: float, pooling: str = "none",
                 init_std: float = 1.0, vectors: torch.Tensor | None = None, freeze: bool = False,
                 word_dropout: float = 0.0):  # fmt: skip
        super().__init__()
        self.word_dropout = word_dropout
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Embedding(positions, dim) if positions else None
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.pooling = pooling
        if pooling == "tfidf":
            self.register_buffer("idf", torch.ones(vocab))
            # The bag is a linear map of an L2-normalised TF-IDF vector: start at the scale of a linear layer's
            # init. With N(0, 1) rows it behaves as fixed random features (20 Newsgroups: 0.75 vs 0.86).
            init_std = 0.01
        with torch.no_grad():
            if init_std != 1.0:
                nn.init.normal_(self.embed.weight, std=init_std)
                if self.pos is not None:
                    nn.init.normal_(self.pos.weight, std=init_std)
            if vectors is not None:
                self.embed.weight.copy_(vectors[:vocab])
            self.embed.weight[0].zero_()
        self.embed.weight.requires_grad_(not freeze)

    def forward(self, x, mask=None, side=None):
        if self.training and self.word_dropout:
            x = x.masked_fill(torch.rand(x.shape, device=x.device) < self.word_dropout, 0)
        if self.pooling == "tfidf":
            return self.drop(self._tfidf_bag(x)), None
        mask = x != 0
        s = self.embed(x)
        if self.pos is not None:
            s = s + self.pos(torch.arange(x.shape[1], device=x.device)).unsqueeze(0)
        return self.drop(s), mask

    def _tfidf_bag(self, x: torch.Tensor) -> torch.Tensor:
        weight, tf = tfidf_weights(x, self.idf)
        per_token = (weight / tf.clamp_min(1.0)).gather(1, x)  # each occurrence carries 1/tf of its word
        return F.embedding_bag(x, self.embed.weight, per_sample_weights=per_token, mode="sum")


def tfidf_weights(x: torch.Tensor, idf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each document's TF-IDF vector over the vocabulary, the weights the tfidf bag gives its words: sublinear
    term frequency (1 + log tf) times `idf`, padding (id 0) left out, L2-normalised; and the term counts tf.
    Both (B, vocab) from token ids (B, T)."""
    tf = torch.zeros(x.shape[0], idf.shape[0], device=x.device)
    tf.scatter_add_(1, x, torch.ones_like(x, dtype=tf.dtype))
    tf[:, 0] = 0.0  # padding
    weight = torch.where(tf > 0, (1.0 + tf.clamp_min(1.0).log()) * idf, torch.zeros_like(tf))
    return weight / weight.norm(dim=1, keepdim=True).clamp_min(1e-12), tf


class LSTMEncoder(Encoder):
    """Bidirectional LSTM over (B, T, D) -> (B, T, 2H), over the padded batch or (`packed`) the real steps only.

    Its heads see the masked mean of the outputs (pooling "mean"), or (pooling "last") the final hidden
    state averaged over the two directions, (h_forward + h_backward) / 2, as the seeds' LSTM blocks do.
    With `pass_state` it starts from the previous LSTM block's final (h, c) when their sizes match (the
    seeds), and hands its own on (side tensors "lstm.h" / "lstm.c", detached). Padded (the default, as the
    seeds) the backward direction starts in the padding and CPUs use oneDNN's fused kernel; packed skips the
    padding, exact per document, and is 2-7x slower on CPU (bench/RESULTS.md, "LSTM speed")."""

    def __init__(self, in_features: int, hidden: int, layers: int, dropout: float, pooling: str = "mean",
                 pass_state: bool = False, packed: bool = False):  # fmt: skip
        super().__init__()
        self.packed = packed
        self.lstm = nn.LSTM(in_features, hidden, layers, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.hidden = hidden
        self.pooling = pooling
        self.pass_state = pass_state
        self._state: dict[str, torch.Tensor] = {}

    def handoff(self) -> dict[str, torch.Tensor]:
        return self._state

    def pool(self, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pooling == "mean":
            return masked_mean(s, mask)
        last = (mask.sum(1).clamp_min(1) - 1) if mask is not None else torch.full((s.shape[0],), s.shape[1] - 1)
        forward = s[torch.arange(s.shape[0], device=s.device), last.to(s.device), : self.hidden]
        return (forward + s[:, 0, self.hidden :]) / 2  # the backward direction ends at the first token

    def forward(self, x, mask=None, side=None):
        start = self._start(side or {}, x.shape[0])
        if mask is None or not self.packed:
            out, (h, c) = self.lstm(x, start)
        else:
            lengths = mask.sum(1).clamp_min(1).cpu()
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, (h, c) = self.lstm(packed, start)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        if self.pass_state:
            self._state = {"lstm.h": h.detach().transpose(0, 1), "lstm.c": c.detach().transpose(0, 1)}
        return self.drop(out), mask

    def _start(self, side: dict[str, torch.Tensor], batch: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        h, c = side.get("lstm.h"), side.get("lstm.c")
        if not self.pass_state or h is None or tuple(h.shape) != (batch, 2 * self.lstm.num_layers, self.hidden):
            return None
        assert c is not None, "the LSTM state travels as a pair"
        return h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()


class TransformerEncoder(Encoder):
    """One or more transformer encoder layers over (B, T, D), padding masked out; with `input_norm` a
    LayerNorm over the input first."""

    def __init__(self, in_features: int, d_model: int, heads: int, layers: int, dropout: float,
                 ff_width: int | None = None, final_norm: bool = False, input_norm: bool = False):  # fmt: skip
        super().__init__()
        self.in_norm = nn.LayerNorm(in_features) if input_norm else nn.Identity()
        self.proj = nn.Linear(in_features, d_model) if in_features != d_model else nn.Identity()
        ff = ff_width or 4 * d_model
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, ff, dropout, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()

    def forward(self, x, mask=None, side=None):
        s = self.proj(self.in_norm(x))
        pad = None if mask is None else ~mask
        for layer in self.layers:
            s = layer(s, src_key_padding_mask=pad)
        return self.norm(s), mask


class FeatureEncoder(Encoder):
    """Feature accumulation: the previous features plus a new side feature group, merged by a dense layer."""

    def __init__(self, in_features: int, group: str, side_shape, side_dtype: str, vocab: int, width: int, dim: int):
        super().__init__()
        self.group = group
        if side_dtype == "long":
            self.side_embed: nn.Module = nn.Embedding(vocab, dim, padding_idx=0)
            side_features = dim
        else:
            self.side_embed = nn.Identity()
            side_features = 1
            for n in side_shape:
                side_features *= n
        self.merge = nn.Sequential(nn.Linear(in_features + side_features, width), nn.ReLU())

    def forward(self, x, mask=None, side=None):
        if side is None or self.group not in side:
            raise ShapeError(f"feature block needs side group {self.group!r} in the packet; the data must provide it")
        g = side[self.group]
        gf = masked_mean(self.side_embed(g), g != 0) if g.dtype == torch.long else g.flatten(1)
        return self.merge(torch.cat([flat_features(x, mask), gf], dim=1)), None


FEATURE_FAMILIES = ("feature", "seqfeature")
"""Encoder families that read a side feature group (the data must send it along)."""


class SequenceFeatureEncoder(Encoder):
    """Feature accumulation on a sequence model, as seed 004 does it: the new group's tokens, embedded by
    this block's own table, are appended to the sequence along the time axis, and the block's transformer
    or LSTM runs over the joined sequence."""

    def __init__(self, width: int, group: str, vocab: int, dim: int, init_std: float, body: Encoder):
        super().__init__()
        self.group = group
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, std=init_std)
            self.embed.weight[0].zero_()
        self.proj = nn.Linear(dim, width) if dim != width else nn.Identity()
        self.body = body

    def forward(self, x, mask=None, side=None):
        if side is None or self.group not in side:
            raise ShapeError(f"feature block needs side group {self.group!r} in the packet; the data must provide it")
        g = side[self.group]
        joined = torch.cat([x, self.proj(self.embed(g))], dim=1)
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        real = torch.cat([real, g != 0], dim=1)
        # real tokens first, in order (the sequence's, then the group's), padding after: what packing expects
        order = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices
        joined = joined.gather(1, order.unsqueeze(-1).expand_as(joined))
        return self.body(joined, real.gather(1, order), side)

    def pool(self, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.body.pool(s, mask)

    def handoff(self) -> dict[str, torch.Tensor]:
        return self.body.handoff()


class GatedEncoder(Encoder):
    """A grown block that starts as the identity (grow.init: preserve): x + gate * (f(x) - x), the gate one
    learned number starting at 0 (as ReZero, Bachlechner et al. 2020), so the block hands its input on until it
    learns, and at gate 1 is f itself. Only for an f whose output has its input's shape. (A zero last layer
    would not do: an MLP block ends in a ReLU, whose gradient at 0 is 0, so the branch would never learn.)"""

    def __init__(self, inner: Encoder):
        super().__init__()
        self.inner = inner
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, x, mask=None, side=None):
        s, out_mask = self.inner(x, mask, side)
        return x + self.gate * (s - x), out_mask

    def pool(self, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.inner.pool(s, mask)

    def handoff(self) -> dict[str, torch.Tensor]:
        return self.inner.handoff()


def build_encoder(spec: EncoderSpec, info: InputInfo | None = None) -> Encoder:
    """Instantiate the encoder a spec describes (`info` supplies data-derived buffers such as the IDF); with
    `gate` in its params, gated (GatedEncoder: it starts as the identity)."""
    if spec.params.get("gate"):
        params = {k: v for k, v in spec.params.items() if k != "gate"}
        return GatedEncoder(build_encoder(EncoderSpec(spec.family, spec.in_shape, spec.in_dtype, params), info))
    p, shape = spec.params, spec.in_shape
    fam = spec.family
    if fam == "mlp":
        return MLPEncoder(_flat_size(shape), p["width"], p["layers"], p["dropout"], p.get("residual", False))
    if fam == "conv":
        return ConvEncoder(shape[0], p["channels"], p["layers"], p["pool"], p["dropout"])
    if fam == "resnet":
        return ResNetEncoder(shape[0], p["start"], p["end"], p["image_size"])
    if fam == "embedding":
        vectors = info.word_vectors if info is not None else None
        enc = EmbeddingEncoder(p["vocab"], p["dim"], p["positions"], p["dropout"], p.get("pooling", "none"),
                               p.get("init_std", 1.0), vectors, p.get("freeze", False),
                               p.get("word_dropout", 0.0))  # fmt: skip
        if enc.pooling == "tfidf" and info is not None and info.idf is not None:
            enc.idf.copy_(info.idf[: p["vocab"]])
        return enc
    if fam == "lstm":  # specs saved before `packed` was recorded ran packed: a checkpoint keeps its maths
        return LSTMEncoder(shape[-1], p["hidden"], p["layers"], p["dropout"], p.get("pooling", "mean"),
                           p.get("pass_state", False), p.get("packed", True))  # fmt: skip
    if fam == "transformer":
        return TransformerEncoder(shape[-1], p["d_model"], p["heads"], p["layers"], p["dropout"], p.get("ff_width"),
                                  p.get("final_norm", False), p.get("input_norm", False))  # fmt: skip
    if fam == "seqfeature":
        inner = EncoderSpec(p["inner"], shape, "float", p["body"])
        return SequenceFeatureEncoder(shape[-1], p["group"], p["vocab"], p["dim"], p["init_std"],
                                      build_encoder(inner, info))  # fmt: skip
    if fam == "feature":
        return FeatureEncoder(
            _flat_size(shape),
            p["group"],
            tuple(p["side_shape"]),
            p["side_dtype"],
            p["vocab"],
            p["width"],
            p["dim"],
        )
    raise ConfigError(f"unknown encoder family {fam!r}")


def _flat_size(shape: tuple[int, ...]) -> int:
    if len(shape) == 2:  # a sequence (T, D) is mean-pooled to D
        return shape[-1]
    n = 1
    for d in shape:
        n *= d
    return n


def dummy_input(shape: tuple[int, ...], dtype: str, batch: int = 2) -> torch.Tensor:
    """A batch of the given per-sample shape: ones for token ids (all real tokens), zeros otherwise."""
    if dtype == "long":
        return torch.ones((batch, *shape), dtype=torch.long)
    return torch.zeros((batch, *shape))


def dummy_side(info: InputInfo, batch: int = 2) -> dict[str, torch.Tensor]:
    """Dummy tensors for every side group of the input."""
    return {g: dummy_input(s, d, batch) for g, (s, d) in info.side.items()}


@torch.no_grad()
def output_shape(spec: EncoderSpec, info: InputInfo) -> tuple[tuple[int, ...], str]:
    """Per-sample output shape and dtype of an encoder, found by a dummy forward (RNG state untouched)."""
    with torch.random.fork_rng(devices=[]):
        enc = build_encoder(spec, info).eval()
        x = dummy_input(spec.in_shape, spec.in_dtype)
        mask = torch.ones(x.shape[:2], dtype=torch.bool) if len(spec.in_shape) == 2 else None
        s, _ = enc(x, mask, dummy_side(info))
    return tuple(s.shape[1:]), "float"


def _check_family_fits(net: NetSpec, info: InputInfo) -> None:
    text = info.dtype == "long"
    if net.backbone in IMAGE_BACKBONES and len(info.shape) != 3:
        kind = "text" if text else f"shape {info.shape}"
        raise ConfigError(f"net.backbone: {net.backbone} needs images (C, H, W) but the data is {kind}; use mlp")
    if net.backbone in TEXT_BACKBONES and not text:
        raise ConfigError(
            f"net.backbone: {net.backbone} needs text (token ids) but the data is float {info.shape}; "
            "use mlp, cnn or resnet18"
        )
    if net.backbone == "mlp" and text:
        raise ConfigError("net.backbone: mlp cannot read token ids; use embedding, lstm or transformer for text")


def plan_encoders(net: NetSpec, info: InputInfo) -> list[EncoderSpec]:
    """Cut the backbone into net.blocks encoders whose shapes chain."""
    _check_family_fits(net, info)
    specs: list[EncoderSpec] = []
    shape, dtype = info.shape, info.dtype
    for i in range(net.blocks):
        spec = _block_encoder(net, info, i, shape, dtype)
        specs.append(spec)
        shape, dtype = output_shape(spec, info)
    return specs


def _block_encoder(net: NetSpec, info: InputInfo, i: int, shape, dtype) -> EncoderSpec:
    b, w, drop = net.backbone, net.block_width(i), net.dropout
    if b == "mlp" or (b == "embedding" and i > 0):
        return EncoderSpec("mlp", shape, dtype, mlp_params(net, w, net.block_layers(i)))
    if b == "cnn":
        channels = net.widths[i] if net.widths else min(32 * 2**i, 256)
        pool = min(shape[1], shape[2]) >= 2
        params = {"channels": channels, "layers": net.block_layers(i), "pool": pool, "dropout": drop}
        return EncoderSpec("conv", shape, dtype, params)
    if b == "resnet18":
        cuts = [round(k * len(RESNET18_UNITS) / net.blocks) for k in range(net.blocks + 1)]
        params = {"start": cuts[i], "end": cuts[i + 1], "image_size": info.shape[1]}
        return EncoderSpec("resnet", shape, dtype, params)
    if i == 0:  # text backbones start with the embedding block
        positions = info.shape[0] if b == "transformer" and net.positions == "learned" else 0
        pooling = "tfidf" if b == "embedding" and net.pooling == "tfidf" else "none"
        params = {"vocab": info.vocab_size, "dim": net.embed_dim, "positions": positions, "dropout": drop,
                  "pooling": pooling, "init_std": net.embed_init_std, "freeze": net.freeze_embeddings}  # fmt: skip
        word_dropout = net.word_dropout if info.word_dropout is None else info.word_dropout  # data.adapt's choice
        if word_dropout:  # only when set: specs saved before it existed stay as they were
            params["word_dropout"] = word_dropout
        return EncoderSpec("embedding", shape, dtype, params)
    if b == "lstm":
        params = {"hidden": w, "layers": net.block_layers(i), "dropout": drop, "pooling": net.lstm_pooling,
                  "pass_state": net.lstm_state, "packed": net.lstm_packed}  # fmt: skip
        return EncoderSpec("lstm", shape, dtype, params)
    return EncoderSpec("transformer", shape, dtype, transformer_params(net, w, net.block_layers(i)))


def mlp_params(net: NetSpec, width: int, layers: int) -> dict[str, object]:
    """What a dense block's spec records: width, layers, dropout, and residual only when set (specs saved
    before it existed stay as they were)."""
    params: dict[str, object] = {"width": width, "layers": layers, "dropout": net.dropout}
    if net.residual:
        params["residual"] = True
    return params


def transformer_params(net: NetSpec, d_model: int, layers: int) -> dict[str, object]:
    """What a transformer block's spec records: model width, heads, layers, dropout, ff width, final norm, and
    input norm only when set (specs saved before it existed stay as they were)."""
    params: dict[str, object] = {"d_model": d_model, "heads": net.heads, "layers": layers, "dropout": net.dropout,
                                 "ff_width": net.ff_width, "final_norm": net.final_norm}  # fmt: skip
    if net.input_norm:
        params["input_norm"] = True
    return params


def _sequence_feature_encoder(net: NetSpec, shape: tuple[int, ...], step: GrowStep, side_dtype: str, width: int,
                              info: InputInfo) -> EncoderSpec:  # fmt: skip
    if len(shape) != 2 or side_dtype != "long" or net.backbone not in ("transformer", "lstm"):
        raise ConfigError(f"grow: net.feature_join: sequence joins token groups to a transformer or LSTM's "
                          f"sequence; here the last block gives {shape} and group {step.group!r} holds "
                          f"{side_dtype} values: use feature_join: pooled, or text data with feature_groups.scheme: "
                          "chunks")  # fmt: skip
    if net.backbone == "transformer":
        inner, body = "transformer", transformer_params(net, shape[-1], net.layers_per_block)
    else:
        inner = "lstm"
        body = {"hidden": width, "layers": net.layers_per_block, "dropout": net.dropout, "pooling": net.lstm_pooling,
                "pass_state": net.lstm_state, "packed": net.lstm_packed}  # fmt: skip
    params = {"group": step.group, "vocab": info.vocab_size, "dim": net.embed_dim, "init_std": net.embed_init_std,
              "inner": inner, "body": body}  # fmt: skip
    return EncoderSpec("seqfeature", shape, "float", params)


def growth_encoder(
    net: NetSpec, info: InputInfo, last: EncoderSpec, shape: tuple[int, ...], step: GrowStep
) -> EncoderSpec:
    """The encoder of a block appended on top of `last` (whose output has per-sample `shape`)."""
    width = step.width or net.width
    if step.kind == "feature":
        if step.group not in info.side:
            known = ", ".join(info.side) or "none (set data.feature_groups)"
            raise ConfigError(f"grow: unknown feature group {step.group!r}; the data provides {known}")
        side_shape, side_dtype = info.side[step.group]
        if net.feature_join == "sequence":
            return _sequence_feature_encoder(net, shape, step, side_dtype, width, info)
        params = {
            "group": step.group,
            "side_shape": list(side_shape),
            "side_dtype": side_dtype,
            "vocab": info.vocab_size,
            "width": width,
            "dim": net.embed_dim,
        }
        return EncoderSpec("feature", shape, "float", params)
    if len(shape) == 3:  # feature maps: one more VGG-style stage
        channels = step.width or shape[0]
        pool = min(shape[1], shape[2]) >= 2
        params = {"channels": channels, "layers": net.layers_per_block, "pool": pool, "dropout": net.dropout}
        return EncoderSpec("conv", shape, "float", params)
    if len(shape) == 2 and last.family in ("lstm", "transformer", "embedding", "seqfeature"):
        fam = "transformer" if last.family == "transformer" or net.backbone == "transformer" else "lstm"
        if fam == "lstm":
            params = {"hidden": width, "layers": net.layers_per_block, "dropout": net.dropout,
                      "pooling": net.lstm_pooling, "pass_state": net.lstm_state,
                      "packed": net.lstm_packed}  # fmt: skip
        else:
            params = transformer_params(net, shape[-1], net.layers_per_block)
        return EncoderSpec(fam, shape, "float", params)
    return EncoderSpec("mlp", shape, "float", mlp_params(net, width, net.layers_per_block))
