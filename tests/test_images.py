"""Image data from the places users keep it: an image folder (a directory or a file:// URI), a Hugging Face
dataset with an Image column, a parquet column of pixel lists; the same images give the same tensors from
each. Normalisation statistics travel with the checkpoint; augmentation is seeded per sample, so the Ray
pipeline still matches the reference trainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from growpipe.config import build_config
from growpipe.data import load_data
from growpipe.data.augment import Augment
from growpipe.errors import ConfigError, DataError, InputError
from tests.conftest import assert_same_weights, tiny_config

CLASSES = ["cat", "dog", "emu"]


def _images(n: int, seed: int, size: tuple[int, int] = (6, 5)) -> tuple[np.ndarray, np.ndarray]:
    """n grey images (uint8, height x width) and labels, sorted by label (the image folder's order)."""
    rng = np.random.default_rng(seed)
    y = np.sort(rng.integers(0, len(CLASSES), n))
    return rng.integers(0, 256, (n, *size), dtype=np.uint8), y


def _write_folder(root: Path, split: str, x: np.ndarray, y: np.ndarray) -> None:
    from PIL import Image

    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        d = root / split / CLASSES[label]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(d / f"{i:04d}.png")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, object]:
    """The same 30 + 12 images as an image folder, a saved Hugging Face dataset and parquet pixel lists."""
    import datasets
    import pandas as pd
    from PIL import Image

    base = tmp_path_factory.mktemp("images")
    splits = {"train": _images(30, 0), "test": _images(12, 1)}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    hf = {}
    for split, (x, y) in splits.items():
        _write_folder(base / "folder", split, x, y)
        (base / "parquet").mkdir(exist_ok=True)
        pd.DataFrame({"pixels": [img.reshape(-1).tolist() for img in x], "label": y}).to_parquet(
            base / "parquet" / f"{split}.parquet"
        )
        rows = {"image": [Image.fromarray(img, mode="L") for img in x], "label": y.tolist()}
        hf[split] = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict(hf).save_to_disk(str(base / "hf"))
    return {"base": base, "splits": splits}


def _write_table(root: Path, pixels: list[list[float]]) -> None:
    import pandas as pd

    root.mkdir()
    for split in ("train", "test"):
        pd.DataFrame({"pixels": pixels, "label": list(range(len(pixels)))}).to_parquet(root / f"{split}.parquet")


def _all(split) -> torch.Tensor:
    """Every input of a split (in memory or read from disk), in order."""
    return split.inputs(torch.arange(len(split)))


def _load(name: str, seed: int = 0, **data):
    return load_data(build_config({"data": {"name": name, **data}}).data, seed)


def test_folder_hub_and_pixel_lists_give_the_same_images(sources):
    base = sources["base"]
    folder = _load(f"imagefolder:{base / 'folder'}")
    uri = _load(f"imagefolder:file://{base / 'folder'}")
    hub = _load(f"hf:{base / 'hf'}")
    lists = _load(f"parquet:{base / 'parquet'}", image_shape=[1, 6, 5])
    in_memory = _load(f"imagefolder:{base / 'folder'}", stream=False)
    hub_in_memory = _load(f"hf:{base / 'hf'}", stream=False)
    lists_streamed = _load(f"parquet:{base / 'parquet'}", image_shape=[1, 6, 5], stream=True)
    assert folder.train.streamed and hub.train.streamed and not lists.train.streamed and not in_memory.train.streamed
    assert lists_streamed.train.streamed
    for b in (folder, uri, hub, lists, in_memory, hub_in_memory, lists_streamed):
        assert b.kind == "image" and b.input_shape == (1, 6, 5) and b.num_classes == 3
        # one float conversion and one float64 statistic for every path: the same inputs bit for bit
        assert torch.equal(_all(b.train), _all(folder.train)) and torch.equal(b.test.y, folder.test.y)
        assert b.normalize == folder.normalize
    assert folder.class_names == hub.class_names == CLASSES
    x, _ = sources["splits"]["train"]
    mean = float(np.mean(x / 255.0))
    assert folder.normalize["mean"][0] == pytest.approx(mean, abs=1e-6)  # the training split's statistics
    assert abs(float(_all(folder.train).mean())) < 1e-5
    table, table_streamed = (_load(f"parquet:{base / 'parquet'}", stream=flag) for flag in (False, True))
    assert table.kind == table_streamed.kind == "tabular" and table_streamed.input_shape == (30,)
    assert torch.equal(_all(table.test), _all(table_streamed.test)) and table.normalize == table_streamed.normalize
    raw = _load(f"imagefolder:{base / 'folder'}", normalize="none")
    assert raw.normalize is None and float(_all(raw.train).max()) <= 1.0


def test_statistics_come_from_a_seeded_sample_of_the_training_rows_the_same_in_every_format(sources):
    from growpipe.data.moments import stats_sample

    base = sources["base"]
    x, _ = sources["splits"]["train"]

    def every_format(seed: int, **data) -> list:
        return [
            _load(f"imagefolder:{base / 'folder'}", seed, **data),
            _load(f"imagefolder:{base / 'folder'}", seed, stream=False, **data),
            _load(f"hf:{base / 'hf'}", seed, **data),
            _load(f"parquet:{base / 'parquet'}", seed, image_shape=[1, 6, 5], **data),
            _load(f"parquet:{base / 'parquet'}", seed, image_shape=[1, 6, 5], stream=True, **data),
        ]

    sampled = every_format(3, stats_rows=10)
    rows = stats_sample(30, 10, 3)
    assert len(rows) == 10 and list(rows) == sorted(set(rows.tolist())) and list(rows) != list(range(10))
    for b in sampled:  # the same 10 of the 30 training rows, the same float64 sums: equal bit for bit
        assert b.normalize == sampled[0].normalize and torch.equal(_all(b.train), _all(sampled[0].train))
    as_read = (x / np.float32(255)).astype(np.float32)  # each pixel as the loaders read it (float32)
    assert sampled[0].normalize["mean"][0] == pytest.approx(float(np.mean(as_read[rows], dtype=np.float64)), abs=1e-12)
    assert every_format(3, stats_rows=10)[2].normalize == sampled[0].normalize  # seeded: the same again
    assert _load(f"hf:{base / 'hf'}", 4, stats_rows=10).normalize != sampled[0].normalize  # another seed
    exact = every_format(3, stats_rows="all")
    assert all(b.normalize == exact[0].normalize for b in exact) and exact[0].normalize != sampled[0].normalize
    assert exact[0].normalize["mean"][0] == pytest.approx(float(np.mean(as_read, dtype=np.float64)), abs=1e-12)
    assert _load(f"hf:{base / 'hf'}", 3).normalize == exact[0].normalize  # 30 rows: under the default, exact
    with pytest.raises(ConfigError, match=r"data.stats_rows: got 0; give a number of rows >= 1, or all"):
        build_config({"data": {"stats_rows": 0}})


def test_load_decodes_only_the_sample_and_a_bad_file_outside_it_stops_the_batch_that_reads_it(
    tmp_path: Path, monkeypatch, capfd
):
    from PIL import Image

    import growpipe.data.stream as stream
    from growpipe.data import iterate_batches
    from growpipe.data.moments import stats_sample

    root = tmp_path / "folder"
    x, y = _images(40, 4)
    _write_folder(root, "train", x, y)
    _write_folder(root, "test", x[:6], y[:6])
    sample = stats_sample(40, 8, 0)
    corrupt, odd = (int(p) for p in np.setdiff1d(np.arange(1, 40), sample)[[0, -1]])
    bad = root / "train" / CLASSES[y[corrupt]] / f"{corrupt:04d}.png"  # the folder's order is the rows' order
    bad.write_bytes(b"not a png")
    decoded = []

    def counting_open(raw, where):
        decoded.append(where)
        return stream_open(raw, where)

    stream_open = stream.open_image
    monkeypatch.setattr(stream, "open_image", counting_open)
    strict = _load(f"imagefolder:{root}", stats_rows=8)
    # the 8 sampled training rows, the 6 test rows (fewer than 8: all), each split's first row for its shape
    assert len(decoded) == 8 + 6 + 2 and str(bad) not in decoded and len(strict.train) == 40
    with pytest.raises(DataError, match=rf"{bad.name}: not a readable image .*data.skip_bad_files: true"):
        list(iterate_batches(strict.train, 4, shuffle=False))
    skipping = _load(f"imagefolder:{root}", stats_rows=8, skip_bad_files=True)
    assert len(skipping.train) == 40 and not skipping.notes  # not read at load: nothing known to skip yet
    assert sum(len(p.y) for p in iterate_batches(skipping.train, 4, shuffle=True)) == 39
    assert skipping.train.x.skipped == 1 and f"skipped (1 so far, data.skip_bad_files): {bad}" in capfd.readouterr().err
    bad.unlink()
    odd_file = root / "train" / CLASSES[y[odd]] / f"{odd:04d}.png"
    Image.fromarray(np.zeros((9, 9), np.uint8), mode="L").save(odd_file)
    mixed = _load(f"imagefolder:{root}", stats_rows=8)  # the odd size is not in the sample: found when read
    with pytest.raises(DataError, match=rf"{odd_file.name}.* set data.image_size: \[height, width\]"):
        list(iterate_batches(mixed.train, 4, shuffle=False))


def test_integer_columns_read_as_pixels_on_the_sample_refuse_a_later_row_that_is_not(tmp_path: Path):
    import pandas as pd

    from growpipe.data import iterate_batches
    from growpipe.data.moments import stats_sample

    pixels = np.random.default_rng(5).integers(0, 256, (20, 4))
    outside = int(np.setdiff1d(np.arange(20), stats_sample(20, 5, 0))[0])
    pixels[outside, 2] = 300
    (tmp_path / "t").mkdir()
    for split in ("train", "test"):
        pd.DataFrame({"pixels": pixels.tolist(), "label": [0, 1] * 10}).to_parquet(tmp_path / "t" / f"{split}.parquet")
    name = f"parquet:{tmp_path / 't'}"
    sampled = _load(name, image_shape=[1, 2, 2], stream=True, stats_rows=5)
    assert sampled.train.x.pixels  # 0-255 integers in the 5 rows read at load
    with pytest.raises(DataError, match=rf"train.parquet row {outside + 1} .*: holds 300, not a pixel 0-255 .*"
                       r"set data.stats_rows: all"):  # fmt: skip
        list(iterate_batches(sampled.train, 4, shuffle=False))
    exact = _load(name, image_shape=[1, 2, 2], stream=True, stats_rows="all")
    assert not exact.train.x.pixels and float(_all(exact.train).max()) > 0  # every row read: numbers, not pixels


def test_bad_image_data_is_named_before_training(sources, tmp_path: Path):
    from PIL import Image

    root = tmp_path / "mixed"
    x, y = _images(6, 2)
    _write_folder(root, "train", x, y)
    _write_folder(root, "test", x[:2], y[:2])
    odd = root / "train" / CLASSES[y[-1]] / "0099.png"
    Image.fromarray(np.zeros((9, 9), np.uint8), mode="L").save(odd)
    with pytest.raises(DataError, match=r"0099.png is 9x9 but .* set data.image_size"):
        _load(f"imagefolder:{root}")
    resized = _load(f"imagefolder:{root}", image_size=[6, 5])
    assert resized.input_shape == (1, 6, 5) and len(resized.train) == 7
    Image.fromarray(np.zeros((6, 5, 3), np.uint8), mode="RGB").save(odd)
    with pytest.raises(DataError, match=r"0099.png is RGB but .* set data.channels"):
        _load(f"imagefolder:{root}")
    assert _load(f"imagefolder:{root}", channels=3).input_shape == (3, 6, 5)

    odd.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"0099.png: not a readable image.*skip_bad_files"):
        _load(f"imagefolder:{root}")
    skipped = _load(f"imagefolder:{root}", skip_bad_files=True)
    assert len(skipped.train) == 6 and any("skipped 1 unreadable image" in n for n in skipped.notes)
    odd.unlink()

    (root / "train" / "empty").mkdir()
    with pytest.raises(DataError, match=r"class folder .*train/empty has no images"):
        _load(f"imagefolder:{root}")
    (root / "train" / "empty").rmdir()
    with pytest.raises(DataError, match="no label column 'y'"):
        _load(f"hf:{sources['base'] / 'hf'}", label_column="y")
    with pytest.raises(DataError, match=r"label 2 in the train split is outside \[0, 2\)"):
        _load(f"imagefolder:{root}", num_classes=2)
    with pytest.raises(DataError, match="is not a directory"):
        _load(f"imagefolder:file://{tmp_path / 'nowhere'}")
    with pytest.raises(DataError, match=r"cannot open nosuchfs://x .*install the fsspec filesystem"):
        _load("parquet:nosuchfs://x")
    for stream in (False, True):
        with pytest.raises(DataError, match=r"data.image_shape: \[1, 5, 5\] holds 25 values but .* have 30"):
            _load(f"parquet:{sources['base'] / 'parquet'}", image_shape=[1, 5, 5], stream=stream)
    _write_table(tmp_path / "nan", [[0.5, float("nan")], [0.1, 0.2]])
    for stream in (False, True):
        with pytest.raises(DataError, match=r"column 'pixels'.* missing \(NaN\)|NaN"):
            _load(f"parquet:{tmp_path / 'nan'}", stream=stream)


def test_a_file_that_goes_bad_mid_run_stops_it_named_or_is_skipped_and_counted(tmp_path: Path, capfd):
    from growpipe.data import iterate_batches

    root = tmp_path / "folder"
    x, y = _images(10, 3)
    _write_folder(root, "train", x, y)
    _write_folder(root, "test", x[:3], y[:3])
    strict = _load(f"imagefolder:{root}")
    skipping = _load(f"imagefolder:{root}", skip_bad_files=True)
    bad = sorted((root / "train").rglob("*.png"))[4]
    bad.write_bytes(b"truncated")  # after the checking pass: found while training
    with pytest.raises(DataError, match=rf"{bad.name}: not a readable image"):
        list(iterate_batches(strict.train, 4, shuffle=True))
    batches = list(iterate_batches(skipping.train, 4, shuffle=True))
    assert sum(len(p.y) for p in batches) == 9 and all(len(p.x) == len(p.y) for p in batches)
    assert skipping.train.x.skipped == 1 and f"skipped (1 so far, data.skip_bad_files): {bad}" in capfd.readouterr().err
    kept = torch.cat([p.y for p in batches]).sort().values
    assert torch.equal(kept, torch.cat([torch.as_tensor(y[:4]), torch.as_tensor(y[5:])]).sort().values)


def test_augmentation_is_seeded_per_sample_and_refused_where_it_cannot_hold(sources):
    aug = Augment(["random_crop", "hflip"], padding=2, seed=3, n=10)
    x = torch.arange(10 * 2 * 4 * 4, dtype=torch.float32).reshape(10, 2, 4, 4)
    idx = torch.arange(10)
    whole = aug(x, idx, epoch=1)
    halves = torch.cat([aug(x[:4], idx[:4], epoch=1), aug(x[4:], idx[4:], epoch=1)])
    assert torch.equal(whole, halves) and whole.shape == x.shape  # however the batch is cut
    assert not torch.equal(whole, x) and not torch.equal(whole, aug(x, idx, epoch=2))  # new draws each epoch
    flipped = Augment(["hflip"], 0, 3, 10)(x, idx, 1)
    same = [torch.equal(a, b) for a, b in zip(flipped, x, strict=True)]
    mirrored = [torch.equal(a, b.flip(-1)) for a, b in zip(flipped, x, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True)) and any(mirrored) and any(same)

    with pytest.raises(ConfigError, match="set grow.cache.enabled: false"):
        tiny_config(data={"augment": ["hflip"]}, grow={"schedule": [{"kind": "layer", "epochs": 1}]})
    no_cache = {"schedule": [{"kind": "layer", "epochs": 1}], "cache": {"enabled": False}}
    assert tiny_config(data={"augment": ["hflip"]}, grow=no_cache).data.augment == ["hflip"]
    with pytest.raises(ConfigError, match=r"data.augment.0: got 'rotate'; input should be 'random_crop' or 'hflip'"):
        tiny_config(data={"augment": ["rotate"]})
    with pytest.raises(DataError, match="data.augment: hflip work on images but .* is tabular"):
        _load(f"parquet:{sources['base'] / 'parquet'}", augment=["hflip"])


@pytest.mark.usefixtures("ray_session")
def test_streamed_augmented_training_on_ray_matches_the_reference_and_evaluate_uses_its_statistics(sources, tmp_path):
    from growpipe.api import evaluate
    from growpipe.local import train_local
    from growpipe.runtime.pipeline import Pipeline

    folder = f"imagefolder:{sources['base'] / 'folder'}"  # read from disk per batch, by reader threads
    data = {"name": folder, "batch_size": 8, "augment": ["random_crop", "hflip"], "crop_padding": 1}
    cfg = tiny_config(method="scpl", train={"epochs": 2}, data=data)
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    assert net.info.normalize == reference.net.info.normalize and len(net.info.normalize["mean"]) == 1

    from growpipe.checkpoint import save_net
    from growpipe.evaluation import load_for_evaluation

    save_net(tmp_path / "ck", net, cfg)
    _, bundle, evaluated = load_for_evaluation(tmp_path / "ck")
    assert evaluated.data.normalize.mean == net.info.normalize["mean"] and bundle.normalize == net.info.normalize
    ev = evaluate(tmp_path / "ck")
    assert ev["full_accuracy"] == pytest.approx(reference.summary()["test_accuracy"], abs=1e-6)


_RSS_SCRIPT = """
import sys, torch
from growpipe.config import build_config
from growpipe.data import iterate_batches, load_data
cfg = build_config({"data": {"name": sys.argv[1], "batch_size": 64, "read_workers": 0}})
peak = lambda: int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))  # KB
before = peak()  # (getrusage's ru_maxrss would carry the parent's peak across fork + exec)
bundle = load_data(cfg.data)
for p in iterate_batches(bundle.train, 64, shuffle=True, seed=0, epoch=1, augment=True):
    pass
print(peak() - before)
"""


def _folder_of(root: Path, n: int) -> Path:
    """n training and 10 test 32x32 RGB noise images in 2 classes."""
    from PIL import Image

    rng = np.random.default_rng(n)
    for split, count in (("train", n), ("test", 10)):
        for i in range(count):
            d = root / split / ("a" if i % 2 else "b")
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), mode="RGB").save(d / f"{i}.png")
    return root


def test_streamed_images_keep_stage_0_memory_flat_as_the_dataset_grows(tmp_path: Path):
    import subprocess
    import sys

    def peak_growth_mb(root: Path) -> float:
        out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, f"imagefolder:{root}"], capture_output=True,
                             text=True, timeout=300, check=True)  # fmt: skip
        return int(out.stdout.strip().splitlines()[-1]) / 1024

    small, large = _folder_of(tmp_path / "small", 200), _folder_of(tmp_path / "large", 2000)
    # 1,800 more images are 22 MB as one float tensor (loaded in memory the peak grew 69 MB here); streamed it
    # moved 4 MB (file names, allocator slack; reader threads' arenas would add a bounded 5-7 MB: off here)
    assert peak_growth_mb(large) - peak_growth_mb(small) < 10


@pytest.mark.usefixtures("ray_session")
def test_a_path_stage_0_cannot_see_is_named_with_its_node_and_a_corrupt_file_is_not(tmp_path: Path):
    from growpipe.runtime.pipeline import Pipeline

    def error_of(name: str, **data) -> str:
        with pytest.raises(InputError) as caught, Pipeline(tiny_config(data={"name": name, **data})) as p:  # exit 2
            p.train(progress=None)
        return str(caught.value)

    missing = error_of(f"imagefolder:{tmp_path / 'nowhere'}")
    assert "is not a directory" in missing and "(read by stage 0 on node " in missing
    assert "a local path must exist there" in missing
    x, y = _images(4, 5)
    _write_folder(tmp_path / "f", "train", x, y)
    _write_folder(tmp_path / "f", "test", x, y)
    next((tmp_path / "f" / "train").rglob("0000.png")).write_bytes(b"junk")
    corrupt = error_of(f"imagefolder:{tmp_path / 'f'}")
    assert "0000.png: not a readable image (no known image format); replace or remove the file" in corrupt
    assert "read by stage 0" not in corrupt  # the file is there: no hint about nodes
    import pandas as pd

    (tmp_path / "t").mkdir()
    for split, value in (("train", float("inf")), ("test", 0.5)):
        pd.DataFrame({"a": [0.1, value, 0.3], "label": [0, 1, 0]}).to_csv(tmp_path / "t" / f"{split}.csv", index=False)
    infinite = error_of(f"csv:{tmp_path / 't'}", stream=True)  # found by stage 0's checking pass: one line
    assert infinite == (f"{tmp_path / 't'}/train.csv row 2 (line 3), column 'a': +inf; features must be finite "
                        "numbers: fill, clip or drop such rows first")  # fmt: skip
