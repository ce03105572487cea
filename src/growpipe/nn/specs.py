"""Plain, serialisable descriptions of a net's input and of each block, enough to rebuild it exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class InputInfo:
    """What the data feeds the first block (and feature blocks)."""

    shape: tuple[int, ...]
    dtype: str  # float | long
    num_classes: int
    vocab_size: int = 0
    side: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    """Side feature groups: name -> (per-sample shape, dtype)."""
    idf: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """Inverse document frequency per token id (text); not serialised: blocks keep it as a buffer."""
    word_vectors: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """Pretrained vectors per token id (net.word_vectors) for the embedding block's first build; not serialised."""
    normalize: dict[str, list[float]] | None = field(default=None, compare=False)
    """Mean and std the data standardised the inputs with (per channel or feature); the served model and
    evaluate apply the same."""
    word_dropout: float | None = None
    """Text with data.adapt: the word dropout the data asks of block 0 (None: net.word_dropout)."""

    @classmethod
    def from_bundle(cls, bundle: Any, net: Any = None) -> InputInfo:
        """Describe a DataBundle; with a NetSpec naming net.word_vectors, read them for its vocabulary (the
        coverage goes into the bundle's notes)."""
        vectors = None
        if net is not None and net.word_vectors and bundle.vocab:
            from growpipe.nn.word_vectors import read_word_vectors  # lazy: it imports the data package

            vectors, found = read_word_vectors(net.word_vectors, bundle.vocab, net.embed_dim)
            words = len(bundle.vocab) - 2
            bundle.notes.append(f"word vectors for {found:,} of {words:,} vocabulary words "
                                f"({100 * found / max(words, 1):.1f}%) from {net.word_vectors}")  # fmt: skip
        return cls(
            shape=bundle.input_shape,
            dtype=bundle.input_dtype,
            num_classes=bundle.num_classes,
            vocab_size=len(bundle.vocab) if bundle.vocab else 0,
            side={g: (bundle.side_shape(g), bundle.side_dtype(g)) for g in sorted(bundle.train.side)},
            idf=bundle.vocab.idf() if bundle.vocab else None,
            normalize=getattr(bundle, "normalize", None),
            word_vectors=vectors,
            word_dropout=choice.word_dropout if (choice := getattr(bundle, "text_choice", None)) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "num_classes": self.num_classes,
            "vocab_size": self.vocab_size,
            "side": {k: [list(s), d] for k, (s, d) in self.side.items()},
            "normalize": self.normalize,
            **({"word_dropout": self.word_dropout} if self.word_dropout is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InputInfo:
        return cls(
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            num_classes=d["num_classes"],
            vocab_size=d.get("vocab_size", 0),
            side={k: (tuple(s), dt) for k, (s, dt) in d.get("side", {}).items()},
            normalize=d.get("normalize"),
            word_dropout=d.get("word_dropout"),
        )


@dataclass(frozen=True)
class EncoderSpec:
    """One block's encoder f: its family, input and family parameters."""

    family: str  # mlp | conv | resnet | embedding | lstm | transformer | feature
    in_shape: tuple[int, ...]
    in_dtype: str
    params: dict[str, Any]


@dataclass(frozen=True)
class BlockSpec:
    """A block: its position, its encoder, whether it has an exit head, the label space, and its learning rule
    with the rule's architecture choices (`arch`): everything build_block needs to build it the same whatever
    the run config says (the config gives only its training settings: seed, optimizer, loss weights)."""

    index: int
    encoder: EncoderSpec
    has_exit: bool
    num_classes: int
    method: str
    """The learning rule whose block this is (al | scpl | dascpl | bp)."""
    arch: dict[str, Any]
    """The rule's choices that shape the block's heads (AL's code_dim, SCPL's classifier_norm, ...;
    growpipe.nn.methods.block_arch)."""

    def to_dict(self) -> dict[str, Any]:
        e = self.encoder
        encoder = {"family": e.family, "in_shape": list(e.in_shape), "in_dtype": e.in_dtype, "params": dict(e.params)}
        return {"index": self.index, "encoder": encoder, "has_exit": self.has_exit, "num_classes": self.num_classes,
                "method": self.method, "arch": dict(self.arch)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BlockSpec:
        e = d["encoder"]
        return cls(
            index=d["index"],
            encoder=EncoderSpec(e["family"], tuple(e["in_shape"]), e["in_dtype"], dict(e["params"])),
            has_exit=d["has_exit"],
            num_classes=d["num_classes"],
            method=d["method"],
            arch=dict(d["arch"]),
        )
