"""Hugging Face datasets (hf:NAME): a Hub dataset by name or a local directory; image columns decoded (or
streamed), anything else as tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from growpipe.config import DataSpec
from growpipe.data.assemble import image_bundle, streamed_bundle
from growpipe.data.bundle import DataBundle
from growpipe.data.checks import Origin
from growpipe.data.frames import frames_to_bundle
from growpipe.data.images import open_image, stack_images
from growpipe.data.labels import check_label_column, class_labels, columns_frame
from growpipe.data.stream import ArrowSource
from growpipe.errors import DataError, DataNotFoundError


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
        check_label_column(ds.column_names, label, origins[split], name)
    frames = columns_frame(train, [label]), columns_frame(test, [label])
    ytr, yte, names = class_labels(*frames, spec, name, origins)
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
    return image_bundle(name, arrays[0], ytr.numpy(), arrays[1], yte.numpy(), names, spec)


def _row_name(origin: Origin, i: int, raw: Any) -> str:
    path = raw.get("path") if isinstance(raw, dict) else None
    return origin.row(i) + (f" ({path})" if path else "")
