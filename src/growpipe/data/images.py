"""Images from files and Hugging Face columns: decoding, one size and mode for all, and the image folder
layout (SPLIT/CLASS/*.png|jpg under a directory or an fsspec URI such as file://, s3://, gs://)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from PIL import Image, UnidentifiedImageError

from growpipe.config import DataSpec
from growpipe.errors import DataError, DataNotFoundError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
TEST_SPLITS = ("test", "validation", "val")
MODES = {1: "L", 3: "RGB"}


def open_image(raw: Any, where: str) -> Any:
    """A PIL image from bytes, a path, a {'bytes', 'path'} dict (Hugging Face) or a PIL image; DataError
    naming `where` when it cannot be decoded."""
    if isinstance(raw, Image.Image):
        return raw
    if isinstance(raw, dict):
        raw = raw.get("bytes") or raw.get("path")
    try:
        img = Image.open(io.BytesIO(raw) if isinstance(raw, bytes | bytearray) else raw)
        img.load()
    except UnidentifiedImageError:
        raise DataError(f"{where}: not a readable image (no known image format); replace or remove the file, or "
                        "set data.skip_bad_files: true") from None  # fmt: skip
    except (OSError, ValueError, TypeError) as e:
        raise DataError(f"{where}: not a readable image ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                        "replace or remove the file, or set data.skip_bad_files: true") from None  # fmt: skip
    return img


def stack_images(images: Iterable[tuple[str, Any]], spec: DataSpec, source: str) -> np.ndarray:
    """(N, C, H, W) uint8 of the images: converted to data.channels and resized to data.image_size when set,
    else all must share the first image's mode and size (DataError naming the first that differs)."""
    out: list[np.ndarray] = []
    mode = MODES.get(spec.channels or 0)
    size = (spec.image_size[1], spec.image_size[0]) if spec.image_size else None  # PIL: (width, height)
    first = ""
    for where, img in images:
        if img.mode not in ("L", "RGB") and mode is None:  # palette, RGBA, 16-bit grey: a common mode
            img = img.convert("RGB" if img.mode in ("P", "RGBA", "CMYK", "LA") else "L")
        if mode is None:
            mode, first = img.mode, where
        elif img.mode != mode:
            if spec.channels is None:
                raise DataError(f"{source}: {where} is {img.mode} but {first} is {mode}; set data.channels "
                                "(1 or 3) to convert every image")  # fmt: skip
            img = img.convert(mode)
        if size is None:
            size, first = img.size, first or where
        elif img.size != size:
            if spec.image_size is None:
                raise DataError(f"{source}: {where} is {img.size[0]}x{img.size[1]} but {first} is {size[0]}x"
                                f"{size[1]} (width x height); set data.image_size: [height, width]")  # fmt: skip
            img = img.resize(size, Image.Resampling.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)
        out.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
    if not out:
        raise DataError(f"{source}: no images")
    return np.stack(out)


def open_fs(uri: str) -> tuple[Any, str]:
    """(fsspec filesystem, path) of a directory or URI; DataError when its filesystem is not installed."""
    try:
        return fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as e:
        raise DataNotFoundError(f"data.name: cannot open {uri} ({str(e).splitlines()[0]}); install the fsspec "
                                "filesystem for its scheme (s3fs for s3://, gcsfs for gs://)") from None  # fmt: skip


def scan_folder(uri: str) -> dict[str, list[tuple[str, str]]]:
    """train and test (or validation/val) of an image folder: per split [(file, class name)], files sorted.
    DataError for a missing split, an empty class folder, or a test class the train split lacks."""
    fs, root = open_fs(uri)
    if not fs.isdir(root):
        raise DataNotFoundError(f"data.name: {uri} is not a directory; give imagefolder:DIR with train/CLASS/*.png and "
                        "test/CLASS/*.png")  # fmt: skip
    subdirs = {p.rstrip("/").rsplit("/", 1)[-1]: p for p in fs.ls(root, detail=False) if fs.isdir(p)}
    test = next((s for s in TEST_SPLITS if s in subdirs), None)
    if "train" not in subdirs or test is None:
        raise DataError(f"data.name: {uri} has {sorted(subdirs) or 'no subfolders'}; an image folder needs train/ "
                        "and test/ (or validation/) with one subfolder per class")  # fmt: skip
    out: dict[str, list[tuple[str, str]]] = {}
    for split, name in (("train", "train"), ("test", test)):
        rows: list[tuple[str, str]] = []
        classes = sorted(p for p in fs.ls(subdirs[name], detail=False) if fs.isdir(p))
        if not classes:
            raise DataError(f"data.name: {uri}/{name} has no class subfolders; put each class's images in "
                            f"{name}/CLASS/")  # fmt: skip
        for cdir in classes:
            cls = cdir.rstrip("/").rsplit("/", 1)[-1]
            files = image_files(fs, cdir)
            if not files:
                raise DataError(f"data.name: class folder {uri}/{name}/{cls} has no images ({', '.join(IMAGE_SUFFIXES)}"
                                "); add images or remove the folder")  # fmt: skip
            rows.extend((f, cls) for f in files)
        out[split] = rows
    unseen = sorted({c for _, c in out["test"]} - {c for _, c in out["train"]})
    if unseen:
        raise DataError(f"data.name: class {unseen[0]!r} is in {test}/ but not in train/ of {uri}; add its training "
                        "images or remove it")  # fmt: skip
    return out


def image_files(fs: Any, folder: str) -> list[str]:
    """The image files in `folder` (by suffix), sorted; a local folder listed by os.scandir (fsspec's local
    listing costs about 20 us a file: a second per 50,000 images at load)."""
    if not isinstance(fs, LocalFileSystem):
        return sorted(f for f in fs.ls(folder, detail=False) if f.lower().endswith(IMAGE_SUFFIXES))
    base = folder.rstrip("/")
    with os.scandir(base) as entries:  # names sorted: the paths' order, as they share the folder
        names = sorted(e.name for e in entries if e.name.lower().endswith(IMAGE_SUFFIXES))
    return [f"{base}/{n}" for n in names]


def read_folder_images(
    uri: str, files: list[str], spec: DataSpec, source: str
) -> tuple[np.ndarray, list[int], list[str]]:
    """The images of `files` (fsspec paths under `uri`) as (N, C, H, W) uint8, the indices of the files kept,
    and the unreadable ones skipped (data.skip_bad_files; otherwise the first raises DataError)."""
    fs, _ = open_fs(uri)
    kept: list[int] = []
    bad: list[str] = []

    def images() -> Iterable[tuple[str, Any]]:
        for i, f in enumerate(files):
            try:
                with fs.open(f, "rb") as fh:
                    img = open_image(fh.read(), f)
            except DataError:
                if not spec.skip_bad_files:
                    raise
                bad.append(f)
                continue
            kept.append(i)
            yield f, img

    return stack_images(images(), spec, source), kept, bad
