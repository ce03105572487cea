"""In-memory datasets, their standardisation (normalise), feature groups and the order of an epoch's batches
(read by `data.batches`).

A loader returns a DataBundle: train and test splits as tensors, the number of classes, and (after
`apply_feature_groups`) the main input plus every side feature group that feature blocks may ask for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from growpipe.config import DataSpec, FeatureGroupsSpec
from growpipe.data.checks import Origin
from growpipe.data.moments import standardise, stats_sample, tensor_stats, unstandardise
from growpipe.data.text import Vocab
from growpipe.errors import DataError
from growpipe.nn.packet import Packet
from growpipe.text_recipe import TextChoice


@dataclass
class Split:
    """One split: inputs `x` (float features or long token ids in memory, or DiskRows read from disk a
    batch at a time), labels `y`, side feature groups."""

    x: Any
    y: torch.Tensor
    side: dict[str, torch.Tensor] = field(default_factory=dict)
    augment: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None
    """Training augmentation (data.augment): applied by `inputs` when given the epoch."""
    text: np.ndarray | None = None
    """Each row's raw text (a text set loaded with load_data(keep_text=True): the classical baseline's
    input), else None."""

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def streamed(self) -> bool:
        """Read from disk a batch at a time (not one tensor in memory)."""
        return not torch.is_tensor(self.x)

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-sample input shape."""
        return tuple(self.x.shape) if self.streamed else tuple(self.x.shape[1:])

    def inputs(self, idx: torch.Tensor, epoch: int | None = None) -> torch.Tensor:
        """The inputs of samples `idx`; augmented as epoch `epoch` draws when the split has augmentation."""
        x = self.x.tensor(idx) if self.streamed else self.x[idx]
        return self._augmented(x, idx, epoch)

    def batch(self, idx: torch.Tensor, epoch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels of samples `idx` for training (see `read`)."""
        x, y, _ = self.read(idx, epoch)
        return x, y

    def read(self, idx: torch.Tensor, epoch: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs, labels and which samples they are of `idx`: a split read from disk with data.skip_bad_files
        leaves out the rows whose files no longer decode (else the first one stops the run, named)."""
        if not (self.streamed and self.x.spec.skip_bad_files):
            return self.inputs(idx, epoch), self.y[idx], idx
        x, idx = self.x.tensor_skipping(idx)
        return self._augmented(x, idx, epoch), self.y[idx], idx

    def _augmented(self, x: torch.Tensor, idx: torch.Tensor, epoch: int | None) -> torch.Tensor:
        return self.augment(x, idx, epoch) if self.augment is not None and epoch is not None else x


EXAMPLE_ROWS = 3
"""Test rows a run keeps as its model's input example."""


@dataclass
class DataBundle:
    """A dataset ready for training: splits, label space and input description."""

    name: str
    kind: str  # image | tabular | text
    train: Split
    test: Split
    num_classes: int
    class_names: list[str]
    vocab: Vocab | None = None
    val: Split | None = None
    """Held-out part of the training data (data.val_fraction), or None."""
    notes: list[str] = field(default_factory=list)
    """What loading left out or changed (e.g. dropped columns), printed with the summary."""
    source: str = ""
    """Where the data came from (dataset name, directory or hub name), for the run's record."""
    normalize: dict[str, list[float]] | None = None
    """The per-channel (per-feature) mean and std the inputs were standardised with (None: as read)."""
    text_choice: TextChoice | None = None
    """Text with data.adapt: the recipe's choices from the training split (growpipe.text_recipe)."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.train.shape

    @property
    def input_dtype(self) -> str:
        return "float" if self.train.streamed else "long" if self.train.x.dtype == torch.long else "float"

    def side_shape(self, group: str) -> tuple[int, ...]:
        """Per-sample shape of a side feature group."""
        return tuple(self.train.side[group].shape[1:])

    def side_dtype(self, group: str) -> str:
        return "long" if self.train.side[group].dtype == torch.long else "float"

    def describe(self) -> dict[str, object]:
        """The bundle as a run records it: its summary line, name, source, per split rows and digest, and
        `example_rows` (a model's input example)."""
        splits = {"train": self.train, "val": self.val, "test": self.test}
        return {
            "summary": self.summary(),
            "name": self.name,
            "source": self.source or self.name,
            "kind": self.kind,
            "splits": {k: {"rows": len(v), "digest": digest(v)} for k, v in splits.items() if v is not None},
            "example_rows": self.example_rows(),
        }

    def example_rows(self, n: int = EXAMPLE_ROWS) -> list[Any]:
        """The first `n` test rows as a trained model takes them: as read, before standardisation (nested
        lists of the input shape, floats to 6 decimals: undoing the standardisation leaves float32 rounding
        such as -2e-08 for 0; token ids for text)."""
        x = self.test.inputs(torch.arange(min(n, len(self.test))))
        if x.dtype == torch.long:
            return x.tolist()
        return (np.round(unstandardise(x, self.normalize, 1).double().numpy(), 6) + 0.0).tolist()  # no -0.0

    def summary(self) -> str:
        """One line describing the bundle."""
        groups = f", side groups {sorted(self.train.side)}" if self.train.side else ""
        vocab = f", vocab {len(self.vocab)}" if self.vocab else ""
        vocab += ", read from disk per batch" if self.train.streamed else ""
        notes = f"; {self.text_choice.describe()}" if self.text_choice is not None else ""
        notes += "".join(f"; warning: {n}" for n in self.notes)
        return (
            f"{self.name}: {self.kind}, train {len(self.train)}, "
            f"{f'val {len(self.val)}, ' if self.val is not None else ''}test {len(self.test)}, "
            f"{self.num_classes} classes, input {self.input_shape} {self.input_dtype}{vocab}{groups}{notes}"
        )


def digest(split: Split) -> str:
    """A short content hash of a split (inputs and labels): equal digests, equal data."""
    h = hashlib.sha256()
    if split.streamed:
        h.update(split.x.fingerprint().encode())
    for t in ([] if split.streamed else [split.x]) + [split.y]:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def check_labels(y_train: np.ndarray, y_test: np.ndarray, num_classes: int | None, source: str,
                 origins: dict[str, Origin] | None = None) -> int:  # fmt: skip
    """Validate integer labels and return the number of classes; a label out of range is named with its row
    when `origins` tells where each split's rows come from."""
    for split, y in (("train", y_train), ("test", y_test)):
        if len(y) == 0:
            raise DataError(f"{source}: the {split} split is empty; point data.root at a directory with data")
    classes = num_classes if num_classes is not None else int(y_train.max()) + 1
    seen = len(np.unique(y_train))
    if num_classes is None and seen < classes / 2:  # e.g. labels 0, 1, 2 and one 99: 100 classes, 96 empty
        raise DataError(
            f"{source}: labels run up to {classes - 1} but only {seen} distinct classes appear in the train split "
            f"({classes - seen} of {classes} classes would have no sample); relabel them 0..{seen - 1}, or set "
            "data.num_classes if that many classes are meant"
        )
    for split, y in (("train", y_train), ("test", y_test)):
        bad = np.flatnonzero((y < 0) | (y >= classes))
        if len(bad):
            label = int(y[bad[0]])
            where = f"at {origins[split].row(int(bad[0]))}" if origins else f"in the {split} split"
            missing = " (-1 usually marks a missing label)" if label == -1 else ""
            raise DataError(
                f"{source}: label {label} {where} is outside [0, {classes}){missing}; "
                f"relabel to 0..{classes - 1} or set data.num_classes"
            )
    return classes


def one_class_problem(labels: Any, source: str, class_names: list[str] | None = None, hint: str = "") -> str | None:
    """Why training labels `labels` cannot train a classifier: they hold fewer than 2 classes (a net then
    reaches accuracy 1.0 without learning anything); None when they hold 2 or more."""
    seen = np.unique(np.asarray(labels))
    if len(seen) >= 2 or len(labels) == 0:
        return None
    label = seen[0].item() if isinstance(seen[0], np.generic) else seen[0]
    name = class_names[label] if class_names and isinstance(label, int) and 0 <= label < len(class_names) else label
    return (f"data.name: every one of the {len(labels):,} training rows of {source} is of class {name!r}; a "
            f"classifier needs at least 2 classes to learn{hint}: point data.name at data with 2 or more classes, "
            "or relabel it")  # fmt: skip


def limit(split: Split, n: int | None, seed: int = 0) -> Split:
    """The first `n` samples of a fixed seeded permutation (the whole split when n is None)."""
    if n is None or n >= len(split):
        return split
    g = torch.Generator().manual_seed(seed)
    return _take(split, torch.randperm(len(split), generator=g)[:n])


def hold_out(split: Split, fraction: float, seed: int = 1) -> tuple[Split, Split]:
    """(rest, held out): a seeded `fraction` of the samples (at least one) set aside for validation."""
    n_val = max(1, round(len(split) * fraction))
    if n_val >= len(split):
        raise DataError(f"data.val_fraction={fraction:g} leaves no training samples out of {len(split)}; lower it")
    idx = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
    return _take(split, idx[n_val:].sort().values), _take(split, idx[:n_val].sort().values)


def _take(split: Split, idx: torch.Tensor) -> Split:
    x = split.x.take(idx.numpy()) if split.streamed else split.x[idx]
    text = split.text[idx.numpy()] if split.text is not None else None
    return Split(x, split.y[idx], {k: v[idx] for k, v in split.side.items()}, text=text)


def _cut(length: int, count: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, length, count + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _apply_groups_to_split(split: Split, kind: str, spec: FeatureGroupsSpec) -> Split:
    names = spec.names()
    x = split.x
    side: dict[str, torch.Tensor] = {}
    if spec.scheme == "bands":
        if x.dim() != 4:
            raise DataError("data.feature_groups.scheme=bands needs image data (N, C, H, W)")
        cuts = _cut(x.shape[2], spec.count)
        base = x.clone()
        for name, (a, b) in zip(names, cuts, strict=True):
            side[name] = x[:, :, a:b, :].clone()
        base[:, :, cuts[spec.base - 1][1] :, :] = 0
        x = base
    elif spec.scheme == "channels":
        if x.dim() != 4 or x.shape[1] < spec.count:
            raise DataError(
                f"data.feature_groups.scheme=channels needs images with >= {spec.count} channels; "
                f"this data has shape {tuple(x.shape[1:])}"
            )
        cuts = _cut(x.shape[1], spec.count)
        base = x.clone()
        for name, (a, b) in zip(names, cuts, strict=True):
            side[name] = x[:, a:b].clone()
        base[:, cuts[spec.base - 1][1] :] = 0
        x = base
    elif spec.scheme == "columns":
        if x.dim() != 2 or kind != "tabular":
            raise DataError("data.feature_groups.scheme=columns needs tabular data (N, F)")
        cuts = _cut(x.shape[1], spec.count)
        for name, (a, b) in zip(names, cuts, strict=True):
            side[name] = x[:, a:b].clone()
        x = x[:, : cuts[spec.base - 1][1]].clone()
    elif spec.scheme == "chunks":
        if kind != "text":
            raise DataError("data.feature_groups.scheme=chunks needs text data (token ids)")
        cuts = _cut(x.shape[1], spec.count)
        for name, (a, b) in zip(names, cuts, strict=True):
            side[name] = x[:, a:b].clone()
        x = x[:, : cuts[spec.base - 1][1]].clone()
    base_names = set(names[: spec.base])
    return Split(x, split.y, {k: v for k, v in side.items() if k not in base_names})


def apply_feature_groups(bundle: DataBundle, spec: FeatureGroupsSpec) -> DataBundle:
    """Cut the inputs into the declared groups: the main input keeps the base groups only."""
    if spec.scheme == "none":
        return bundle
    if bundle.train.streamed:
        raise DataError("data.feature_groups: feature groups need the data in memory; set data.stream: false")
    bundle.train = _apply_groups_to_split(bundle.train, bundle.kind, spec)
    bundle.test = _apply_groups_to_split(bundle.test, bundle.kind, spec)
    if bundle.val is not None:
        bundle.val = _apply_groups_to_split(bundle.val, bundle.kind, spec)
    return bundle


def batch_order(
    n: int, batch_size: int, *, shuffle: bool, seed: int = 0, epoch: int = 0, start_batch: int = 0
) -> Iterator[tuple[int, torch.Tensor]]:
    """(batch index, sample indices) of an epoch; the order depends only on (seed, epoch) when shuffled."""
    if shuffle:
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    for b, start in enumerate(range(0, n, batch_size)):
        if b >= start_batch:
            yield b, order[start : start + batch_size]


def batch_at(split: Split, batch_size: int, b: int, side_groups: tuple[str, ...] | list[str] = ()) -> Packet:
    """Batch `b` of `split` in its own order, not augmented (evaluation), with each sample's row in the split."""
    x, y, idx = split.read(torch.arange(b * batch_size, min(len(split), (b + 1) * batch_size)))
    return Packet(x=x, y=y, side={g: split.side[g][idx] for g in side_groups}, index=b, rows=idx)


def normalise(bundle: DataBundle, spec: DataSpec, seed: int = 0) -> DataBundle:
    """Check a bounded sample of the rows read from disk (`stats_sample`: data.stats_rows of each split; the
    others are checked as batches read them; unreadable ones skipped with data.skip_bad_files, else named)
    and standardise every split with the training sample's statistics, the given ones (data.normalize), or
    none. Token ids (text) are left as they are."""
    if bundle.kind == "text":
        return bundle
    names = [n for n in ("train", "val", "test") if getattr(bundle, n) is not None]
    scanned = None
    for n in names:
        split = getattr(bundle, n)
        if split.streamed:  # the sampled rows read once; only the training rows' statistics are kept
            rows = stats_sample(len(split), spec.stats_rows, seed)
            measure = n == "train" and spec.normalize == "train"
            stats, bad = split.x.scan(rows, spec.skip_bad_files, measure=measure)
            scanned = stats if n == "train" else scanned
            if bad:
                keep = torch.from_numpy(np.setdiff1d(np.arange(len(split)), bad))
                setattr(bundle, n, Split(split.x.take(keep.numpy()), split.y[keep], augment=split.augment))
                bundle.notes.append(f"{n}: skipped {len(bad)} unreadable image(s) (data.skip_bad_files)")
    train = bundle.train
    if train.streamed:
        for n in names:
            getattr(bundle, n).x.pixels = train.x.pixels  # integer pixels are pixels in every split
    stats = _chosen_stats(train, scanned, spec, bundle.name, seed)
    for n in names:
        split = getattr(bundle, n)
        if split.streamed:
            split.x.stats = stats
        else:
            setattr(bundle, n, Split(standardise(split.x, stats, 1), split.y, split.side, split.augment))
    bundle.normalize = stats
    return bundle


def _chosen_stats(train: Split, scanned: dict[str, list[float]] | None, spec: DataSpec, name: str,
                  seed: int) -> dict[str, list[float]] | None:  # fmt: skip
    norm = spec.normalize
    if norm == "none":
        return None
    if norm == "train":
        if scanned is not None:
            return scanned
        return tensor_stats(train.x, stats_sample(len(train), spec.stats_rows, seed))
    count = train.shape[0]
    if len(norm.mean) != count:
        raise DataError(f"data.normalize: {len(norm.mean)} mean/std value(s) given but {name} has {count} "
                        f"{'channels' if len(train.shape) == 3 else 'features'}; give one per channel")  # fmt: skip
    return {"mean": list(norm.mean), "std": list(norm.std)}
