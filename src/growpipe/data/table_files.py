"""Table files: parquet:/csv:/json:DIR|URI (a train and a test file, local or fsspec URIs, read by Hugging Face
datasets; streamed from disk when data.stream) and 20 Newsgroups' parquet files; each file checked cheaply
(header, footer) first."""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from growpipe.config import DataSpec
from growpipe.data.assemble import streamed_bundle
from growpipe.data.bundle import DataBundle
from growpipe.data.checks import Origin, check_columns, dropped_columns_note
from growpipe.data.frames import frames_to_bundle
from growpipe.data.images import open_fs
from growpipe.data.labels import check_label_column, class_labels, columns_frame
from growpipe.data.locate import locate
from growpipe.data.stream import ColumnsSource
from growpipe.errors import DataError, DataNotFoundError

if TYPE_CHECKING:
    import pandas as pd

NEWSGROUPS_FILES = ["train.parquet", "test.parquet"]


def load_newsgroups(spec: DataSpec) -> DataBundle:
    """20 Newsgroups from train.parquet / test.parquet (columns text, label, label_name)."""
    root = locate(spec, "20newsgroups", NEWSGROUPS_FILES)
    origins = {s: Origin.of_file(str(root / f"{s}.parquet"), s) for s in ("train", "test")}
    train, test = (_read_parquet(origins[s].place) for s in ("train", "test"))
    return frames_to_bundle("20newsgroups", train, test, spec, origins)


def _read_parquet(path: str) -> pd.DataFrame:
    """A parquet file as a frame; DataError naming the file when it is not a whole parquet file."""
    import pandas as pd  # lazy: about 0.4 s, only for table data

    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise DataError(unreadable(path, "parquet", e)) from None


def unreadable(path: str, fmt: str, error: Exception) -> str:
    """The line that says file `path` cannot be read as `fmt` (a damaged or truncated file, or another format)."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return f"{path}: not a readable {fmt} file ({first}); replace it with a whole {fmt} file (copy or export it again)"


def load_files(spec: DataSpec) -> DataBundle:
    """parquet:/csv:/json:DIR|URI — a directory (or file://, s3://, gs:// URI) with train.EXT and test.EXT, read
    by Hugging Face datasets."""
    fmt, _, uri = spec.name.partition(":")
    fs, found, columns = peek_table_files(spec.name)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    files, lacking = {}, []
    for split, path in found.items():
        files[split] = path if local else fs.unstrip_protocol(path)
    if columns["train"] is not None and columns["test"] is not None:
        extra = [c for c in columns["test"] if c not in columns["train"]]
        if extra:  # datasets cannot cast the test file to the train file's columns
            raise DataError(f"{spec.name}: column {extra[0]!r} is in {files['test']} but not in {files['train']}; "
                            "give both files the same columns")  # fmt: skip
        lacking = [c for c in columns["train"] if c not in columns["test"]]
    import datasets

    try:
        ds = datasets.load_dataset(fmt, data_files=files)
    except Exception as e:  # datasets wraps parser errors in several types
        cause = str(e.__cause__ or e)
        why = "the train and test files have different columns" if "column names don't match" in cause else cause
        if fmt == "parquet" and (damaged := _damaged_parquet(fs, found)):
            raise DataError(damaged) from None
        raise DataError(f"data.name: cannot read {uri} as {fmt} ({why.splitlines()[0]})") from None
    if lacking:  # datasets fills them in blank: left out, so that a column read from both is named as missing
        ds["test"] = ds["test"].remove_columns(lacking)
    origins = {s: Origin.of_file(f, s) for s, f in files.items()}
    if spec.stream:
        return _streamed_table(spec.name, ds["train"], ds["test"], spec, origins)
    return frames_to_bundle(spec.name, ds["train"].to_pandas(), ds["test"].to_pandas(), spec, origins)


def find_table_files(name: str) -> tuple[Any, dict[str, str]]:
    """(filesystem, {"train": path, "test": path}) of a parquet:/csv:/json: dataset `name`; DataNotFoundError
    when its folder or a split's file is not there."""
    fmt, _, uri = name.partition(":")
    fs, root = open_fs(uri)
    if not fs.isdir(root):
        raise DataNotFoundError(f"data.name: {uri} is not a directory; give {fmt}:DIR with train.{fmt} and test.{fmt}")
    exts = {"parquet": ["parquet"], "csv": ["csv"], "json": ["json", "jsonl"]}[fmt]
    found = {}
    for split in ("train", "test"):
        hits = [f"{root}/{split}.{e}" for e in exts if fs.isfile(f"{root}/{split}.{e}")]
        folders = [f"{uri.rstrip('/')}/{split}.{e}" for e in exts if fs.isdir(f"{root}/{split}.{e}")]
        if not hits and folders:
            raise DataError(f"data.name: {folders[0]} is a folder, not a file; growpipe reads one {split}.{exts[0]} "
                            f"file per split: write the split as a single file there (e.g. join a partitioned "
                            f"dataset's parts into one)")  # fmt: skip
        if not hits:
            raise DataNotFoundError(f"data.name: {uri} has no {split}.{exts[0]}; add it or point at the right folder")
        found[split] = hits[0]
    return fs, found


def _damaged_parquet(fs: Any, found: dict[str, str]) -> str | None:
    """The line naming the first of the `found` parquet files whose data cannot be read whole (None: each can)."""
    for path in found.values():
        try:
            with fs.open(path, "rb") as f:
                pq.read_table(f)
        except (OSError, ValueError) as e:
            return unreadable(path, "parquet", e)
    return None


def peek_table_files(name: str) -> tuple[Any, dict[str, str], dict[str, list[str] | None]]:
    """(filesystem, each split's file, each split's columns where cheap to read) of a parquet:/csv:/json: dataset
    `name`, read no further than a parquet footer or a CSV header; DataError naming the file when one is missing,
    has no rows, or is not a file of its format."""
    fmt = name.partition(":")[0]
    fs, found = find_table_files(name)
    columns = {}
    for split, path in found.items():
        try:
            empty, columns[split] = _peek(fs, path, fmt)
        except (OSError, ValueError) as e:
            raise DataError(unreadable(path, fmt, e)) from None
        if empty:
            raise DataError(f"{name}: the {split} split is empty ({path} has no rows); add data to it")
    return fs, found, columns


def _peek(fs: Any, path: str, fmt: str) -> tuple[bool, list[str] | None]:
    """Whether a file has no rows, and its column names where they are cheap to read (a CSV header, a parquet
    schema; None for JSON)."""
    if fmt == "parquet":
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f)
            return meta.metadata.num_rows == 0, list(meta.schema_arrow.names)
    with fs.open(path, "r", encoding="utf-8-sig", errors="replace") as f:
        lines = [ln for ln in (f.readline() for _ in range(3)) if ln.strip()]
    if fmt == "csv":
        return len(lines) <= 1, next(csv.reader(lines[:1]), None)
    return not lines or lines[0].strip() in ("[]", "{}"), None


def _streamed_table(name: str, train: Any, test: Any, spec: DataSpec, origins: dict[str, Origin]) -> DataBundle:
    """parquet/csv/json (memory-mapped Arrow) read per batch: its number and number-list columns."""
    import datasets

    label = spec.label_column
    for split, ds in (("train", train), ("test", test)):
        check_label_column(ds.column_names, label, origins[split], name)
    if spec.text_column in train.column_names:
        raise DataError(f"data.stream: {name} has a text column ({spec.text_column!r}), tokenised in memory; set "
                        "data.stream: false")  # fmt: skip

    def numeric(f: Any) -> bool:
        f = getattr(f, "feature", f)  # a list column: its items
        return isinstance(f, datasets.Value) and (f.dtype.startswith(("int", "uint", "float")) or f.dtype == "double")

    others = [c for c in train.column_names if c not in (label, "label_name")]
    feats = [c for c in others if numeric(train.features[c])]
    if not feats:
        raise DataError(f"{name}: no numeric feature columns to stream; set data.stream: false")
    check_columns(feats, test.column_names, origins, name)
    ftr, fte = (columns_frame(ds, [c for c in (label, "label_name") if c in ds.column_names]) for ds in (train, test))
    ytr, yte, names = class_labels(ftr, fte, spec, name, origins)
    sources = {s: ColumnsSource(ds, feats, origins[s]) for s, ds in (("train", train), ("test", test))}
    notes = dropped_columns_note([c for c in others if c not in feats])
    return streamed_bundle(name, sources, {"train": ytr.numpy(), "test": yte.numpy()}, names, spec, notes)
