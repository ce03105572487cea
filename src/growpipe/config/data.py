"""The data section: which dataset, its feature groups, normalisation and batching."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from growpipe.config.base import Strict

DATASET_NAMES = ("digits", "fashion-mnist", "20newsgroups", "cifar10", "cifar100")
DATASET_PREFIXES = ("hf:", "parquet:", "csv:", "json:", "imagefolder:")


class FeatureGroupsSpec(Strict):
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


class NormalizeSpec(Strict):
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


class DataSpec(Strict):
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
    adapt: bool = False
    """Text: choose the recipe's data-dependent settings from the training split (growpipe/text_recipe.py; the
    same for every rule): a set whose median document has at most 32 words (short text) reads word pairs too
    (data.ngrams 2) and trains without word dropout (net.word_dropout 0); a longer one keeps the configured
    values. Printed with the data's summary; the result's data records it."""
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
