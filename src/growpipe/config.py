"""Run configuration: YAML in, validated pydantic models out.

Every field has a default, so an empty YAML is a valid run (digits, MLP, AL). Errors from a bad file
are collected and reported together, one line each, naming the field and what to do about it.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from growpipe.envvars import extra_overrides
from growpipe.errors import ConfigError

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A run's name becomes a folder, a Ray actor name and an MLflow run name: letters, digits, '_', '.', '-'."""


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run (None: it can)."""
    if RUN_NAME.fullmatch(name) and ".." not in name:
        return None
    return (
        f"{name!r} is not a run name: use letters, digits, '_', '.' and '-', starting with a letter or digit, "
        "no '..', at most 128 characters (it names the run's checkpoint folder, Ray actor and MLflow run)"
    )


def check_run_name(name: str, field: str) -> str:
    """`name`, or ConfigError naming `field` (--run, --resume, name) when it cannot name a run."""
    if why := run_name_problem(name):
        raise ConfigError(f"{field}: {why}")
    return name


DATASET_NAMES = ("digits", "fashion-mnist", "20newsgroups", "cifar10", "cifar100")
DATASET_PREFIXES = ("hf:", "parquet:", "csv:", "json:", "imagefolder:")


class _Strict(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and nan (a learning rate of inf would validate and
    # then train to NaN), each refusal one line naming the field (problem_lines)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)  # fmt: skip


class FeatureGroupsSpec(_Strict):
    """How a dataset's features are cut into named groups for feature accumulation."""

    scheme: Literal["none", "bands", "channels", "columns", "chunks"] = "none"
    """none; bands (image rows), channels (image channels), columns (tabular), chunks (text tokens)."""
    count: int = Field(2, ge=2, le=64)
    """How many groups the features are cut into."""
    base: int = Field(1, ge=1)
    """The first `base` groups form the network's main input; the others come in through feature blocks."""

    @model_validator(mode="after")
    def _base_below_count(self) -> FeatureGroupsSpec:
        if self.scheme != "none" and self.base >= self.count:
            raise ValueError(f"base ({self.base}) must be below count ({self.count}) so groups are left to add")
        return self

    def names(self) -> list[str]:
        """All group names, e.g. ['chunk0', 'chunk1']; empty when scheme is none."""
        if self.scheme == "none":
            return []
        stem = {"bands": "band", "channels": "channel", "columns": "cols", "chunks": "chunk"}[self.scheme]
        return [f"{stem}{i}" for i in range(self.count)]

    def side_names(self) -> list[str]:
        """The groups that are not part of the main input."""
        return self.names()[self.base :]


class NormalizeSpec(_Strict):
    """Given normalisation statistics: one mean and std per channel (images) or per feature (tables)."""

    model_config = ConfigDict(allow_inf_nan=True)  # its own check names the entry and the fix

    mean: list[float]
    """Mean of each channel (feature) in the units the data is read in (images: [0, 1])."""
    std: list[float]
    """Standard deviation of each channel (feature); all finite and > 0."""

    @model_validator(mode="after")
    def _same_length(self) -> NormalizeSpec:
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"mean has {len(self.mean)} entries and std {len(self.std)}; give one of each per channel")
        for name, values in (("mean", self.mean), ("std", self.std)):
            for i, v in enumerate(values):
                if not math.isfinite(v) or (name == "std" and v <= 0):
                    need = "a finite number > 0" if name == "std" else "a finite number"
                    raise ValueError(f"{name}[{i}] is {v:g}; each {name} must be {need} (one per channel), or use "
                                     "data.normalize: train to measure them from the data")  # fmt: skip
        return self


class DataSpec(_Strict):
    """Which dataset, where it lives, and how it is batched and tokenised."""

    name: str = "digits"
    """digits | fashion-mnist | 20newsgroups | cifar10 | cifar100 | hf:NAME | parquet:PATH | csv:PATH | json:PATH |
    imagefolder:PATH (PATH: a directory, or a file:// / s3:// / gs:// URI for the last four)."""
    root: str | None = None
    """Directory holding the files; default: the dataset's usual places (../shared/data/..., /usr/share/datasets)."""
    download: bool = False
    """Let torchvision download fashion-mnist/cifar when no local copy is found (needs the internet)."""
    verify_checksums: bool = True
    """Check torchvision's MD5 sums of CIFAR files (its python batches are pickles: only turn this off for
    files you made yourself)."""
    text_column: str = "text"
    """Column holding the text of each sample (a table without it becomes numeric features)."""
    image_column: str = "image"
    """Column holding each sample's image (a Hugging Face Image feature, or encoded image bytes)."""
    image_size: list[int] | None = None
    """Resize every image to [height, width] (needed when the images differ in size). Default: their own."""
    channels: Literal[1, 3] | None = None
    """Convert every image to 1 (grey) or 3 (RGB) channels (needed when modes differ). Default: their own."""
    image_shape: list[int] | None = None
    """[channels, height, width]: a column of number lists (or the numeric columns) reshaped into images."""
    normalize: Literal["train", "none"] | NormalizeSpec = "train"
    """Image and table inputs standardised per channel (feature) with statistics of the training rows (train:
    after limit_train and val_fraction, a data.stats_rows sample of them), left as read (none), or {mean: [...],
    std: [...]}; stored in checkpoints, so evaluate and the served model apply the same."""
    stats_rows: int | Literal["all"] = 5000
    """Rows read at load: a sample of this many training rows (drawn with the run's seed: the same rows in every
    format) gives the data.normalize: train statistics, and as many rows of each split are checked (the others
    when their batch is read); all: every row, exact statistics."""
    augment: list[Literal["random_crop", "hflip"]] = []
    """Training-split augmentation of images (torchvision.transforms.v2), seeded per batch: random_crop
    (with crop_padding) and hflip. Not with grow.cache.enabled (frozen blocks would see other inputs)."""
    crop_padding: int = Field(4, ge=0)
    """Pixels of zero padding on each side before random_crop crops back to the image size."""
    skip_bad_files: bool = False
    """An image file that cannot be decoded (among the rows read at load, or when its batch is read) is skipped
    and counted (true) instead of stopping the run."""
    stream: bool | None = None
    """Read inputs from disk a batch at a time (bounded memory) instead of one tensor in memory: images of
    imagefolder: and Hugging Face image datasets (default yes), number columns of parquet:/csv:/json: (memory-
    mapped Arrow; default no; text is always tokenised in memory)."""
    read_workers: int = Field(2, ge=0, le=64)
    """Threads decoding the next batches of streamed images while the first block trains (0: inline)."""
    test_split: str | None = None
    """hf: the split to test on (default test, else validation); e.g. validation for GLUE SST-2, whose test
    labels are hidden."""
    label_column: str = "label"
    """Column holding each sample's class (integers 0..k-1, or strings mapped in sorted order)."""
    num_classes: int | None = Field(None, ge=2)
    """Number of classes; labels must lie in [0, num_classes). Default: the dataset's own count."""
    vocab_size: int = Field(20000, ge=3)
    """Word vocabulary size built from the train split (including <pad> and <unk>)."""
    max_len: int = Field(256, ge=4)
    """Tokens kept per document, at most (with max_len_percentile: the cap on what it chooses). Documents are
    padded to the longest training document when that is shorter, so a cap far above every document (e.g.
    1000000) keeps each one whole and costs nothing more."""
    max_len_percentile: float | None = Field(None, gt=0, le=100)
    """Choose the tokens kept per document from the data: this percentile of the train split's document
    lengths in tokens (e.g. 95: 95% of documents kept whole), at most max_len, at least 4. Short texts then
    get short inputs and long ones are not cut at a guess."""
    min_count: int = Field(1, ge=1)
    """Words seen fewer times than this in the train split stay out of the vocabulary (read as <unk>):
    typos and one-off names do not take the room of words the net can learn."""
    ngrams: int = Field(1, ge=1, le=2)
    """Terms per document: 1, its words; 2, its words and then the word pairs (bigrams) among the words kept,
    each pair a vocabulary entry of its own (counted, ranked and cut by vocab_size and min_count with the
    words). A bag of terms: net.backbone embedding only, whose tf-idf or mean pooling ignores order."""
    batch_size: int = Field(64, ge=1)
    """Samples per mini-batch (one packet through the pipeline, one optimizer step per block)."""
    limit_train: int | None = Field(None, ge=1)
    """Use only the first N training samples (after a seeded shuffle); for quick runs."""
    limit_test: int | None = Field(None, ge=1)
    """Use only the first N test samples (after a seeded shuffle); for quick runs."""
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of the training samples held out (seeded) as a validation split; grow.on_plateau watches it."""
    feature_groups: FeatureGroupsSpec = FeatureGroupsSpec()
    """How the inputs are cut into groups for feature accumulation (kind: feature growth)."""

    @field_validator("image_size", "image_shape")
    @classmethod
    def _image_dims(cls, v: list[int] | None, info: Any) -> list[int] | None:
        dims = ["height", "width"] if info.field_name == "image_size" else ["channels", "height", "width"]
        if v is not None and (len(v) != len(dims) or min(v) < 1):
            raise ValueError(f"got {v}; give [{', '.join(dims)}], each >= 1")
        return v

    @field_validator("stats_rows", mode="before")
    @classmethod
    def _some_rows(cls, v: Any) -> Any:
        if v == "all" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(f"got {v!r}; give a number of rows >= 1, or all for exact statistics over every row")

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        if v in DATASET_NAMES or v.startswith(DATASET_PREFIXES):
            return v
        raise ValueError(
            f"unknown dataset {v!r}; use one of {', '.join(DATASET_NAMES)} or a prefix "
            f"{', '.join(p + '...' for p in DATASET_PREFIXES)}"
        )


class NetSpec(_Strict):
    """The backbone and how it is cut into blocks."""

    backbone: Literal["mlp", "cnn", "resnet18", "embedding", "lstm", "transformer"] = "mlp"
    """The encoder family cut into blocks: mlp, cnn (VGG-style), resnet18 (its 8 residual units), embedding
    (bag of words), lstm (BiLSTM), transformer."""
    blocks: int = Field(2, ge=1, le=64)
    """Blocks at the start (one stage actor each on Ray)."""
    width: int = Field(256, ge=1)
    """MLP hidden size, LSTM hidden size per direction, transformer model size."""
    widths: list[int] | None = None
    """Per-block width (MLP units or CNN channels); overrides width; one entry per block."""
    layers_per_block: int = Field(1, ge=1, le=16)
    """Layers (MLP layers, conv layers, recurrent or transformer layers) in each block."""
    layers: list[int] | None = None
    """Layers of each block (overrides layers_per_block; one entry per block), e.g. from growpipe partition."""
    embed_dim: int = Field(128, ge=1)
    """Token embedding size (text backbones)."""
    heads: int = Field(4, ge=1)
    """Attention heads of a transformer block (the width must be divisible by it)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout inside the encoders (each block draws its masks from its own seeded stream)."""
    pooling: Literal["mean", "tfidf"] = "mean"
    """embedding backbone: mean (block 2 averages token embeddings) or tfidf (block 1 returns the
    sublinear-tf x idf weighted, L2-normalised bag of embeddings: a learned map of the TF-IDF vector)."""
    embed_init_std: float = Field(0.02, gt=0)
    """Standard deviation of the token embeddings' normal init (1.0: PyTorch's N(0, 1), which local rules
    barely move: SCPL 0.37 vs 0.62 on the 20 Newsgroups transformer; the tfidf bag uses 0.01); words without
    a pretrained vector (net.word_vectors) take the found vectors' spread instead."""
    positions: Literal["learned", "none"] = "learned"
    """transformer: learned position vectors added to the token embeddings (initialised like them), or none
    (the seeds' text models)."""
    final_norm: bool = False
    """transformer: each block ends with a LayerNorm over its output, as the seeds' transformer does."""
    input_norm: bool = True
    """transformer: each block starts with a LayerNorm over its input. Block 1 hands on token embeddings at
    embed_init_std's small scale, which the block's own residual stream drowns without it (20 Newsgroups
    transformer, K = 2, 12 epochs, 3 seeds, with against without: BP 0.780 vs 0.765, SCPL 0.755 vs 0.744).
    Checkpoints saved before it existed load and resume without it."""
    lstm_pooling: Literal["mean", "last"] = "mean"
    """lstm: what a block's local heads see: the masked mean of its outputs, or its final hidden state
    averaged over the two directions (the seeds)."""
    lstm_state: bool = False
    """lstm: each LSTM block starts from the previous LSTM block's final (h, c) (detached) when their sizes
    match, as the seeds' LSTM blocks do; otherwise from zeros."""
    feature_join: Literal["pooled", "sequence"] = "pooled"
    """Feature blocks (kind: feature) on text: pooled (the previous features and the new token group's mean
    embedding joined by one dense layer) or sequence (seed 004: the group's tokens, embedded by the block's
    own table, appended along the sequence axis and the block's transformer or LSTM run over the whole)."""
    lstm_packed: bool = False
    """lstm: run over the padded batch like the seeds (the backward direction starts in the padding; on CPU
    oneDNN's fused kernel, 2-7x faster), or skip the padding (packed sequences, exact per document)."""
    word_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """embedding backbone: in training, each token of a document is dropped (read as padding) with this
    probability before block 1 embeds it, so no block can lean on a single word (Iyyer et al. 2015's deep
    averaging networks); never at evaluation. Drawn from block 1's seeded stream, as its dropout is."""
    residual: bool = False
    """Dense blocks (mlp, and the embedding backbone's blocks after the bag) add their input to their output,
    x + block(x), when the sizes match: a block can then keep what the one before it separates (under BP the
    net keeps a linear path from the bag to the classifier)."""
    ff_width: int | None = Field(None, ge=1)
    """transformer: feed-forward width of each layer; default 4 x the model width (the seeds: the width)."""
    word_vectors: str | None = None
    """GloVe / word2vec text file (.txt or .txt.gz) whose vectors initialise the embedding block for the
    vocabulary words it holds (coverage printed); its dimension must equal net.embed_dim."""
    freeze_embeddings: bool = False
    """Keep the embedding block's token vectors fixed (e.g. pretrained ones from net.word_vectors)."""

    @model_validator(mode="after")
    def _widths_match_blocks(self) -> NetSpec:
        if self.pooling == "tfidf" and self.backbone != "embedding":
            raise ValueError("pooling: tfidf is for backbone: embedding; drop it or switch the backbone")
        if self.widths is not None:
            if len(self.widths) != self.blocks:
                raise ValueError(
                    f"widths has {len(self.widths)} entries but blocks is {self.blocks}; give one width per block"
                )
            if any(w < 1 for w in self.widths):
                raise ValueError("widths must all be >= 1")
        if self.layers is not None and (len(self.layers) != self.blocks or min(self.layers) < 1):
            raise ValueError(f"layers {self.layers}: give one count >= 1 per block ({self.blocks} blocks)")
        if self.backbone == "transformer":
            bad = [w for w in [self.width, *(self.widths or [])] if w % self.heads]
            if bad:
                raise ValueError(f"widths {bad} must be divisible by heads ({self.heads}) for a transformer")
        if self.word_vectors is not None and self.backbone not in ("embedding", "lstm", "transformer"):
            raise ValueError(f"word_vectors is for text backbones (embedding, lstm, transformer), not {self.backbone}")
        if self.backbone == "resnet18" and self.blocks > 8:
            raise ValueError(f"resnet18 has 8 residual units; blocks={self.blocks} is more, use 1..8")
        return self

    def block_width(self, i: int) -> int:
        """Width of block i (widths[i] when given, else width)."""
        return self.widths[i] if self.widths else self.width

    def block_layers(self, i: int) -> int:
        """Layers of block i (layers[i] when given, else layers_per_block)."""
        return self.layers[i] if self.layers and i < len(self.layers) else self.layers_per_block


class OptimSpec(_Strict):
    """Optimizer settings shared by every block."""

    epochs: int = Field(10, ge=0)
    """Epochs for the initial blocks, before any growth step."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """The optimizer of every block (one per independent part of a block)."""
    lr: float = Field(1e-3, gt=0)
    """Learning rate."""
    momentum: float = Field(0.9, ge=0, lt=1)
    """SGD momentum (sgd only)."""
    weight_decay: float = Field(0.0, ge=0)
    """L2 weight decay (decoupled for adamw)."""
    fused: bool = True
    """Adam/AdamW: torch's fused kernel (one pass over each parameter; a 1280-wide MLP block step on one
    CPU thread: 25.4 -> 17.1 ms). false: the per-tensor loop (the figures in bench/RESULTS.md before
    2026-11-22 02:50 were made with it)."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """fp32, or bf16: forward passes and losses under torch.autocast in bfloat16 (CPU and CUDA), weights and
    optimizer state kept in fp32, activations handed between blocks (and stages) in bfloat16: half the bytes
    per hop. Needs a device with bfloat16 (a CUDA GPU of compute capability 8.0+, or a CPU)."""
    on_nonfinite: Literal["stop", "skip_batch"] = "stop"
    """A non-finite (NaN or infinite) loss or gradient, found before the optimizer step: stop (the run ends
    with exit code 1, naming the block, epoch and batch; the newest checkpoint stays the resume point) or
    skip_batch (that batch's update is skipped, the optimizer state untouched, and counted in
    skipped_batches; an epoch whose every batch is skipped stops the run all the same). Pipelined BP skips
    the mini-batch on every stage; data-parallel BP on every worker."""
    grad_clip: float | None = None
    """Gradient clipping: before each optimizer step (after the non-finite check), the gradients that
    optimizer applies are scaled down to a total 2-norm of at most this (torch.nn.utils.clip_grad_norm_);
    null: no clipping. The norm is taken per optimizer, i.e. per block (AL: f+b and g+h apart), for every
    rule and engine alike: BP's reference trainer and DDP clip each block as a GPipe or 1F1B stage does,
    not the whole net. Off by default: at 1.0 it did not keep SCPL's last-state BiLSTM from collapsing
    (bench/RESULTS.md, issue 28)."""

    @field_validator("grad_clip")
    @classmethod
    def _positive_clip(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"got {v}; give a norm above 0 (e.g. 1.0), or null for no clipping")
        return v


class ALSpec(_Strict):
    """Associated Learning options."""

    code_dim: int = Field(128, ge=2)
    """Size of the label codes t_i."""
    bridge_hidden: int = Field(0, ge=0)
    """Hidden units of the bridge b (0: a single linear map)."""
    label_lr_scale: float = Field(1.0, gt=0)
    """g and h learn at train.lr times this (the seeds: 1, which measured best; bench/RESULTS.md)."""
    activation: Literal["sigmoid", "tanh"] = "tanh"
    """Activation of the bridge b and the label encoder g (the codes' range): tanh as in the seeds' AL code,
    or sigmoid."""
    decoder_activation: bool = False
    """Decoders h above block 1 end with the same activation (false: linear, as in the seeds)."""
    loss_reduction: Literal["sum", "mean"] = "mean"
    """AL's squared errors averaged over the code dimensions and the batch (the seeds: nn.MSELoss), or summed
    over the code dimensions, then averaged over the batch."""


class SCPLSpec(_Strict):
    """Supervised-contrastive options (SCPL and DASCPL)."""

    temperature: float = Field(0.1, gt=0)
    """Temperature of the supervised-contrastive loss."""
    projector: Literal["identity", "linear", "mlp"] = "mlp"
    """Projection head the contrastive loss sees: identity, linear, or mlp (Linear-ReLU-Linear)."""
    proj_dim: int = Field(128, ge=2)
    """Output size of a linear or mlp projector."""
    classifier: Literal["linear", "mlp"] = "linear"
    """The classifier on detached features (SCPL's last block, every DASCPL exit): linear, or mlp
    (Linear-Tanh-Linear, the seeds' text predictor)."""
    classifier_hidden: int | None = Field(None, ge=1)
    """Hidden units of an mlp classifier; default the block's feature size (the seeds: 300)."""
    classifier_norm: bool = True
    """A LayerNorm on the classifier's input. The contrastive loss sees only the features' direction and the
    classifier reads them detached, so nothing sets the scale it reads (an embedding bag stays near its init's
    small scale). 20 Newsgroups transformer, K = 2, 3 seeds, with against without: DASCPL's exit 1 0.803 vs
    0.656, full path 0.783 vs 0.783. Checkpoints saved before it existed load and resume without it."""


class RuleSettings(_Strict):
    """What a block needs of a run config: the learning rule, the seed and the rule's settings (nn/ is built
    from this, never from the whole run config)."""

    method: Literal["al", "scpl", "dascpl", "bp"] = "al"
    """The learning rule."""
    seed: int = 0
    """The run's seed: each block draws its weights and dropout masks from its own stream of it."""
    optim: OptimSpec = OptimSpec()
    """The optimizer every block uses, and what a step does with a non-finite loss (optim.on_nonfinite)."""
    al: ALSpec = ALSpec()
    """AL's code size, bridge and label-side rate."""
    scpl: SCPLSpec = SCPLSpec()
    """SCPL/DASCPL's temperature and projector."""


class _BlockAsk(_Strict):
    """Which block to append: a layer on top, or a block that also reads a new feature group."""

    kind: Literal["layer", "feature"] = "layer"
    """layer: a block on top of the last one; feature: a block on top that also reads a new feature group."""
    group: str | None = None
    """Feature group the new block receives (kind=feature)."""
    width: int | None = Field(None, ge=1)
    """Width of the new block: MLP/LSTM/feature units (default net.width) or conv channels (default: the
    previous block's); a transformer block keeps the model size of the one below."""

    @model_validator(mode="after")
    def _group_for_feature(self) -> _BlockAsk:
        if self.kind == "feature" and not self.group:
            raise ValueError("kind=feature needs group: the name of a feature group, e.g. chunk1")
        if self.kind == "layer" and self.group:
            raise ValueError("group is only for kind=feature; drop it or set kind: feature")
        return self


class GrowStep(_BlockAsk):
    """One growth step of the schedule: append a block, then train it."""

    epochs: int = Field(1, ge=0)
    """Epochs to train after this block is appended, before the next step."""


class GrowRequest(_BlockAsk):
    """A request to grow a running job (`growpipe grow`), validated like a config."""

    input_size: int | None = Field(None, ge=1)
    """Features per sample the new block expects; checked against the last block's output when given."""

    def as_step(self) -> GrowStep:
        return GrowStep(kind=self.kind, group=self.group, width=self.width, epochs=0)


class PlateauSpec(_Strict):
    """Grow when validation accuracy stops improving."""

    patience: int = Field(2, ge=1)
    """Epochs without an improvement of at least min_delta (since the last growth) before growing."""
    min_delta: float = Field(0.002, ge=0.0)
    """Smallest rise of validation accuracy that counts as an improvement."""


class CacheSpec(_Strict):
    """The frozen-prefix cache (Ray runtime): after a growth with the earlier blocks frozen, their output
    for every training sample is computed once and the new block trains from it."""

    enabled: bool = True
    """Build the cache after a growth with the earlier blocks frozen."""
    max_memory_mb: float = Field(1024.0, gt=0)
    """Largest cache kept in the training stage's memory."""
    spill: bool = True
    """Past max_memory_mb keep the cache in memory-mapped files on the stage's local disk (else refuse)."""
    spill_dir: str | None = None
    """Directory for spilled caches (default: the system temp directory)."""


class GrowSpec(_Strict):
    """When the net grows: an explicit schedule, every N epochs, or on a validation plateau.

    With `schedule`, train.epochs come first and each step adds its own epochs. With `every_epochs` or
    `on_plateau`, train.epochs is the whole run and `step` is the block appended each time, up to
    `max_blocks`. A running job also grows on request (`growpipe grow --run NAME`).
    """

    schedule: list[GrowStep] = []
    """Growth steps in order; train.epochs come first, then each step's own epochs."""
    every_epochs: int | None = Field(None, ge=1)
    """Append `step` every N epochs (up to max_blocks)."""
    on_plateau: PlateauSpec | None = None
    """Append `step` when validation accuracy stops improving (needs data.val_fraction)."""
    step: GrowStep = GrowStep()
    """The block every_epochs / on_plateau append (its epochs field is not used)."""
    max_blocks: int | None = Field(None, ge=1, le=64)
    """Most blocks the net may reach, by plan or by request (a planned step past it is skipped, a request
    refused); default: net.blocks + len(schedule), so set it for `growpipe grow` to add blocks beyond those."""
    freeze: bool = True
    """Freeze earlier blocks when a block is appended (only the new block trains)."""
    cache: CacheSpec = CacheSpec()
    """The frozen-prefix cache (local-learning pipeline on Ray)."""
    on_no_capacity: Literal["fail", "pack"] = "fail"
    """A new block whose stage cannot be placed within runtime.placement_timeout_s: fail the growth (a
    request is refused, a planned growth ends the run), or pack the block into the last stage's actor."""
    standby: Literal["auto", "always", "never"] = "auto"
    """Start the stage actor of the next block while the run can still grow (below max_blocks), so that a
    growth only builds the block (a stage's start-up is seconds of imports): a request is answered in about a
    second. It holds one stage's resources idle until then. auto: when a stage holds no GPU and the cluster
    has the room now; always: GPU stages too; never: start each grown block's actor on demand."""

    @model_validator(mode="after")
    def _one_policy(self) -> GrowSpec:
        policies = [n for n, v in (("schedule", self.schedule), ("every_epochs", self.every_epochs),
                                   ("on_plateau", self.on_plateau)) if v]  # fmt: skip
        if len(policies) > 1:
            raise ValueError(f"{' and '.join(policies)} are set; keep one way of growing")
        if (self.every_epochs or self.on_plateau) and self.max_blocks is None:
            raise ValueError("max_blocks is needed with every_epochs / on_plateau: the net stops growing there")
        return self

    def policy(self) -> str:
        """schedule | every_epochs | on_plateau | none."""
        if self.every_epochs:
            return "every_epochs"
        if self.on_plateau:
            return "on_plateau"
        return "schedule" if self.schedule else "none"


class EvalSpec(_Strict):
    """Evaluation: exits and adaptive inference."""

    thresholds: list[float] = [0.5, 0.7, 0.8, 0.9, 0.95, 0.99]
    """Confidence thresholds of adaptive inference: a sample leaves at the first exit this confident."""
    confidence: Literal["max_prob", "entropy"] = "max_prob"
    """max_prob: highest softmax probability; entropy: 1 - normalised entropy."""
    restore_best: bool = True
    """Model selection with data.val_fraction: at the end the net goes back to the epoch with the best
    validation accuracy since the last growth (the latest of a tie; its checkpoint is kept until then; needs
    checkpoint.enabled) and the result is that net's (`selected_epoch`); false, or no validation split: the
    last epoch's net."""
    exit_threshold: float | None = Field(None, ge=0.0, le=1.0)
    """The threshold real early exit runs at when a run ends and in growpipe evaluate (a sample that
    confident leaves, the blocks above never compute it; its measured time per sample is reported beside
    the full path's); default: the lowest of `thresholds` that costs fewer MACs than the full path and whose
    accuracy is within 0.5 point of it, else none (the full path)."""
    baseline: bool = False
    """Draw the classical bar beside the run (growpipe baseline): TF-IDF + logistic regression for text,
    logistic regression on standardised features for tables and images, on the run's own train/test rows;
    seconds in the run's process once it finished, in the result JSON as `baseline` and in MLflow as
    final.baseline_accuracy. Data it cannot handle (sequence-feature groups, data read from disk per batch too
    big for memory) is said in one line and the run goes on without it."""

    @field_validator("thresholds")
    @classmethod
    def _in_unit_interval(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("give at least one threshold in [0, 1], e.g. [0.9, 0.99]")
        bad = [t for t in v if not 0.0 <= t <= 1.0]
        if bad:
            raise ValueError(f"thresholds {bad} are outside [0, 1]; confidences are probabilities")
        return v


class PipelineSpec(_Strict):
    """runtime.engine pipeline (the local rules al, scpl, dascpl): one actor per block, packets handed from
    actor to actor."""

    window: int = Field(4, ge=1, le=1024)
    """Packets a stage keeps in flight to the next stage before it waits (backpressure)."""
    packets_per_call: int = Field(1, ge=1, le=64)
    """Packets a stage hands to the next in one actor call: each call costs about 2 ms here, so grouping
    amortises it; a stage then starts a group only once the previous stage finished all of it."""
    transport: Literal["object_store", "auto", "gloo", "nccl"] = "object_store"
    """How the stages hand their activations on: object_store (inside the actor call or through Ray's object
    store, the default), or by Ray Direct Transport straight from actor to actor over a collective group: gloo
    (tensors through host memory, tested on CPU), nccl (GPU to GPU, a whole GPU per stage, cupy on the GPU
    nodes; not tested here); auto: nccl when every stage has a whole GPU, else object_store. On one machine
    the default is faster (numpy through shared memory, bench/RESULTS.md). See docs/running.md."""

    @model_validator(mode="after")
    def _group_fits_window(self) -> PipelineSpec:
        if self.packets_per_call > self.window:
            raise ValueError(
                f"packets_per_call ({self.packets_per_call}) is more than window ({self.window}); "
                "raise window or lower packets_per_call"
            )
        return self


class BPPipelineSpec(_Strict):
    """runtime.engine gpipe or 1f1b (method bp): the blocks on stage actors, BP through them."""

    micro_batches: int = Field(4, ge=1, le=1024)
    """gpipe: micro-batches per mini-batch; each stage works on one while the next stage works on the one
    before."""
    spectrain: bool = False
    """1f1b: SpecTrain weight prediction instead of weight stashing."""


class DDPSpec(_Strict):
    """runtime.engine ddp (method bp): replicas of the whole net on Ray Train workers."""

    workers: int | None = Field(None, ge=1)
    """Ray Train workers (default: net.blocks, the resources a pipeline would use)."""
    min_workers: int | None = Field(None, ge=1)
    """Elastic training: Ray Train runs with as few as this many workers while the cluster has no room for
    `workers` and scales up when it does (None: a fixed number). The global mini-batch stays data.batch_size,
    split over the workers there are."""


ENGINES = ("pipeline", "gpipe", "1f1b", "ddp")
"""The Ray engines: the local-learning pipeline, and for method bp GPipe, 1F1B or data-parallel Ray Train."""

MOVED_RUNTIME_FIELDS = {"window": "pipeline.window", "packets_per_call": "pipeline.packets_per_call",
                        "transport": "pipeline.transport", "micro_batches": "bp_pipeline.micro_batches",
                        "spectrain": "bp_pipeline.spectrain", "ddp_workers": "ddp.workers",
                        "bp_schedule": "runtime.engine"}  # fmt: skip
"""Settings that moved out of runtime into the section of the engine they belong to."""


class RuntimeSpec(_Strict):
    """How the run uses Ray, whatever the engine."""

    engine: Literal["auto", "pipeline", "gpipe", "1f1b", "ddp"] = "auto"
    """The Ray engine: pipeline (the local rules al, scpl, dascpl: one stage actor per block, section
    `pipeline`), gpipe (method bp, synchronous, one update per mini-batch) or 1f1b (asynchronous, an update per
    mini-batch on each stage as soon as its backward is done; both section `bp_pipeline`), ddp (method bp
    data-parallel on Ray Train, section `ddp`); auto: pipeline for the local rules, gpipe for bp. A setting
    of another engine's section is refused. --runtime local (the reference trainer) ignores these sections."""
    inline_kb: int = Field(2048, ge=0)
    """Embedded Ray only: arguments up to this size travel inside the actor call instead of through the
    object store (Ray's max_direct_call_object_size; on a cluster set RAY_max_direct_call_object_size on
    `ray start`)."""
    cpus_per_stage: float = Field(1.0, gt=0)
    """CPUs each stage actor (or DDP worker) reserves (and torch threads it uses) when it runs without a GPU."""
    gpus_per_stage: float | None = Field(None, ge=0)
    """GPUs per stage actor or DDP worker; default: 1 when the cluster has GPUs, else 0."""
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Placement-group strategy for the stages across nodes."""
    num_cpus: int | None = Field(None, ge=1)
    """Embedded Ray only: logical CPUs to start it with (default: enough for every block the run will have)."""
    dashboard: bool = True
    """Embedded Ray only: start the Ray dashboard (on 127.0.0.1; its address is printed at the start). It also
    serves Ray's State API: without it Ray Train (engine ddp) keeps logging that it cannot reach it."""
    placement_timeout_s: float = Field(120.0, gt=0)
    """Longest wait for resources to place a stage (at the start and on growth) before failing."""
    stage_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for one packet downstream or one control call before the run fails."""
    timeline_epoch: int = Field(1, ge=0)
    """Epoch whose per-stage timeline is recorded as a Chrome trace (0: none)."""
    on_lost_node: Literal["shrink", "wait", "fail"] = "shrink"
    """When a stage's node is lost and its bundle cannot be placed again within placement_timeout_s: shrink
    (its blocks run packed into the surviving stage actors; they spread out again at an epoch boundary once
    capacity returns), wait (for capacity, however long), or fail (the run ends; --resume goes on later)."""
    max_stage_restarts: int = Field(3, ge=0)
    """A stage actor that dies is replaced and the run rolls back to its last checkpoint, up to this many
    times per run (needs checkpoint.enabled); then the run fails. Engine ddp: the failures Ray Train
    recovers from on its own (FailureConfig.max_failures), from its newest checkpoint."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_RUNTIME_FIELDS.items():
                if old in data:
                    raise ValueError(f"{old} moved to {new}" + (" (gpipe, 1f1b or ddp)" if old == "bp_schedule"
                                                                 else "") + f"; set {new} instead")  # fmt: skip
        return data


class CheckpointSpec(_Strict):
    """Run checkpoints (every engine): every block's modules and optimizer state plus a manifest, for resume
    and for recovering from a lost worker."""

    enabled: bool = True
    """Write run checkpoints (every engine)."""
    uri: str = "runs/checkpoints"
    """A local path (shared by every node on a cluster) or a pyarrow.fs URI such as s3://bucket/prefix;
    checkpoints go to URI/RUN_NAME/."""
    every_epochs: int = Field(1, ge=0)
    """Write one at the end of every N-th epoch (0: only at the start and at each growth)."""
    every_batches: int = Field(0, ge=0)
    """Also write one every N batches inside an epoch (0: never); the pipeline drains first."""
    keep: int = Field(2, ge=1)
    """How many complete checkpoints to keep (older ones are deleted after a new one is complete)."""
    overwrite: bool = False
    """A new run whose name already has checkpoints here replaces them (growpipe train --overwrite); without
    it such a run is refused, so an earlier run's restore points are never lost to a new run of its name."""


class TrackingSpec(_Strict):
    """Where a run is recorded (MLflow)."""

    mlflow: bool = True
    """Record the run in MLflow."""
    uri: str | None = None
    """MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///<workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment of the run; default $MLFLOW_EXPERIMENT_NAME, else growpipe."""
    workdir: str = "runs"
    """Local directory for the default sqlite store and for tracking entries that could not be sent."""
    run_id: str | None = None
    """Log into this existing MLflow run instead of starting one (resuming: its params are not logged again)."""
    parent_run_id: str | None = None
    """Start the run as a child of this MLflow run (a sweep's trials under the sweep's run)."""
    system_metrics: bool = True
    """Record CPU, memory, disk and network (GPU when present) of the tracking process's machine as system/*
    metrics (every $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds, 10 by default)."""
    log_model: bool = True
    """Log the trained net as an MLflow model: a LoggedModel `model` of the run (a pyfunc running adaptive early
    exit), carrying the run's final metrics."""
    register_model: bool = False
    """Also register that model in the MLflow model registry under the run's name (a new version each run)."""


class RunConfig(_Strict):
    """A whole run: what to train, on what, how, and how it grows."""

    name: str | None = None
    """The run's name: its controller actor on the cluster, its MLflow run, its checkpoint folder; default
    METHOD-DATASET-TIME (e.g. al-digits-20261124-101500-3fa2), chosen when the run starts. Letters, digits,
    '_', '.' and '-', starting with a letter or digit, no '..', at most 128 characters."""
    method: Literal["al", "scpl", "dascpl", "bp"] = "al"
    """The learning rule: al, scpl, dascpl (local objectives per block) or bp (end to end)."""
    seed: int = 0
    """Seeds the data order and every block's weights and dropout."""
    device: str = "auto"
    """auto (CUDA when present), cpu, cuda, cuda:N."""
    threads: int = Field(0, ge=0)
    """torch threads for the reference trainer (0: torch's default)."""
    data: DataSpec = DataSpec()
    """The dataset and its batching."""
    net: NetSpec = NetSpec()
    """The backbone and how it is cut into blocks."""
    train: OptimSpec = OptimSpec()
    """Epochs and the optimizer."""
    al: ALSpec = ALSpec()
    """Associated Learning settings."""
    scpl: SCPLSpec = SCPLSpec()
    """SCPL / DASCPL settings."""
    grow: GrowSpec = GrowSpec()
    """When and how the net grows."""
    eval: EvalSpec = EvalSpec()
    """Evaluation: exits and adaptive inference."""
    runtime: RuntimeSpec = RuntimeSpec()
    """How the run uses Ray, and which engine."""
    pipeline: PipelineSpec = PipelineSpec()
    """The local-learning pipeline's settings (runtime.engine pipeline)."""
    bp_pipeline: BPPipelineSpec = BPPipelineSpec()
    """Pipelined BP's settings (runtime.engine gpipe or 1f1b)."""
    ddp: DDPSpec = DDPSpec()
    """Data-parallel BP's settings (runtime.engine ddp)."""
    tracking: TrackingSpec = TrackingSpec()
    """Where the run is recorded (MLflow)."""
    checkpoint: CheckpointSpec = CheckpointSpec()
    """Restore points for resume and recovery."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        if v is not None and (why := run_name_problem(v)):
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        for i, step in enumerate(self.grow.schedule):
            self.check_feature_group(step, f"grow.schedule[{i}].group")
        self.check_feature_group(self.grow.step, "grow.step.group")
        if self.grow.on_plateau and not self.data.val_fraction:
            raise ValueError("grow.on_plateau watches validation accuracy: set data.val_fraction (e.g. 0.1)")
        least = self.net.blocks + len(self.grow.schedule)
        if self.grow.max_blocks is not None and self.grow.max_blocks < least:
            raise ValueError(f"grow.max_blocks ({self.grow.max_blocks}) is below the {least} blocks of the schedule")
        if why := self.engine_problem():
            raise ValueError(why)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: {self.device!r} is not auto, cpu, cuda or cuda:N")
        if self.data.ngrams > 1 and self.net.backbone != "embedding":
            raise ValueError(f"data.ngrams: word pairs make a bag of terms, which only net.backbone embedding reads "
                             f"(this net is {self.net.backbone}); set data.ngrams: 1")  # fmt: skip
        if self.net.word_dropout and self.net.backbone != "embedding":
            raise ValueError(f"net.word_dropout: supported for the embedding backbone's bag only (an LSTM's packed "
                             f"lengths would cut at a dropped word; this net is {self.net.backbone}); set "
                             f"net.word_dropout: 0")  # fmt: skip
        if self.data.augment and self.data.feature_groups.scheme != "none":
            raise ValueError("data.augment: crops and flips would move pixels across data.feature_groups; choose one")
        if self.data.augment and self.grow.freeze and self.grow.cache.enabled and self.max_blocks() > self.net.blocks:
            raise ValueError(
                "data.augment: the frozen-prefix cache computes each sample's input to a new block once, so frozen "
                "blocks would not see augmented images; set grow.cache.enabled: false"
            )
        return self

    def check_feature_group(self, step: GrowStep, where: str) -> None:
        """Raise ValueError naming `where` when a feature step asks for a group the data does not declare."""
        known = self.data.feature_groups.side_names()
        if step.kind == "feature" and step.group not in known:
            hint = (
                f"this config declares {', '.join(known)}"
                if known
                else "set data.feature_groups (scheme, count, base) to declare groups"
            )
            raise ValueError(f"{where}: unknown feature group {step.group!r}; {hint}")

    def rule(self) -> RuleSettings:
        """The settings nn/ builds blocks from."""
        return RuleSettings(method=self.method, seed=self.seed, optim=self.train, al=self.al, scpl=self.scpl)

    def engine(self) -> str:
        """The Ray engine this config runs on (runtime.engine; auto: pipeline for the local rules, gpipe for
        bp). The one place it is chosen."""
        if self.runtime.engine != "auto":
            return self.runtime.engine
        return "gpipe" if self.method == "bp" else "pipeline"

    def engine_problem(self) -> str | None:
        """Why the engine cannot run this method, or which other engine's section is set (None: fine)."""
        engine = self.engine()
        if (self.method == "bp") != (engine != "pipeline"):
            if self.method == "bp":
                return ("runtime.engine: pipeline trains the local rules (al, scpl, dascpl); method bp takes gpipe, "
                        "1f1b or ddp")  # fmt: skip
            return (f"runtime.engine: {engine} is BP on Ray (method bp); method {self.method} takes pipeline "
                    "(or auto)")  # fmt: skip
        owners = {"pipeline": ("pipeline",), "bp_pipeline": ("gpipe", "1f1b"), "ddp": ("ddp",)}
        for section, engines in owners.items():
            spec = getattr(self, section)
            changed = [k for k, v in spec if v != type(spec).model_fields[k].default]
            if changed and engine not in engines:
                return (f"{section}.{changed[0]}: applies to runtime.engine {' or '.join(engines)}, and this run's "
                        f"engine is {engine}; remove it")  # fmt: skip
        if self.bp_pipeline.spectrain and engine == "gpipe":
            return "bp_pipeline.spectrain: applies to runtime.engine 1f1b (GPipe has no stale weights); remove it"
        if self.ddp.min_workers is not None and self.ddp.min_workers > (self.ddp.workers or self.net.blocks):
            return (f"ddp.min_workers ({self.ddp.min_workers}) is more than ddp.workers "
                    f"({self.ddp.workers or self.net.blocks}); lower it")  # fmt: skip
        return None

    def max_blocks(self) -> int:
        """Most blocks the net may reach: grow.max_blocks, else once the whole schedule has run."""
        if self.grow.max_blocks is not None:
            return self.grow.max_blocks
        return self.net.blocks + len(self.grow.schedule)

    def total_epochs(self) -> int:
        """Epochs of the whole run (with a schedule: initial + every growth step)."""
        return self.train.epochs + sum(s.epochs for s in self.grow.schedule)


KeyPlaces = dict[tuple[str, ...], int | str]
"""Where each key of a config is, by its path of keys: a line of the file itself (int), or 'FILE line N' for a
key that comes from a base file."""


def _format_errors(err: ValidationError, source: str, lines: KeyPlaces | None = None) -> str:
    """A header and one line per problem, the field named as the user wrote it (`lines`: where each YAML key
    is)."""
    problems = problem_lines(err, lines)
    return "\n".join([f"{source}: {len(problems)} problem(s)", *(f"  {p}" for p in problems)])


def problem_lines(err: ValidationError, lines: KeyPlaces | None = None) -> list[str]:
    """One line per problem of a validation error: 'field (line N): what is wrong and the fix'."""
    problems = []
    for e in err.errors():
        tags = [str(p) for p in e["loc"] if _is_union_tag(p)]
        if tags and _other_member_meant(tags[0], e):
            continue  # a `literal | model` field: only the member the value was meant for says what is wrong
        loc = tuple(str(p) for p in e["loc"] if not _is_union_tag(p))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see configs/ for every field)"
        elif e["type"] == "literal_error":
            msg = f"got {e['input']!r}; {msg.lower()}"
        elif e["type"] == "finite_number":
            msg = f"got {e['input']}; give a finite number (inf and nan are not values a run can use)"
        where = _line_of(loc, lines)
        field = f"{'.'.join(loc)}{where}: " if loc else ""  # a whole-model check names its fields itself
        problems += [f"{field}{part}" for part in msg.splitlines()]
    return problems


def _other_member_meant(tag: str, error: Any) -> bool:
    """Whether this error of a union member is noise: a mapping was meant for the model member (not the
    literal), anything else for the literal member (not the model)."""
    if tag.startswith("literal["):
        return isinstance(error["input"], dict)
    return not isinstance(error["input"], dict) and error["type"] in (
        "model_type",
        "model_attributes_type",
        "dict_type",
    )


def _is_union_tag(part: Any) -> bool:
    """pydantic's name for a member of a union in an error location, e.g. `function-after[...]`."""
    return isinstance(part, str) and ("[" in part or "(" in part)


def _line_of(loc: tuple[str, ...], lines: KeyPlaces | None) -> str:
    """' (line N)' (or ' (BASE line N)') of the deepest key of `loc` the YAML file has, or ''."""
    for n in range(len(loc), 0, -1):
        if lines and loc[:n] in lines:
            place = lines[loc[:n]]
            return f" (line {place})" if isinstance(place, int) else f" ({place})"
    return ""


def yaml_key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Where each key of a YAML mapping is (1-based line), by its path of keys (list items by index)."""
    out: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = (*path, str(key.value))
                out[here] = key.start_mark.line + 1
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out[(*path, str(i))] = item.start_mark.line + 1
                walk(item, (*path, str(i)))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, ())
    return out


def parse_value(text: str) -> Any:
    """Parse a --set value with YAML rules (numbers, bools, lists), falling back to the string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """raw["a"]["b"] = value for key "a.b" (sections created as needed)."""
    node = raw
    *head, last = key.strip().split(".")
    for part in head:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = nxt
    node[last] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `raw` with each `dotted.key=value` applied."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set train.lr=0.01")
        key, value = item.split("=", 1)
        if key.strip() == "base":
            raise ConfigError(f"--set {item!r}: base works only in a config file (it names the YAML file that file "
                              "starts from); write base: PATH at the top of the file you pass to --config")  # fmt: skip
        try:
            set_dotted(out, key, parse_value(value))
        except ConfigError as e:
            raise ConfigError(f"--set {e}") from None
    return out


def parse_grow_request(raw: dict[str, Any]) -> GrowRequest:
    """Validate a grow request; raise ConfigError listing every problem, like a config."""
    try:
        return GrowRequest.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, "grow request")) from None


def build_config(raw: dict[str, Any] | None, source: str = "config", yaml_file: Path | None = None,
                 overrides: list[str] | None = None) -> RunConfig:  # fmt: skip
    """Validate a raw mapping; raise ConfigError listing every problem (with its line in `yaml_file`, the
    YAML the mapping was read from, or the --set of `overrides` that gave it)."""
    try:
        return RunConfig.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source, key_places(yaml_file, overrides))) from None


def key_places(yaml_file: Path | None, overrides: list[str] | None = None) -> KeyPlaces | None:
    """Where each key of a config read from `yaml_file` is: its line there (or in its base), or '--set
    KEY=VALUE' for a key one of `overrides` gives (that replaces what the file has at and under it). None
    without a file: every value then comes from --set."""
    if yaml_file is None:
        return None
    places: KeyPlaces = dict(config_key_places(yaml_file))
    for item in overrides or []:
        key = tuple(item.split("=", 1)[0].strip().split("."))
        places = {k: v for k, v in places.items() if k[: len(key)] != key}
        places[key] = f"--set {item}"
    return places or None


def config_and_problems(raw: dict[str, Any] | None, yaml_file: Path | None = None,
                        overrides: list[str] | None = None) -> tuple[RunConfig | None, list[str]]:  # fmt: skip
    """The config of `raw` and every validation problem (one line each, with its line in `yaml_file` or the
    --set of `overrides` that gave it). With problems, the config has the fields at fault left at their
    defaults, so that the checks that come after validation still run and report theirs in the same list
    (None when even that does not validate)."""
    try:
        return RunConfig.model_validate(raw or {}), []
    except ValidationError as err:  # only now re-read the files for where each key is
        problems = problem_lines(err, key_places(yaml_file, overrides))
        partial = copy.deepcopy(raw or {})
        for _ in range(3):  # a default may make a cross-field check fail in turn: drop that field too
            dropped = [_drop(partial, [str(p) for p in e["loc"] if not _is_union_tag(p)]) for e in err.errors()]
            if not any(dropped):
                return None, problems
            try:
                return RunConfig.model_validate(partial), problems
            except ValidationError as again:
                err = again
        return None, problems


def _drop(raw: dict[str, Any], loc: list[str]) -> bool:
    """Remove the value at `loc` (or the nearest part of it `raw` has) from `raw`; whether anything went."""
    node: Any = raw
    for part in loc[:-1]:
        if not isinstance(node, dict) or part not in node:
            break
        if not isinstance(node[part], dict):
            del node[part]
            return True
        node = node[part]
    else:
        if loc and isinstance(node, dict) and loc[-1] in node:
            del node[loc[-1]]
            return True
    return False


def read_yaml_mapping(path: str | Path, flag: str, examples: str, top: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (empty file: {}); ConfigError naming `flag` when the file is
    missing (see `examples`), not YAML (with the line), or not a mapping of `top`."""
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "no such file"
        raise ConfigError(f"{flag} {p}: {what}; see {examples} for examples")
    try:
        loaded = yaml.safe_load(p.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {p}: not a text file; give a YAML file (see {examples})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}:{where} not valid YAML ({problem})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of {top}")
    if twice := duplicate_key(p.read_text()):
        key, line, first = twice
        raise ConfigError(f"{p} line {line}: {key} is given twice (also at line {first}); YAML keeps only the last, "
                          "so keep the one you mean and delete the other")  # fmt: skip
    return loaded or {}


def duplicate_key(text: str) -> tuple[str, int, int] | None:
    """(dotted key, its line, the line of its first occurrence) of the first key a mapping of YAML `text` gives
    twice (None: none does). YAML loaders keep the last silently; a merge key (<<) may repeat."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    todo: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    while todo:
        node, path = todo.pop(0)
        if isinstance(node, yaml.SequenceNode):
            todo += [(item, (*path, str(i))) for i, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode):
            continue
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                return ".".join((*path, key.value)), line, seen[key.value]
            seen[key.value] = line
            todo.append((value, (*path, key.value)))
    return None


def read_run_config(path: str | Path) -> dict[str, Any]:
    """A run config file as a raw mapping, its `base:` chain resolved: the base file (a path relative to the
    folder of the file naming it, or absolute; it may name a base of its own) is read first and the file's own
    keys are merged over it (mappings key by key; lists and values replace). ConfigError, one line naming the
    file and the fix, for a base that is missing, not a path, or part of a cycle."""
    return _resolve_bases(Path(path), ())[0]


def config_key_places(path: str | Path) -> KeyPlaces:
    """Where each key of run config file `path` is: its own line, or 'BASE line N' for a key its bases give."""
    return _resolve_bases(Path(path), ())[1]


def _resolve_bases(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], KeyPlaces]:
    """`path`'s mapping merged over its bases', and where each key is (see read_run_config); `chain`: the
    files that named this one as their base, first to last."""
    raw = read_yaml_mapping(path, "--config", "configs/", "sections (method, data, net, ...)")
    places: KeyPlaces = dict(yaml_key_lines(path.read_text()))
    if "base" not in raw:
        return raw, places
    base, line = raw.pop("base"), places.pop(("base",), None)
    at = f"{path} line {line}" if line is not None else str(path)
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{at}: base: {base!r} is not a file path; give the YAML file this config starts from, "
                          "e.g. base: text.yaml")  # fmt: skip
    target, seen = path.parent / base, (*chain, path)
    if any(target.resolve() == p.resolve() for p in seen):
        cycle = " -> ".join(str(p) for p in (*seen, target))
        raise ConfigError(f"{at}: base: {base} makes a cycle ({cycle}); remove the base: that leads back")
    if not target.is_file():
        what = "is a folder, not a file" if target.is_dir() else "no such file"
        raise ConfigError(f"{at}: base: {target}: {what}; give a YAML file relative to {path.parent} "
                          "(this file's folder) or an absolute path")  # fmt: skip
    under, under_places = _resolve_bases(target, seen)
    kept = {key: f"{target} line {place}" if isinstance(place, int) else place
            for key, place in under_places.items() if not _replaced_by(raw, key)}  # fmt: skip
    return merge_mappings(under, raw), {**kept, **places}


def merge_mappings(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged onto a copy of `under`: mappings key by key, anything else (lists, values) replaced."""
    out = copy.deepcopy(under)
    for key, value in over.items():
        mine = out.get(key)
        out[key] = (
            merge_mappings(mine, value) if isinstance(value, dict) and isinstance(mine, dict) else copy.deepcopy(value)
        )
    return out


def _replaced_by(raw: dict[str, Any], key: tuple[str, ...]) -> bool:
    """Whether `raw` gives `key` or a value (not a mapping) above it, so that a base's `key` is not used."""
    node: Any = raw
    for part in key:
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML file (or nothing: all defaults) with its `base:` chain (see read_run_config), apply --set
    overrides (and GROWPIPE_SET's after them), validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_run_config(path)
    overrides = [*(overrides or []), *extra_overrides()]
    raw = apply_overrides(raw, overrides)
    return build_config(raw, str(path) if path is not None else "defaults", Path(path) if path is not None else None,
                        overrides)  # fmt: skip


def dump_config(cfg: RunConfig) -> str:
    """The config as YAML that load_config accepts."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
