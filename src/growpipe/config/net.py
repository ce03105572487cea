"""What a block is built from: the backbone (net), the optimizer (train), AL's and SCPL's settings, and
RuleSettings, the part of a run config nn/ reads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from growpipe.config.base import Strict


class NetSpec(Strict):
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


class LRScheduleSpec(Strict):
    """Each block's learning rate over its own training steps (one per mini-batch it trains on, counted from
    the moment the block is built: a block appended by a growth warms up and decays on its own clock)."""

    warmup_steps: int = Field(0, ge=0)
    """Steps over which the rate rises linearly from lr / warmup_steps to lr (0: no warm-up)."""
    decay: Literal["none", "cosine", "linear"] = "none"
    """After the warm-up, the rate falls from lr to lr * min_factor over decay_steps steps, then stays there."""
    decay_steps: int | None = Field(None, ge=1)
    """Steps the decay takes (needed with a decay); an epoch is ceil(training rows / data.batch_size) steps."""
    min_factor: float = Field(0.0, ge=0.0, le=1.0)
    """The rate at the end of the decay, as a fraction of lr."""

    @model_validator(mode="after")
    def _decay_needs_steps(self) -> LRScheduleSpec:
        if self.decay != "none" and self.decay_steps is None:
            raise ValueError(f"decay {self.decay} needs decay_steps: the steps it takes, e.g. 1000")
        return self

    def is_flat(self) -> bool:
        """True when the rate stays lr throughout (no warm-up, no decay)."""
        return self.warmup_steps == 0 and self.decay == "none"


class OptimSpec(Strict):
    """Optimizer settings shared by every block."""

    epochs: int = Field(10, ge=0)
    """Epochs for the initial blocks, before any growth step."""
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    """The optimizer of every block (one per independent part of a block)."""
    lr: float = Field(1e-3, gt=0)
    """Learning rate."""
    lr_schedule: LRScheduleSpec = LRScheduleSpec()
    """Each block's rate over its own steps: warm-up and decay (off by default: lr throughout)."""
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


class ALSpec(Strict):
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


class SCPLSpec(Strict):
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


class RuleSettings(Strict):
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
