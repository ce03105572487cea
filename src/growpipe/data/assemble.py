"""A DataBundle from what a source read: arrays in memory (`image_bundle`) or rows left on disk and read a batch
at a time (`streamed_bundle`). Every source family builds its bundle through these."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from growpipe.config import DataSpec
from growpipe.data.bundle import DataBundle, Split, check_labels
from growpipe.data.moments import unit_float
from growpipe.data.stream import DiskRows
from growpipe.errors import DataError


def image_bundle(name, xtr, ytr, xte, yte, class_names, spec: DataSpec, notes: list[str] | None = None) -> DataBundle:
    """Images (N, C, H, W: uint8, or floats in [0, 1]) as floats in [0, 1]; `load_data` standardises them."""
    classes = check_labels(np.asarray(ytr), np.asarray(yte), spec.num_classes or len(class_names), name)
    return DataBundle(
        name=name,
        kind="image",
        train=Split(unit_float(xtr), torch.as_tensor(ytr, dtype=torch.long)),
        test=Split(unit_float(xte), torch.as_tensor(yte, dtype=torch.long)),
        num_classes=classes,
        class_names=list(class_names)[:classes],
        notes=list(notes or []),
    )


def streamed_bundle(name: str, sources: dict[str, Any], labels: dict[str, np.ndarray], class_names: list[str],
                    spec: DataSpec, notes: list[str] | None = None) -> DataBundle:  # fmt: skip
    """A bundle whose inputs stay on disk, read a batch at a time; `load_data` then checks every row it keeps
    (images decode to one mode and size, numbers are numbers) in one pass that also gives the statistics."""
    classes = check_labels(labels["train"], labels["test"], spec.num_classes or len(class_names), name)
    rows = {}
    for split, source in sources.items():
        positions = np.arange(len(labels[split]))
        shape = _first_shape(DiskRows(source, positions, spec, name, ()), spec, split)
        rows[split] = DiskRows(source, positions, spec, name, shape)
    if rows["test"].shape != rows["train"].shape:
        raise DataError(f"{name}: test rows are {rows['test'].shape} but train rows {rows['train'].shape}; set "
                        "data.image_size and data.channels (images) or fix the data")  # fmt: skip
    return DataBundle(
        name=name,
        kind="image" if len(rows["train"].shape) == 3 else "tabular",
        train=Split(rows["train"], torch.from_numpy(labels["train"])),
        test=Split(rows["test"], torch.from_numpy(labels["test"])),
        num_classes=classes,
        class_names=list(class_names)[:classes],
        notes=list(notes or []),
    )


def _first_shape(rows: DiskRows, spec: DataSpec, split: str) -> tuple[int, ...]:
    """The per-row shape: of the first image that decodes (the first one, unless bad files are skipped), or
    of the number columns (data.image_shape when set)."""
    for i in range(len(rows)):
        try:
            shape = tuple(rows.read([i]).shape[1:])
        except DataError:
            if not spec.skip_bad_files:
                raise
            continue
        if len(shape) == 1 and spec.image_shape is not None:
            if int(np.prod(spec.image_shape)) != shape[0]:
                raise DataError(f"data.image_shape: {spec.image_shape} holds {int(np.prod(spec.image_shape))} "
                                f"values but {rows.name}'s rows have {shape[0]}; give [channels, height, width] of "
                                "that many")  # fmt: skip
            return tuple(spec.image_shape)
        return shape
    raise DataError(f"{rows.name}: no row of the {split} split can be read; check the files")
