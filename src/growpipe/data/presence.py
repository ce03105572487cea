"""Whether a run's data is there, looked for from this process before any actor starts: the folders and files
its first stage will open, found without reading them, but for what is cheap to read: a table file's header or
parquet footer (a damaged file) and a parquet training file's label column (one class only). Otherwise these are
found only once the stage actors run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from growpipe.config import DataSpec
from growpipe.data import sources
from growpipe.data.bundle import one_class_problem
from growpipe.data.images import open_fs
from growpipe.data.sources import unreadable
from growpipe.errors import DataError


def data_problem(spec: DataSpec) -> str | None:
    """Why the data `spec` names cannot be found from here (None: it is found, or only reading it can tell:
    the bundled digits, a download, a Hugging Face Hub name)."""
    try:
        find_data(spec)
    except DataError as e:
        return str(e)
    return None


def find_data(spec: DataSpec) -> None:
    """Raise the DataNotFoundError the loader of `spec` would, without reading the data."""
    name = spec.name
    if name == "fashion-mnist" and not spec.download:
        sources.locate(spec, name, list(sources.FASHION_FILES.values()), sources.FASHION_SYSTEM_DIRS)
    elif name == "20newsgroups":
        root = sources.locate(spec, name, sources.NEWSGROUPS_FILES)
        check_parquet_labels(str(root / "train.parquet"), spec.label_column)
    elif name.startswith(("parquet:", "csv:", "json:")):
        fs, found, _ = sources.peek_table_files(name)  # a damaged file named here, not mid-run
        if name.startswith("parquet:"):
            check_parquet_labels(found["train"], spec.label_column, fs)
    elif name.startswith("imagefolder:"):
        uri = name.removeprefix("imagefolder:")
        fs, folder = open_fs(uri)
        if not fs.isdir(folder):
            raise DataError(f"data.name: {uri} is not a directory; give imagefolder:DIR with train/CLASS/*.png and "
                            "test/CLASS/*.png")  # fmt: skip
    elif name.startswith("hf:"):
        local = name.removeprefix("hf:")
        if local.startswith(("/", "./", "../", "~")) and not Path(local).expanduser().is_dir():
            raise DataError(f"data.name: {local} is not a directory; give hf:DIR of a saved dataset or a Hub name")


def check_parquet_labels(path: str, label: str, fs: Any = None) -> None:
    """DataError when the training file `path` holds one class only (read: its label column alone); a file
    without that column is left to the loader, which names it."""
    try:
        with fs.open(path, "rb") if fs is not None else open(path, "rb") as f:
            table = pq.ParquetFile(f)
            if label not in table.schema_arrow.names:
                return
            labels = table.read(columns=[label]).column(0).drop_null().to_numpy()
    except (OSError, ValueError) as e:
        raise DataError(unreadable(path, "parquet", e)) from None
    if why := one_class_problem(labels, path):
        raise DataError(why)


KNOWN_INPUTS = {"digits": ((1, 8, 8), 10, 1347), "fashion-mnist": ((1, 28, 28), 10, 60000),
                "cifar10": ((3, 32, 32), 10, 50000), "cifar100": ((3, 32, 32), 100, 50000),
                "20newsgroups": ((4,), 20, 11293)}  # fmt: skip
"""Per-sample input shape, classes and training rows of the named datasets (text: the least width, 4 tokens)."""


def planned_input(spec: DataSpec, backbone: str) -> tuple[tuple[int, ...], str, int, int, int]:
    """(per-sample shape, dtype, classes, vocabulary size, training rows) of the data `spec` names as far as
    the config and `backbone` tell without reading it, each at most what the data will give: a named dataset's
    own; else data.image_shape, or data.image_size with data.channels; else for a text backbone 4 tokens of a
    3-word vocabulary, for an image backbone 8x8 images, else 1 feature; training rows 1 unless known."""
    text = backbone in ("embedding", "lstm", "transformer")
    shape, classes, rows = KNOWN_INPUTS.get(spec.name, ((1,), 2, 1))
    if spec.name not in KNOWN_INPUTS:
        if spec.image_shape is not None:
            shape = tuple(spec.image_shape)
        elif spec.image_size is not None or backbone in ("cnn", "resnet18"):
            shape = (spec.channels or 1, *(spec.image_size or (8, 8)))
        elif text:
            shape = (4,)
    vocab = min(spec.vocab_size, 20000 if spec.name == "20newsgroups" else 3) if text else 0
    if text and spec.ngrams > 1:
        shape = (2 * shape[0] - 1,)
    rows = min(rows, spec.limit_train) if spec.limit_train else rows
    return shape, "long" if text else "float", spec.num_classes or classes, vocab, rows
