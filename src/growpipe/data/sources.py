"""Readers for each data source: bundled digits, IDX files, CIFAR, parquet text, Hugging Face datasets."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from growpipe import envvars
from growpipe.config import DataSpec
from growpipe.data.bundle import DataBundle, Split, check_labels
from growpipe.data.text import Vocab
from growpipe.errors import DataError

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
            raise DataError(f"data.root: {root} does not exist; point it at the directory holding the {name} files")
        missing = [f for f in must_have if not (root / f).is_file()]
        if missing:
            raise DataError(f"data.root: {root} lacks {', '.join(missing)}; point it at the {name} directory")
        return root
    tried = candidate_dirs(name, system_dirs)
    for d in tried:
        if all((d / f).is_file() for f in must_have):
            return d
    shown = ", ".join(str(p) for p in [*tried[:2], *map(Path, system_dirs)])
    raise DataError(
        f"data: no {name} files found (looked in {shown}, ...); set data.root or ${envvars.GROWPIPE_DATA_DIR}"
    )


# ---- images -------------------------------------------------------------------------------------------


def load_digits_bundle(spec: DataSpec) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1,797 images), a fixed stratified 75/25 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return _image_bundle("digits", xtr, ytr, xte, yte, [str(i) for i in range(10)], spec)


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
        root = locate(spec, "fashion-mnist", list(FASHION_FILES.values()), ("/usr/share/datasets/fashion-mnist",))
    except DataError:
        if not spec.download:
            raise
        root = _torchvision_fashion_download(spec)
    arr = {k: read_idx(root / f) for k, f in FASHION_FILES.items()}
    for split in ("train", "test"):
        if len(arr[f"{split}_x"]) != len(arr[f"{split}_y"]):
            raise DataError(f"{root}: {split} images and labels differ in count; re-copy the files")
    xtr = arr["train_x"].astype(np.float32)[:, None] / 255.0
    xte = arr["test_x"].astype(np.float32)[:, None] / 255.0
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
            raise DataError(f"data.root: {root} does not exist; point it at the folder holding {base.base_folder}/")
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


def _image_bundle(name, xtr, ytr, xte, yte, class_names, spec: DataSpec) -> DataBundle:
    classes = check_labels(np.asarray(ytr), np.asarray(yte), spec.num_classes or len(class_names), name)
    xtr_t, xte_t = torch.from_numpy(np.ascontiguousarray(xtr)), torch.from_numpy(np.ascontiguousarray(xte))
    # Standardise per channel with training statistics.
    mean = xtr_t.mean(dim=(0, 2, 3), keepdim=True)
    std = xtr_t.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return DataBundle(
        name=name,
        kind="image",
        train=Split((xtr_t - mean) / std, torch.as_tensor(ytr, dtype=torch.long)),
        test=Split((xte_t - mean) / std, torch.as_tensor(yte, dtype=torch.long)),
        num_classes=classes,
        class_names=list(class_names)[:classes],
    )


# ---- tables and text ----------------------------------------------------------------------------------


def load_newsgroups(spec: DataSpec) -> DataBundle:
    """20 Newsgroups from train.parquet / test.parquet (columns text, label, label_name)."""
    root = locate(spec, "20newsgroups", ["train.parquet", "test.parquet"])
    import pandas as pd

    train = pd.read_parquet(root / "train.parquet")
    test = pd.read_parquet(root / "test.parquet")
    return frames_to_bundle("20newsgroups", train, test, spec)


def load_files(spec: DataSpec) -> DataBundle:
    """parquet:/csv:/json:PATH — a directory with train.EXT and test.EXT, read by Hugging Face datasets."""
    fmt, _, path = spec.name.partition(":")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"data.name: {root} is not a directory; give {fmt}:DIR with train.{fmt} and test.{fmt}")
    exts = {"parquet": ["parquet"], "csv": ["csv"], "json": ["json", "jsonl"]}[fmt]
    files = {}
    for split in ("train", "test"):
        found = [root / f"{split}.{e}" for e in exts if (root / f"{split}.{e}").is_file()]
        if not found:
            raise DataError(f"data.name: {root} has no {split}.{exts[0]}; add it or point at the right directory")
        if _has_no_rows(found[0], fmt):
            raise DataError(f"{spec.name}: the {split} split is empty ({found[0]} has no rows); add data to it")
        files[split] = str(found[0])
    import datasets

    try:
        ds = datasets.load_dataset(fmt, data_files=files)
    except Exception as e:  # datasets wraps parser errors in several types
        cause = e.__cause__ or e
        raise DataError(f"data.name: cannot read {root} as {fmt} ({str(cause).splitlines()[0]})") from None
    return frames_to_bundle(spec.name, ds["train"].to_pandas(), ds["test"].to_pandas(), spec)


def _has_no_rows(path: Path, fmt: str) -> bool:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows == 0
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in (f.readline() for _ in range(3)) if ln.strip()]
    header = 1 if fmt == "csv" else 0
    return len(lines) <= header or (fmt == "json" and lines[0].strip() in ("[]", "{}"))


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
        raise DataError(f"data.name: cannot load Hugging Face dataset {name!r} ({first})") from None
    test_name = next((s for s in ("test", "validation") if s in ds), None)
    if "train" not in ds or test_name is None:
        raise DataError(f"data.name: {name!r} has splits {list(ds)}; growpipe needs train and test (or validation)")
    return frames_to_bundle(spec.name, ds["train"].to_pandas(), ds[test_name].to_pandas(), spec)


def frames_to_bundle(name: str, train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec) -> DataBundle:
    """Turn train/test frames into a text bundle (when the text column exists) or a tabular one."""
    import pandas as pd

    label = spec.label_column
    for split, df in (("train", train), ("test", test)):
        if len(df) == 0:
            raise DataError(f"{name}: the {split} split is empty; point data at files with rows")
        if label not in df.columns:
            raise DataError(
                f"{name}: no label column {label!r} in the {split} split (columns: {', '.join(map(str, df.columns))}); "
                "set data.label_column"
            )
    ytr, yte, class_names = _labels(train, test, spec, name)
    if spec.text_column in train.columns:
        _check_text(train[spec.text_column], spec.text_column, name)
        vocab = Vocab.build(train[spec.text_column].astype(str), spec.vocab_size)
        xtr = vocab.encode(train[spec.text_column].astype(str).tolist(), spec.max_len)
        xte = vocab.encode(test[spec.text_column].astype(str).tolist(), spec.max_len)
        return DataBundle(name, "text", Split(xtr, ytr), Split(xte, yte), len(class_names), class_names, vocab)
    others = [c for c in train.columns if c not in (label, "label_name")]
    feats = [c for c in others if pd.api.types.is_numeric_dtype(train[c])]
    if not feats:
        raise DataError(
            f"{name}: no text column {spec.text_column!r} and no numeric feature columns; set data.text_column"
        )
    for split, df in (("train", train), ("test", test)):
        nan = df[feats].isna().sum()
        if nan.any():
            col = nan[nan > 0].index[0]
            raise DataError(f"{name}: column {col!r} has {int(nan[col])} missing (NaN) value(s) in the {split} split "
                            f"({int((nan > 0).sum())} column(s) have some); fill or drop them first")  # fmt: skip
    dropped = [str(c) for c in others if c not in feats]
    notes = [f"dropped {len(dropped)} non-numeric column(s): {', '.join(dropped)}"] if dropped else []
    xtr = torch.tensor(train[feats].to_numpy(np.float32))
    xte = torch.tensor(test[feats].to_numpy(np.float32))
    mean, std = xtr.mean(0, keepdim=True), xtr.std(0, keepdim=True).clamp_min(1e-6)
    return DataBundle(
        name,
        "tabular",
        Split((xtr - mean) / std, ytr),
        Split((xte - mean) / std, yte),
        len(class_names),
        class_names,
        notes=notes,
    )


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


def _labels(train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec, name: str):
    import pandas as pd

    col = spec.label_column
    if not pd.api.types.is_integer_dtype(train[col]):
        names = sorted(set(train[col].astype(str)))
        index = {n: i for i, n in enumerate(names)}
        unseen = sorted(set(test[col].astype(str)) - set(names))
        if unseen:
            raise DataError(f"{name}: test label {unseen[0]!r} never appears in train; fix the label column")
        ytr = np.array([index[v] for v in train[col].astype(str)], dtype=np.int64)
        yte = np.array([index[v] for v in test[col].astype(str)], dtype=np.int64)
        return torch.from_numpy(ytr), torch.from_numpy(yte), names
    ytr, yte = train[col].to_numpy(np.int64, copy=True), test[col].to_numpy(np.int64, copy=True)
    classes = check_labels(ytr, yte, spec.num_classes, f"{name} column {col!r}")
    if "label_name" in train.columns:
        pairs = dict(zip(train[col], train["label_name"].astype(str), strict=True))
        names = [pairs.get(i, str(i)) for i in range(classes)]
    else:
        names = [str(i) for i in range(classes)]
    return torch.from_numpy(ytr), torch.from_numpy(yte), names
