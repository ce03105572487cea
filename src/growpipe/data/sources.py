"""Readers for each data source: bundled digits, IDX files, CIFAR, parquet text, Hugging Face datasets."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from growpipe import envvars
from growpipe.config import DataSpec
from growpipe.data.bundle import DataBundle, Split, check_labels
from growpipe.data.checks import Origin, check_columns, column_array, dropped_columns_note
from growpipe.data.images import open_fs, open_image, read_folder_images, scan_folder, stack_images
from growpipe.data.moments import unit_float
from growpipe.data.stream import ArrowSource, ColumnsSource, DiskRows, FolderSource
from growpipe.data.text import Vocab, kept_length
from growpipe.errors import DataError, DataNotFoundError

if TYPE_CHECKING:
    import pandas as pd

FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
FASHION_FILES = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}
FASHION_SYSTEM_DIRS = ("/usr/share/datasets/fashion-mnist",)
NEWSGROUPS_FILES = ["train.parquet", "test.parquet"]


def candidate_dirs(name: str, system_dirs: tuple[str, ...] = ()) -> list[Path]:
    """Where a dataset called `name` may live: $GROWPIPE_DATA_DIR, any ../shared/data above cwd or
    this package, then system directories."""
    out: list[Path] = []
    env = envvars.data_dir()
    if env:
        out.append(Path(env) / name)
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in (start, *start.parents):
            out.append(parent / "shared" / "data" / name)
    out.extend(Path(d) for d in system_dirs)
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def locate(spec: DataSpec, name: str, must_have: list[str], system_dirs: tuple[str, ...] = ()) -> Path:
    """The directory holding `must_have` files: data.root if set, else the first candidate that has them."""
    if spec.root is not None:
        root = Path(spec.root).expanduser()
        if not root.is_dir():
            raise DataNotFoundError(f"data.root: {root} does not exist; point it at the directory of the {name} files")
        missing = [f for f in must_have if not (root / f).is_file()]
        if missing:
            raise DataNotFoundError(f"data.root: {root} lacks {', '.join(missing)}; point it at the {name} directory")
        return root
    tried = candidate_dirs(name, system_dirs)
    for d in tried:
        if all((d / f).is_file() for f in must_have):
            return d
    shown = ", ".join(str(p) for p in [*tried[:2], *map(Path, system_dirs)])
    raise DataNotFoundError(
        f"data: no {name} files found (looked in {shown}, ...); set data.root or ${envvars.GROWPIPE_DATA_DIR}"
    )


# ---- images -------------------------------------------------------------------------------------------


DIGITS_SPLIT = Path(__file__).with_name("digits_split.npz")
"""Row order of the digits split: train_test_split(test_size=0.25, random_state=0, stratify=target), stored
so that no process has to import scikit-learn (seconds of every stage actor's start-up) to get it."""


def load_digits_bundle(spec: DataSpec) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1,797 images), a fixed stratified 75/25 split."""
    pixels, target = digits_rows()
    split = np.load(DIGITS_SPLIT, allow_pickle=False)
    x = pixels.reshape(-1, 1, 8, 8).astype(np.float32) / 16.0
    y = target.astype(np.int64)
    tr, te = split["train"].astype(np.int64), split["test"].astype(np.int64)
    return _image_bundle("digits", x[tr], y[tr], x[te], y[te], [str(i) for i in range(10)], spec)


def digits_rows() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (1,797 x 64, values 0-16) and labels from scikit-learn's bundled CSV, read the way
    its load_digits reads it but without importing scikit-learn; load_digits itself when the file moved."""
    import importlib.util

    found = importlib.util.find_spec("sklearn")
    where = list(found.submodule_search_locations or []) if found else []
    csv = Path(where[0], "datasets", "data", "digits.csv.gz") if where else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data, d.target
    raw = np.loadtxt(csv, delimiter=",")
    return raw[:, :-1], raw[:, -1].astype(np.int64)


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzipped or not) into a uint8 array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e}); re-copy the file") from None
    if len(raw) < 4:
        raise DataError(f"{path}: too short to be an IDX file")
    zero, dtype_code, ndim = raw[0:2], raw[2], raw[3]
    if zero != b"\x00\x00" or dtype_code != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {dims} but holds {data.size} bytes; the file is truncated")
    return data.reshape(dims)


def load_fashion_mnist(spec: DataSpec) -> DataBundle:
    """Fashion-MNIST from the four IDX .gz files (or torchvision's download when data.download)."""
    try:
        root = locate(spec, "fashion-mnist", list(FASHION_FILES.values()), FASHION_SYSTEM_DIRS)
    except DataError:
        if not spec.download:
            raise
        root = _torchvision_fashion_download(spec)
    arr = {k: read_idx(root / f) for k, f in FASHION_FILES.items()}
    for split in ("train", "test"):
        if len(arr[f"{split}_x"]) != len(arr[f"{split}_y"]):
            raise DataError(f"{root}: {split} images and labels differ in count; re-copy the files")
    xtr, xte = arr["train_x"][:, None], arr["test_x"][:, None]  # uint8: made floats like streamed pixels
    ytr, yte = arr["train_y"].astype(np.int64), arr["test_y"].astype(np.int64)
    return _image_bundle("fashion-mnist", xtr, ytr, xte, yte, FASHION_CLASSES, spec)


def _torchvision_fashion_download(spec: DataSpec) -> Path:
    from torchvision.datasets import FashionMNIST

    root = Path(spec.root or "~/.cache/growpipe").expanduser()
    ds = FashionMNIST(str(root), train=True, download=True)
    return Path(ds.raw_folder)


def load_cifar(spec: DataSpec, classes: int) -> DataBundle:
    """CIFAR-10/100 through torchvision (its python-format batches under data.root)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    base = CIFAR10 if classes == 10 else CIFAR100
    name = f"cifar{classes}"
    verify = spec.verify_checksums

    class _Cifar(base):  # type: ignore[misc, valid-type]
        # torchvision checks each file's MD5 when one is given; None means "exists" (files the tests write).
        if not verify:
            train_list = [[f, None] for f, _ in base.train_list]
            test_list = [[f, None] for f, _ in base.test_list]
            meta = {**base.meta, "md5": None}

    if spec.root is None:
        roots = [p for p in candidate_dirs(name) if p.is_dir()]
        root = roots[0] if roots else Path("~/.cache/growpipe").expanduser() / name
    else:
        root = Path(spec.root).expanduser()
        if not root.is_dir() and not spec.download:
            raise DataNotFoundError(f"data.root: {root} does not exist; point it at the folder of {base.base_folder}/")
    try:
        tr = _Cifar(str(root), train=True, download=spec.download)
        te = _Cifar(str(root), train=False, download=False)
    except RuntimeError as e:
        raise DataError(
            f"data: {name} not usable under {root} ({e}); set data.root to the folder holding "
            f"{base.base_folder}/ or data.download: true"
        ) from None
    xtr = np.asarray(tr.data, dtype=np.float32).transpose(0, 3, 1, 2) / 255.0
    xte = np.asarray(te.data, dtype=np.float32).transpose(0, 3, 1, 2) / 255.0
    return _image_bundle(name, xtr, np.asarray(tr.targets), xte, np.asarray(te.targets), list(tr.classes), spec)


def _image_bundle(name, xtr, ytr, xte, yte, class_names, spec: DataSpec, notes: list[str] | None = None) -> DataBundle:
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


def load_imagefolder(spec: DataSpec) -> DataBundle:
    """imagefolder:DIR|URI — train/CLASS/*.png and test/CLASS/*.png (or validation/), classes in sorted order;
    read from disk per batch unless data.stream is false."""
    uri = spec.name.removeprefix("imagefolder:")
    splits = scan_folder(uri)
    classes = sorted({c for _, c in splits["train"]})
    index = {c: i for i, c in enumerate(classes)}
    if spec.stream is not False:
        sources = {s: FolderSource(uri, [f for f, _ in splits[s]]) for s in ("train", "test")}
        labels = {s: np.array([index[c] for _, c in splits[s]], dtype=np.int64) for s in ("train", "test")}
        return streamed_bundle(spec.name, sources, labels, classes, spec)
    arrays, kept_labels, notes = [], [], []
    for split in ("train", "test"):
        files = [f for f, _ in splits[split]]
        arr, kept, bad = read_folder_images(uri, files, spec, spec.name)
        if bad:
            notes.append(f"{split}: skipped {len(bad)} unreadable image(s) (data.skip_bad_files), e.g. {bad[0]}")
        arrays.append(arr)
        kept_labels.append(np.array([index[splits[split][i][1]] for i in kept], dtype=np.int64))
    return _image_bundle(spec.name, arrays[0], kept_labels[0], arrays[1], kept_labels[1], classes, spec, notes)


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


def _streamed_table(name: str, train: Any, test: Any, spec: DataSpec, origins: dict[str, Origin]) -> DataBundle:
    """parquet/csv/json (memory-mapped Arrow) read per batch: its number and number-list columns."""
    import datasets

    label = spec.label_column
    for split, ds in (("train", train), ("test", test)):
        _check_label_column(ds.column_names, label, origins[split], name)
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
    frames = [_columns_frame(ds, [c for c in (label, "label_name") if c in ds.column_names]) for ds in (train, test)]
    ytr, yte, names = _labels(*frames, spec, name, origins)
    sources = {s: ColumnsSource(ds, feats, origins[s]) for s, ds in (("train", train), ("test", test))}
    notes = dropped_columns_note([c for c in others if c not in feats])
    return streamed_bundle(name, sources, {"train": ytr.numpy(), "test": yte.numpy()}, names, spec, notes)


# ---- tables and text ----------------------------------------------------------------------------------


def load_newsgroups(spec: DataSpec) -> DataBundle:
    """20 Newsgroups from train.parquet / test.parquet (columns text, label, label_name)."""
    root = locate(spec, "20newsgroups", NEWSGROUPS_FILES)
    origins = {s: Origin.of_file(str(root / f"{s}.parquet"), s) for s in ("train", "test")}
    train, test = (_read_parquet(origins[s].place) for s in ("train", "test"))
    return frames_to_bundle("20newsgroups", train, test, spec, origins)


def _read_parquet(path: str) -> pd.DataFrame:
    """A parquet file as a frame; DataError naming the file when it is not a whole parquet file."""
    import pandas as pd

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
    import pyarrow.parquet as pq

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
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f)
            return meta.metadata.num_rows == 0, list(meta.schema_arrow.names)
    with fs.open(path, "r", encoding="utf-8-sig", errors="replace") as f:
        lines = [ln for ln in (f.readline() for _ in range(3)) if ln.strip()]
    if fmt == "csv":
        import csv

        return len(lines) <= 1, next(csv.reader(lines[:1]), None)
    return not lines or lines[0].strip() in ("[]", "{}"), None


def load_hf(spec: DataSpec) -> DataBundle:
    """hf:NAME — a Hub dataset by name, or a local directory (saved with save_to_disk, or loadable)."""
    import datasets

    name = spec.name.removeprefix("hf:")
    local = Path(name).expanduser()
    try:
        if (local / "dataset_dict.json").is_file():
            ds = datasets.load_from_disk(str(local))
        else:
            ds = datasets.load_dataset(str(local) if local.is_dir() else name)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise DataNotFoundError(f"data.name: cannot load Hugging Face dataset {name!r} ({first})") from None
    if spec.test_split is not None and spec.test_split not in ds:
        raise DataError(f"data.test_split: {name!r} has no split {spec.test_split!r} (it has {', '.join(ds)}); "
                        "name one of those")  # fmt: skip
    test_name = spec.test_split or next((s for s in ("test", "validation") if s in ds), None)
    if "train" not in ds or test_name is None:
        raise DataError(f"data.name: {name!r} has splits {list(ds)}; growpipe needs train and test (or validation)")
    image = _image_feature(ds["train"].features, spec)
    origins = {"train": Origin.of_split(spec.name, "train"), "test": Origin(f"{spec.name} ({test_name} split)", "test")}
    if image is not None:
        return _hf_images(spec.name, ds["train"], ds[test_name], image, spec, origins)
    return frames_to_bundle(spec.name, ds["train"].to_pandas(), ds[test_name].to_pandas(), spec, origins)


def _image_feature(features: Any, spec: DataSpec) -> str | None:
    """The column of Hugging Face Image feature to train on: data.image_column, else the only Image one."""
    import datasets

    images = [c for c, f in features.items() if isinstance(f, datasets.Image)]
    if spec.image_column in images:
        return spec.image_column
    if spec.text_column in features:
        return None
    return images[0] if len(images) == 1 else None


def _hf_images(name: str, train: Any, test: Any, column: str, spec: DataSpec,
               origins: dict[str, Origin]) -> DataBundle:  # fmt: skip
    """A Hugging Face dataset with an Image column: decoded, one mode and size, labels from its label column
    (ClassLabel names kept)."""
    import datasets

    label = spec.label_column
    for split, ds in (("train", train), ("test", test)):
        _check_label_column(ds.column_names, label, origins[split], name)
    frames = _columns_frame(train, [label]), _columns_frame(test, [label])
    ytr, yte, names = _labels(*frames, spec, name, origins)
    feature = train.features[label]
    if isinstance(feature, datasets.ClassLabel):
        names = list(feature.names)
    if spec.stream is not False:
        sources = {s: ArrowSource(ds, column, origins[s]) for s, ds in (("train", train), ("test", test))}
        return streamed_bundle(name, sources, {"train": ytr.numpy(), "test": yte.numpy()}, names, spec)
    arrays = []
    for split, ds in (("train", train), ("test", test)):
        raw = ds.cast_column(column, datasets.Image(decode=False))[column]
        named = ((_row_name(origins[split], i, r), r) for i, r in enumerate(raw))
        arrays.append(stack_images(((where, open_image(r, where)) for where, r in named), spec, name))
    return _image_bundle(name, arrays[0], ytr.numpy(), arrays[1], yte.numpy(), names, spec)


def _columns_frame(ds: Any, columns: list[str]) -> pd.DataFrame:
    """The `columns` of a Hugging Face dataset as a frame, converted by Arrow in one go (indexing a column
    formats it row by row: seconds per 100,000 rows at load)."""
    return ds.select_columns(columns).to_pandas()


def _row_name(origin: Origin, i: int, raw: Any) -> str:
    path = raw.get("path") if isinstance(raw, dict) else None
    return origin.row(i) + (f" ({path})" if path else "")


def _check_label_column(columns: list[str], label: str, origin: Origin, name: str) -> None:
    if label not in columns:
        raise DataError(f"{name}: no label column {label!r} in {origin.place} (columns: {', '.join(map(str, columns))}"
                        "); set data.label_column")  # fmt: skip


def frames_to_bundle(name: str, train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec,
                     origins: dict[str, Origin] | None = None) -> DataBundle:  # fmt: skip
    """Turn train/test frames into a text bundle (when the text column exists), an image bundle (number
    lists or numeric columns reshaped by data.image_shape) or a tabular one. `origins` (each split's file)
    name the rows in messages."""
    import pandas as pd

    label = spec.label_column
    origins = origins or {s: Origin.of_split(name, s) for s in ("train", "test")}
    for split, df in (("train", train), ("test", test)):
        if len(df) == 0:
            raise DataError(f"{name}: the {split} split is empty; point data at files with rows")
        _check_label_column(list(df.columns), label, origins[split], name)
    ytr, yte, class_names = _labels(train, test, spec, name, origins)
    if spec.text_column in train.columns:
        check_columns([spec.text_column], list(test.columns), origins, name)
        _check_text(train[spec.text_column], spec.text_column, name)
        ttr, tte = (df[spec.text_column].astype(str).to_numpy(dtype=object) for df in (train, test))
        lengths: list[int] = []
        vocab = Vocab.build(ttr, spec.vocab_size, spec.min_count, lengths, spec.ngrams)
        max_len = kept_length(lengths, spec.max_len, spec.max_len_percentile)
        _check_token_memory(len(ttr) + len(tte), vocab.width(max_len), max_len, spec)
        xtr, xte = vocab.encode(ttr.tolist(), max_len), vocab.encode(tte.tolist(), max_len)
        return DataBundle(name, "text", Split(xtr, ytr, text=ttr), Split(xte, yte, text=tte), len(class_names),
                          class_names, vocab)  # fmt: skip
    others = [c for c in train.columns if c not in (label, "label_name")]
    vectors = [c for c in others if _is_vector_column(train[c])]
    feats = [c for c in others if c in vectors or pd.api.types.is_numeric_dtype(train[c])]
    if not feats:
        raise DataError(
            f"{name}: no text column {spec.text_column!r} and no numeric feature columns; set data.text_column"
        )
    check_columns(feats, list(test.columns), origins, name)
    notes = dropped_columns_note([str(c) for c in others if c not in feats])
    xtr = _feature_matrix(train, feats, vectors, origins["train"])
    xte = _feature_matrix(test, feats, vectors, origins["test"])
    if xtr.shape[1] != xte.shape[1]:
        raise DataError(f"{name}: train rows have {xtr.shape[1]} features but test rows {xte.shape[1]}; fix the data")
    if spec.image_shape is not None:
        shape = tuple(spec.image_shape)
        if int(np.prod(shape)) != xtr.shape[1]:
            raise DataError(f"data.image_shape: {list(shape)} holds {int(np.prod(shape))} values but {name}'s rows "
                            f"have {xtr.shape[1]}; give [channels, height, width] of that many")  # fmt: skip
        as_bytes = all(np.issubdtype(x.dtype, np.integer) and x.min() >= 0 and x.max() <= 255 for x in (xtr, xte))
        xtr, xte = (x.reshape(-1, *shape).astype(np.uint8 if as_bytes else np.float32) for x in (xtr, xte))
        return _image_bundle(name, xtr, ytr.numpy(), xte, yte.numpy(), class_names, spec, notes)
    return DataBundle(
        name,
        "tabular",
        Split(unit_float(xtr.astype(np.float32)), ytr),
        Split(unit_float(xte.astype(np.float32)), yte),
        len(class_names),
        class_names,
        notes=notes,
    )


def _check_token_memory(rows: int, width: int, kept: int, spec: DataSpec) -> None:
    """DataError naming data.max_len when `rows` documents of `width` token ids (int64) cannot fit in this
    machine's memory."""
    import psutil

    need, have = 8 * rows * width, psutil.virtual_memory().total
    if need <= have:
        return
    raise DataError(
        f"data.max_len: {rows:,} documents of {width:,} token ids each ({kept:,} words kept per "
        f"document, at most data.max_len={spec.max_len:,}) need {need / 2**30:,.1f} GiB, more than this "
        f"machine's {have / 2**30:,.1f} GiB; lower data.max_len or set data.max_len_percentile (e.g. 95)"
    )


def _is_vector_column(column: pd.Series) -> bool:
    sample = column.dropna()
    return len(sample) > 0 and isinstance(sample.iloc[0], list | tuple | np.ndarray)


def _feature_matrix(df: pd.DataFrame, feats: list[str], vectors: list[str], origin: Origin) -> np.ndarray:
    """(rows, features): numeric columns as they are, number-list columns spread out, in column order; each
    checked by `column_array` as rows read from disk are."""
    parts = []
    for c in feats:
        column = df[c]
        if c in vectors:
            values = column.tolist()
        elif column.isna().any():  # nullable integers hold pd.NA: as NaN, refused as missing
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            values = column.to_numpy()
        parts.append(column_array(values, c, origin))
    return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def _check_text(column: pd.Series, col: str, name: str) -> None:
    """DataError unless the column holds text (not images, bytes, numbers or lists)."""
    sample = column.dropna()
    sample = sample.iloc[0] if len(sample) else ""
    if not isinstance(sample, str):
        kind = (
            "images"
            if isinstance(sample, dict) and {"bytes", "path"} & set(sample)
            else f"{type(sample).__name__} values"
        )
        raise DataError(f"{name}: column {col!r} holds {kind}, not text; set data.text_column to a column of text "
                        "(a table without one trains on its numeric columns)")  # fmt: skip


def _labels(train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec, name: str, origins: dict[str, Origin]):
    """Both splits' labels as class ids, and the class names: integers (or whole numbers) are the ids, text
    labels are names, numbered in sorted order. DataError naming the file, row and column of a blank label or
    one unlike the rest of its column (see `_class_ids`)."""
    col = spec.label_column
    ytr, yte = (_class_ids(df[col], col, origins[s]) for s, df in (("train", train), ("test", test)))
    if ytr is None or yte is None:  # class names
        names = sorted(set(train[col].astype(str)))
        index = {n: i for i, n in enumerate(names)}
        text = test[col].astype(str)
        unseen = np.flatnonzero(~text.isin(names).to_numpy())
        if len(unseen):
            row = int(unseen[0])
            raise DataError(f"{origins['test'].row(row)}, column {col!r}: label {text.iloc[row]!r} never appears in "
                            f"{origins['train'].place}; fix the label or add training rows of that class")  # fmt: skip
        ytr = np.array([index[v] for v in train[col].astype(str)], dtype=np.int64)
        yte = np.array([index[v] for v in text], dtype=np.int64)
        return torch.from_numpy(ytr), torch.from_numpy(yte), names
    classes = check_labels(ytr, yte, spec.num_classes, f"{name} column {col!r}", origins)
    if "label_name" in train.columns:
        pairs = dict(zip(ytr.tolist(), train["label_name"].astype(str), strict=True))
        names = [pairs.get(i, str(i)) for i in range(classes)]
    else:
        names = [str(i) for i in range(classes)]
    return torch.from_numpy(ytr), torch.from_numpy(yte), names


def _class_ids(values: pd.Series, col: str, origin: Origin) -> np.ndarray | None:
    """A label column as class ids (integers, whole numbers, or text that is all integers), or None for class
    names (text). DataError naming the row of a blank label, a number that is not whole, or a label unlike
    the rest (a word among class ids, or an integer among names)."""
    import pandas as pd

    text = values.astype(str).str.strip() if values.dtype == object or pd.api.types.is_string_dtype(values) else None
    blank = values.isna().to_numpy() | (text.eq("").to_numpy(dtype=bool) if text is not None else False)
    if blank.any():
        raise DataError(f"{origin.row(int(np.flatnonzero(blank)[0]))}, column {col!r}: no label; give every row its "
                        "class, or drop the row")  # fmt: skip
    if pd.api.types.is_bool_dtype(values):
        return None
    if pd.api.types.is_integer_dtype(values):
        return values.to_numpy(np.int64, copy=True)
    if pd.api.types.is_float_dtype(values):
        arr = values.to_numpy(np.float64)
        odd = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if len(odd):
            raise DataError(f"{origin.row(int(odd[0]))}, column {col!r}: label {arr[odd[0]]:g} is not a class id (a "
                            "whole number 0, 1, ...); fix it, or give the classes as names (text)")  # fmt: skip
        return arr.astype(np.int64)
    if text is None:
        return None
    is_id = text.str.fullmatch(r"[+-]?\d+").to_numpy(dtype=bool)
    if is_id.all():
        return text.astype(np.int64).to_numpy()
    if not is_id.any():
        return None
    mostly_ids = 2 * int(is_id.sum()) >= len(is_id)  # the fewer kind is the mistake
    row = int(np.flatnonzero(~is_id if mostly_ids else is_id)[0])
    among = "class ids (whole numbers)" if mostly_ids else "class names"
    raise DataError(f"{origin.row(row)}, column {col!r}: label {values.iloc[row]!r} among {among}; fix it, or give "
                    "every class by name")  # fmt: skip
