"""Loaders read small files the tests write; bad data gets a one-line error naming the fix."""

import gzip
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from growpipe.config import DataSpec, FeatureGroupsSpec, load_config
from growpipe.data import iterate_batches, load_data
from growpipe.data.text import Vocab, kept_length, tokenize
from growpipe.errors import ConfigError, DataError
from tests.conftest import text_frames, write_idx


def test_digits_is_the_embedded_default_and_exactly_scikit_learns_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    b = load_data(DataSpec(normalize="none"))
    assert (len(b.train), len(b.test), b.num_classes, b.input_shape) == (1347, 450, 10, (1, 8, 8))
    d = load_digits()  # the stored row order and the CSV read without scikit-learn give what it gives
    xtr, xte, ytr, yte = train_test_split(d.images / 16.0, d.target, test_size=0.25, random_state=0, stratify=d.target)
    assert torch.equal(b.train.x[:, 0], torch.tensor(xtr, dtype=torch.float32)) and b.train.y.tolist() == ytr.tolist()
    assert torch.equal(b.test.x[:, 0], torch.tensor(xte, dtype=torch.float32)) and b.test.y.tolist() == yte.tolist()


def test_fashion_mnist_reads_idx_gz(fashion_dir: Path):
    b = load_data(DataSpec(name="fashion-mnist", root=str(fashion_dir)))
    assert (len(b.train), len(b.test), b.input_shape, b.num_classes) == (40, 20, (1, 28, 28), 10)
    assert b.class_names[0] == "T-shirt/top"
    assert abs(float(b.train.x.mean())) < 1e-4  # standardised with training statistics


def test_fashion_mnist_truncated_file(fashion_dir: Path):
    f = fashion_dir / "t10k-labels-idx1-ubyte.gz"
    raw = gzip.decompress(f.read_bytes())
    f.write_bytes(gzip.compress(raw[:-5]))
    with pytest.raises(DataError, match="truncated"):
        load_data(DataSpec(name="fashion-mnist", root=str(fashion_dir)))


def test_fashion_mnist_labels_outside_range(fashion_dir: Path):
    write_idx(fashion_dir / "train-labels-idx1-ubyte.gz", np.full(40, 12))
    with pytest.raises(DataError, match=r"label 12 in the train split is outside \[0, 10\)"):
        load_data(DataSpec(name="fashion-mnist", root=str(fashion_dir)))


def test_missing_data_directory_names_the_field(tmp_path: Path):
    with pytest.raises(DataError, match=r"data.root: .*nowhere does not exist"):
        load_data(DataSpec(name="fashion-mnist", root=str(tmp_path / "nowhere")))
    with pytest.raises(DataError, match="lacks train.parquet"):
        load_data(DataSpec(name="20newsgroups", root=str(tmp_path)))


def test_newsgroups_parquet_and_vocabulary(text_dir: Path):
    b = load_data(DataSpec(name="20newsgroups", root=str(text_dir), vocab_size=10, max_len=12))
    assert b.kind == "text" and b.input_shape == (12,) and b.input_dtype == "long"
    assert len(b.vocab) == 10 and b.vocab.itos[:2] == ["<pad>", "<unk>"]
    assert b.class_names == ["topic0", "topic1", "topic2"]
    assert (b.train.x[:, 11] != 0).all()  # 15 tokens per document: cut at 12
    whole = load_data(DataSpec(name="20newsgroups", root=str(text_dir), max_len=1_000_000_000))
    assert whole.input_shape == (15,) and (whole.train.x[:, 14] != 0).all()  # padded to the longest, not max_len


def test_lengths_and_vocabulary_chosen_from_the_data(text_dir: Path):
    assert kept_length([3, 10, 20, 40], cap=100, percentile=50) == 10
    assert kept_length([3, 10, 20, 40], cap=30, percentile=100) == 30 and kept_length([1, 2], 30, 95) == 4
    assert kept_length([3, 10], cap=30, percentile=None) == 10 and kept_length([3, 10], cap=8, percentile=None) == 8
    lengths: list[int] = []
    v = Vocab.build(["a b b c", "b c z"], size=10, min_count=2, lengths=lengths)
    assert v.itos == ["<pad>", "<unk>", "b", "c"] and lengths == [4, 3]  # a and z were seen once
    b = load_data(DataSpec(name="20newsgroups", root=str(text_dir), max_len=64, max_len_percentile=50))
    assert b.input_shape == (15,)  # every training document has 15 tokens


def test_vocab_and_tokenizer():
    assert tokenize("Hello, World! It's 2 o'clock") == ["hello", "world", "it's", "2", "o'clock"]
    v = Vocab.build(["a b b c", "b c"], size=4)
    assert v.itos == ["<pad>", "<unk>", "b", "c"]
    assert v.encode(["b z c"], 5).tolist() == [[2, 1, 3, 0, 0]]


def test_word_pairs_are_terms_of_their_own(text_dir: Path):
    v = Vocab.build(["a b b c", "a b c"], size=20, min_count=2, ngrams=2)
    assert v.itos == ["<pad>", "<unk>", "b", "a", "c", "a b", "b c"]  # "b b" was seen once
    assert v.encode(["a b z"], 3).tolist() == [[3, 2, 1, 5, 1]]  # 3 words, then their 2 pairs
    b = load_data(DataSpec(name="20newsgroups", root=str(text_dir), max_len=8, ngrams=2))
    assert b.input_shape == (15,) and len(b.vocab) > len(
        load_data(DataSpec(name="20newsgroups", root=str(text_dir))).vocab
    )
    with pytest.raises(ConfigError, match="data.ngrams: .* only net.backbone embedding"):
        load_config(None, ["data.ngrams=2", "net.backbone=transformer"])


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_local_files_through_hugging_face_datasets(tmp_path: Path, fmt: str):
    train, test = text_frames()
    for name, df in (("train", train), ("test", test)):
        path = tmp_path / f"{name}.{fmt}"
        if fmt == "parquet":
            df.to_parquet(path)
        elif fmt == "csv":
            df.to_csv(path, index=False)
        else:
            df.to_json(path, orient="records", lines=True)
    b = load_data(DataSpec(name=f"{fmt}:{tmp_path}", max_len=20))
    assert (len(b.train), len(b.test), b.num_classes, b.kind) == (60, 30, 3, "text")


def test_tabular_csv_with_string_labels(tmp_path: Path):
    rng = np.random.default_rng(0)
    for name, n in (("train", 30), ("test", 12)):
        df = pd.DataFrame(rng.normal(size=(n, 4)), columns=list("abcd"))
        df["label"] = ["cat", "dog", "emu"] * (n // 3)
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    b = load_data(DataSpec(name=f"csv:{tmp_path}", text_column="none"))
    assert b.kind == "tabular" and b.input_shape == (4,) and b.class_names == ["cat", "dog", "emu"]


def test_hf_local_dataset_directory(tmp_path: Path):
    import datasets

    train, test = text_frames(30, 9)
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_pandas(train), "test": datasets.Dataset.from_pandas(test)}
    )
    dd.save_to_disk(str(tmp_path / "hfdir"))
    b = load_data(DataSpec(name=f"hf:{tmp_path / 'hfdir'}", max_len=8))
    assert (len(b.train), len(b.test), b.num_classes) == (30, 9, 3)


def test_hf_missing_dataset_is_one_line(tmp_path: Path):
    with pytest.raises(DataError, match="cannot load Hugging Face dataset") as e:
        load_data(DataSpec(name=f"hf:{tmp_path / 'no-such-dir'}"))
    assert "\n" not in str(e.value)


def test_cifar10_python_batches(tmp_path: Path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    b = load_data(DataSpec(name="cifar10", root=str(tmp_path), verify_checksums=False))
    assert (len(b.train), len(b.test), b.input_shape, b.num_classes) == (20, 4, (3, 32, 32), 10)
    with pytest.raises(DataError, match="cifar10 not usable"):  # the real MD5s do not match these files
        load_data(DataSpec(name="cifar10", root=str(tmp_path)))


def test_empty_split(tmp_path: Path):
    train, test = text_frames()
    train.to_parquet(tmp_path / "train.parquet")
    test.iloc[:0].to_parquet(tmp_path / "test.parquet")
    with pytest.raises(DataError, match="the test split is empty"):
        load_data(DataSpec(name=f"parquet:{tmp_path}"))


def test_missing_label_column(text_dir: Path):
    with pytest.raises(DataError, match="no label column 'topic'.*set data.label_column"):
        load_data(DataSpec(name="20newsgroups", root=str(text_dir), label_column="topic"))


def test_text_chunks_feature_groups(text_dir: Path):
    groups = FeatureGroupsSpec(scheme="chunks", count=4, base=1)
    b = load_data(DataSpec(name="20newsgroups", root=str(text_dir), max_len=12, feature_groups=groups))
    assert b.input_shape == (3,) and sorted(b.train.side) == ["chunk1", "chunk2", "chunk3"]
    assert b.side_shape("chunk2") == (3,) and b.side_dtype("chunk2") == "long"
    p = next(iterate_batches(b.train, 8, shuffle=False, side_groups=("chunk3",)))
    assert set(p.side) == {"chunk3"} and p.side["chunk3"].shape == (8, 3)


def test_columns_feature_groups(tmp_path: Path):
    rng = np.random.default_rng(0)
    for name in ("train", "test"):
        df = pd.DataFrame(rng.normal(size=(12, 6)), columns=list("abcdef"))
        df["label"] = np.arange(12) % 2
        df.to_parquet(tmp_path / f"{name}.parquet")
    groups = FeatureGroupsSpec(scheme="columns", count=3, base=1)
    b = load_data(DataSpec(name=f"parquet:{tmp_path}", feature_groups=groups))
    assert b.input_shape == (2,) and b.side_shape("cols1") == (2,) and b.side_shape("cols2") == (2,)


def test_batches_are_deterministic_per_seed_and_epoch():
    b = load_data(DataSpec())
    first = [p.y for p in iterate_batches(b.train, 100, shuffle=True, seed=3, epoch=1)]
    again = [p.y for p in iterate_batches(b.train, 100, shuffle=True, seed=3, epoch=1)]
    other = [p.y for p in iterate_batches(b.train, 100, shuffle=True, seed=3, epoch=2)]
    assert all(torch.equal(a, c) for a, c in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])


def test_limit_subsamples(tmp_path: Path):
    b = load_data(DataSpec(limit_train=100, limit_test=50))
    assert (len(b.train), len(b.test)) == (100, 50)
    assert json.dumps(b.summary())


def _csvs(tmp_path: Path, train: pd.DataFrame, test: pd.DataFrame) -> DataSpec:
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    return DataSpec(name=f"csv:{tmp_path}", text_column="none")


def test_tabular_label_outliers_nan_features_and_dropped_columns_are_named(tmp_path: Path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(12, 2)), columns=["a", "b"])
    frame["label"] = [0, 1, 2] * 4
    odd = frame.copy()
    odd.loc[5, "label"] = 99  # one stray label: 100 classes inferred, 96 of them empty
    with pytest.raises(DataError, match=r"column 'label': labels run up to 99 but only 4 distinct classes appear"):
        load_data(_csvs(tmp_path, odd, frame))
    holes = frame.copy()
    holes.loc[3, "b"] = np.nan
    with pytest.raises(DataError, match=r"train.csv row 4 \(line 5\), column 'b': no value \(blank, null or NaN\)"):
        load_data(_csvs(tmp_path, holes, frame))
    words = frame.assign(colour=["red", "blue", "green"] * 4)
    for stream in (False, True):  # read in memory or per batch, the same warning
        b = load_data(_csvs(tmp_path, words, words).model_copy(update={"stream": stream}))
        assert b.input_shape == (2,) and "warning: dropped 1 non-numeric column(s): colour" in b.summary()


def _table_error(tmp_path: Path, train: pd.DataFrame, test: pd.DataFrame, fmt: str = "csv") -> list[str]:
    """The DataError messages of loading train/test written as `fmt`, in memory and read per batch."""
    for split, df in (("train", train), ("test", test)):
        df.to_csv(tmp_path / f"{split}.csv", index=False) if fmt == "csv" else df.to_parquet(
            tmp_path / f"{split}.{fmt}"
        )
    out = []
    for stream in (False, True):
        with pytest.raises(DataError) as e:
            load_data(DataSpec(name=f"{fmt}:{tmp_path}", text_column="none", stream=stream))
        out.append(str(e.value))
    return out


def test_infinite_features_are_refused_like_missing_ones_naming_file_row_and_column(tmp_path: Path):
    frame = pd.DataFrame({"a": np.linspace(0, 1, 12), "b": np.linspace(1, 2, 12), "label": [0, 1, 2] * 4})
    for value, shown in ((np.inf, r"\+inf"), (-np.inf, "-inf")):
        bad = frame.copy()
        bad.loc[6, "b"] = value  # the 7th data row: line 8 of the CSV
        for message in _table_error(tmp_path, bad, frame):
            assert re.fullmatch(rf"{tmp_path}/train.csv row 7 \(line 8\), column 'b': {shown}; features must be "
                                r"finite numbers: fill, clip or drop such rows first", message), message  # fmt: skip
        for message in _table_error(tmp_path, frame, bad, "parquet"):
            assert message.startswith(f"{tmp_path}/test.parquet row 7 (counting from 1), column 'b': "), message


def test_bad_labels_name_the_file_row_and_column(tmp_path: Path):
    frame = pd.DataFrame({"a": np.linspace(0, 1, 12), "label": [0, 1, 2] * 4})
    blank = frame.astype({"label": object})
    blank.loc[5, "label"] = None
    for train, test in ((blank, frame), (frame, blank)):  # in train: was a TypeError; in test: label -2**63
        split = "train" if train is blank else "test"
        for message in _table_error(tmp_path, train, test):
            assert message == (f"{tmp_path}/{split}.csv row 6 (line 7), column 'label': no label; give every row its "
                               "class, or drop the row")  # fmt: skip
    nullable = frame.astype({"label": "Int64"})
    nullable.loc[5, "label"] = pd.NA
    for message in _table_error(tmp_path, nullable, frame, "parquet"):
        assert message.startswith(f"{tmp_path}/train.parquet row 6 (counting from 1), column 'label': no label")
    half = frame.astype({"label": float})
    half.loc[2, "label"] = 2.5  # trained as a fourth class before
    for message in _table_error(tmp_path, half, frame):
        assert "train.csv row 3 (line 4), column 'label': label 2.5 is not a class id (a whole number" in message
    cat = frame.astype({"label": object})
    cat.loc[4, "label"] = "cat"
    for message in _table_error(tmp_path, cat, frame):
        assert "train.csv row 5 (line 6), column 'label': label 'cat' among class ids (whole numbers)" in message
    names = frame.assign(label=["cat", "dog", "emu"] * 4)
    dog = names.copy()
    dog.loc[7, "label"] = "7"
    for message in _table_error(tmp_path, dog, names):
        assert "train.csv row 8 (line 9), column 'label': label '7' among class names" in message
    gap = names.copy()
    gap.loc[9, "label"] = " "
    for message in _table_error(tmp_path, gap, names):
        assert "train.csv row 10 (line 11), column 'label': no label" in message
    unseen = names.copy()
    unseen.loc[1, "label"] = "gnu"
    for message in _table_error(tmp_path, names, unseen):
        assert f"test.csv row 2 (line 3), column 'label': label 'gnu' never appears in {tmp_path}/train.csv" in message
    whole = frame.astype({"label": float})  # 0.0, 1.0, 2.0: class ids, not the names "0.0", "1.0", "2.0"
    assert load_data(_csvs(tmp_path, whole, frame)).class_names == ["0", "1", "2"]


def test_uneven_lists_and_a_column_missing_from_the_test_file_are_named(tmp_path: Path):
    rows = [[0.1 * i, 0.2, 0.3] for i in range(12)]
    uneven = pd.DataFrame({"pixels": rows, "label": [0, 1, 2] * 4})
    uneven.at[7, "pixels"] = [0.1, 0.2]
    even = uneven.assign(pixels=rows)
    for message in _table_error(tmp_path, uneven, even, "parquet"):  # per batch it said "near train row 0"
        assert message == (f"{tmp_path}/train.parquet row 8 (counting from 1), column 'pixels': 2 value(s) where the "
                           "other rows hold 3; give every row as many numbers")  # fmt: skip
    frame = pd.DataFrame({"a": np.linspace(0, 1, 12), "b": np.linspace(1, 2, 12), "label": [0, 1, 2] * 4})
    for fmt in ("csv", "parquet"):  # it said "column 'b' has 12 missing (NaN) values"
        for message in _table_error(tmp_path, frame, frame.drop(columns=["b"]), fmt):
            assert message == (
                f"{fmt}:{tmp_path}: column 'b' is missing from {tmp_path}/test.{fmt} (it is in "
                f"{tmp_path}/train.{fmt}); add it to the test data or drop it from the train data"
            )
        (tmp_path / f"train.{fmt}").unlink()
        (tmp_path / f"test.{fmt}").unlink()
    for message in _table_error(tmp_path, frame.drop(columns=["b"]), frame):  # Hugging Face's "cannot cast"
        assert message == (f"csv:{tmp_path}: column 'b' is in {tmp_path}/test.csv but not in {tmp_path}/train.csv; "
                           "give both files the same columns")  # fmt: skip


def test_a_column_of_images_named_as_the_text_column_is_refused(tmp_path: Path):
    import datasets

    rows = {"image": [{"bytes": b"\x89PNG...", "path": None}] * 6, "label": [0, 1, 2] * 2}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)})
    dd.save_to_disk(str(tmp_path / "imgs"))
    with pytest.raises(DataError, match="column 'image' holds images, not text; set data.text_column"):
        load_data(DataSpec(name=f"hf:{tmp_path / 'imgs'}", text_column="image"))


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            {"mean": [0.5], "std": [0]},
            "std[0] is 0; each std must be a finite number > 0 (one per channel), or use "
            "data.normalize: train to measure them from the data",
        ),
        ({"mean": [0.5, 0.5], "std": [1, float("inf")]}, "std[1] is inf; each std must be a finite number > 0"),
        ({"mean": [float("nan")], "std": [1]}, "mean[0] is nan; each mean must be a finite number (one per channel)"),
        ({"mean": [0.5, 1], "std": [1]}, "mean has 2 entries and std 1; give one of each per channel"),
        ({"mean": [0.5], "std": [1], "scale": 2}, ".scale: unknown field; check the spelling"),
        ({"mean": [0.5]}, ".std: Field required"),
        ("standard", "got 'standard'; input should be 'train' or 'none'"),
    ],
)
def test_given_normalisation_statistics_that_are_not_finite_or_zero_name_the_sub_field(given, line):
    from growpipe.config import build_config
    from growpipe.errors import ConfigError

    with pytest.raises(ConfigError) as e:  # one problem, not one per member of the union under pydantic's names
        build_config({"data": {"normalize": given}})
    lines = str(e.value).splitlines()
    field = "data.normalize" if line.startswith(".") else "data.normalize: "
    assert lines[0].endswith("1 problem(s)") and lines[1].startswith(f"  {field}{line}") and len(lines) == 2
    ok = build_config({"data": {"normalize": {"mean": [0.5], "std": [0.25]}}}).data.normalize
    assert (ok.mean, ok.std) == ([0.5], [0.25]) and build_config(
        {"data": {"normalize": "none"}}
    ).data.normalize == "none"


def test_the_cli_refuses_garbage_inputs_with_one_line_and_exit_2(tmp_path: Path, capsys):
    from growpipe.cli import main

    frame = pd.DataFrame({"a": np.linspace(0, 1, 12), "label": [0, 1, 2] * 4})
    bad = frame.copy()
    bad.loc[2, "a"] = -np.inf
    _csvs(tmp_path, bad, frame)
    run = ["train", "--runtime", "local", "--set", "tracking.mlflow=false", "--set", "checkpoint.enabled=false"]
    cases = {  # before: trained with NaN losses to chance accuracy and exit 0, or a pydantic-internal field name
        f"{tmp_path}/train.csv row 3 (line 4), column 'a': -inf; features must be finite": [
            "--set", f"data.name=csv:{tmp_path}", "--set", "data.stream=true"],
        "  data.normalize: std[0] is 0; each std must be a finite number > 0": [
            "--set", "data.normalize={mean: [0.5], std: [0]}"],
    }  # fmt: skip
    for needle, extra in cases.items():
        assert main([*run, *extra]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and "function-after" not in err, err


def _text_parquets(folder: Path, labels: list[int] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train, test = text_frames()
    if labels is not None:
        train = train.assign(label=[labels[i % len(labels)] for i in range(len(train))])
    train.to_parquet(folder / "train.parquet")
    test.to_parquet(folder / "test.parquet")
    return folder


def test_a_damaged_parquet_file_is_named_before_anything_reads_it(tmp_path: Path, capsys):
    from growpipe.cli import main
    from growpipe.data.presence import data_problem

    folder = _text_parquets(tmp_path / "news")
    whole = (folder / "test.parquet").read_bytes()
    (folder / "test.parquet").write_bytes(whole[: len(whole) // 2])  # cut short: no footer
    for spec in (DataSpec(name=f"parquet:{folder}"), DataSpec(name="20newsgroups", root=str(folder))):
        with pytest.raises(DataError, match=f"^{re.escape(str(folder / 'test.parquet'))}: not a readable parquet file"):
            load_data(spec)
    why = data_problem(DataSpec(name=f"parquet:{folder}"))  # what train lists before Ray starts
    assert why is not None and why.startswith(f"{folder}/test.parquet: not a readable parquet file (")
    assert why.endswith("replace it with a whole parquet file (copy or export it again)") and "\n" not in why
    out = tmp_path / "r.json"
    assert main(["train", "--set", f"data.name=parquet:{folder}", "--set", "tracking.mlflow=false",
                 "--json-out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"{folder}/test.parquet: not a readable parquet file" in err and "Traceback" not in err
    assert not out.exists()
    (folder / "test.parquet").write_bytes(whole)
    inside = bytearray((folder / "train.parquet").read_bytes())
    inside[100:400] = b"\xab" * 300  # its footer whole, its data not: found when the rows are read
    (folder / "train.parquet").write_bytes(bytes(inside))
    for spec in (DataSpec(name=f"parquet:{folder}"), DataSpec(name="20newsgroups", root=str(folder))):
        with pytest.raises(DataError, match=f"^{re.escape(str(folder / 'train.parquet'))}: not a readable parquet"):
            load_data(spec)


def test_a_split_file_that_is_a_folder_is_said_to_be_one(tmp_path: Path):
    from growpipe.data.presence import data_problem

    folder = _text_parquets(tmp_path / "news")
    (folder / "train.parquet").unlink()
    (folder / "train.parquet").mkdir()
    why = data_problem(DataSpec(name=f"parquet:{folder}"))
    assert why is not None and why.startswith(f"data.name: {folder}/train.parquet is a folder, not a file; ")
    with pytest.raises(DataError, match="train.parquet is a folder, not a file"):
        load_data(DataSpec(name=f"parquet:{folder}"))


def test_training_data_of_one_class_is_refused_before_the_run_and_at_load(tmp_path: Path):
    from growpipe.data.presence import data_problem

    folder = _text_parquets(tmp_path / "news", labels=[2])
    why = data_problem(DataSpec(name=f"parquet:{folder}"))  # read from the label column, before Ray starts
    assert why == (f"data.name: every one of the 60 training rows of {folder}/train.parquet is of class 2; a "
                   "classifier needs at least 2 classes to learn: point data.name at data with 2 or more classes, "
                   "or relabel it")  # fmt: skip
    with pytest.raises(DataError, match="every one of the 60 training rows of .* is of class 'topic2'"):
        load_data(DataSpec(name=f"parquet:{folder}", num_classes=3))
    frame = pd.DataFrame({"a": np.linspace(0, 1, 12), "label": ["cat", "dog"] * 6})
    spec = _csvs(tmp_path, frame, frame)
    assert load_data(spec).num_classes == 2
    with pytest.raises(DataError, match=r"of class 'cat'; .* \(after data.limit_train and data.val_fraction\)"):
        load_data(spec.model_copy(update={"limit_train": 1}))  # what is left of it holds one class
    single = _csvs(tmp_path, frame.assign(label="cat"), frame.assign(label="cat"))
    with pytest.raises(DataError, match=f"every one of the 12 training rows of csv:{tmp_path} is of class 'cat'"):
        load_data(single)


def test_a_token_matrix_too_big_for_the_machine_names_max_len(text_dir: Path, monkeypatch):
    import psutil

    class Small:  # a machine of 1 KiB: the 90 documents of 15 words padded to 15 ids each take 10.5 KiB
        total = 1024

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Small())
    with pytest.raises(DataError) as e:
        load_data(DataSpec(name="20newsgroups", root=str(text_dir), max_len=1_000_000_000))
    assert str(e.value).startswith("data.max_len: 90 documents of 15 token ids each (15 words kept per document, "
                                   "at most data.max_len=1,000,000,000) need ")  # fmt: skip
    assert str(e.value).endswith("; lower data.max_len or set data.max_len_percentile (e.g. 95)")
