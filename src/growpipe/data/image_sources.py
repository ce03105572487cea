"""Image datasets: scikit-learn's bundled digits, Fashion-MNIST's IDX files, CIFAR through torchvision, and
image folders (imagefolder:DIR|URI)."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np

from growpipe.config import DataSpec
from growpipe.data.assemble import image_bundle, streamed_bundle
from growpipe.data.bundle import DataBundle
from growpipe.data.images import read_folder_images, scan_folder
from growpipe.data.locate import candidate_dirs, locate
from growpipe.data.stream import FolderSource
from growpipe.errors import DataError, DataNotFoundError

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
    return image_bundle("digits", x[tr], y[tr], x[te], y[te], [str(i) for i in range(10)], spec)


def digits_rows() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (1,797 x 64, values 0-16) and labels from scikit-learn's bundled CSV, read the way
    its load_digits reads it but without importing scikit-learn; load_digits itself when the file moved."""
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
    return image_bundle("fashion-mnist", xtr, ytr, xte, yte, FASHION_CLASSES, spec)


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
    return image_bundle(name, xtr, np.asarray(tr.targets), xte, np.asarray(te.targets), list(tr.classes), spec)


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
    return image_bundle(spec.name, arrays[0], kept_labels[0], arrays[1], kept_labels[1], classes, spec, notes)
