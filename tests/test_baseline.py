"""The classical bar (growpipe baseline, eval.baseline): on the run's own rows, in the result JSON and MLflow, and
one line when the data is of a kind it cannot handle."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from growpipe.baseline import (
    FEATURE_BAR,
    LBFGS_FEWEST,
    LBFGS_MOST,
    TEXT_BAR,
    ClassicalBar,
    classical_bar,
    groups_refusal,
    lbfgs_iterations,
    memory_refusal,
)
from growpipe.cli import main
from growpipe.data import load_data
from growpipe.local import train_local
from growpipe.report import format_bar, format_report
from tests.conftest import tiny_config

CHUNKS = {"scheme": "chunks", "count": 2, "base": 1}


def test_the_text_bar_fits_the_raw_text_of_exactly_the_rows_the_run_trains_and_tests_on(text_dir: Path):
    data = {"name": f"parquet:{text_dir}", "max_len": 16, "limit_train": 50, "limit_test": 20, "val_fraction": 0.2}
    cfg = tiny_config(data=data)
    bundle = load_data(cfg.data, keep_text=True)
    for split in (bundle.train, bundle.val, bundle.test):  # each raw text is the row its token ids came from
        assert split.text is not None and torch.equal(bundle.vocab.encode(split.text.tolist(), 15), split.x)
    assert load_data(cfg.data).train.text is None  # a run does not carry the raw text along
    bar = classical_bar(cfg)
    assert bar["kind"] == TEXT_BAR and "TfidfVectorizer" in bar["model"]
    assert (bar["train_rows"], bar["test_rows"]) == (40, 20)  # 50 subsampled, 10 of them held out for validation
    assert bar["accuracy"] >= 0.95  # three topics of distinct words
    assert classical_bar(cfg)["accuracy"] == bar["accuracy"]  # saga's sample order comes from the run's seed


def test_the_digits_bar_is_standardised_logistic_regression_above_90_percent():
    bar = classical_bar(tiny_config())
    assert bar["kind"] == FEATURE_BAR and (bar["train_rows"], bar["test_rows"]) == (1347, 450)
    assert bar["accuracy"] > 0.9 and bar["seconds"] >= 0 and f"max_iter={LBFGS_MOST}" in bar["model"]


def test_the_feature_bars_iteration_cap_shrinks_with_the_set_within_its_bounds():
    assert lbfgs_iterations(1347, 64, 10) == LBFGS_MOST  # digits: converges well within it
    assert LBFGS_FEWEST < lbfgs_iterations(60_000, 784, 10) < 40  # Fashion-MNIST: seconds
    assert lbfgs_iterations(50_000, 3072, 100) == LBFGS_FEWEST  # CIFAR-100: no fewer than the floor


def test_data_read_from_disk_per_batch_is_read_whole_for_the_bar_when_it_fits(digits_on_disk: str):
    bar = classical_bar(tiny_config(data={"name": digits_on_disk, "stream": True, "image_shape": [1, 8, 8]}))
    assert (bar["train_rows"], bar["test_rows"]) == (1347, 450) and bar["accuracy"] > 0.9


def test_kinds_the_bar_cannot_handle_are_one_line_each():
    assert groups_refusal("none") is None and groups_refusal("bands") is None  # cuts of the same images
    chunks = groups_refusal("chunks")
    assert chunks is not None and "\n" not in chunks and "data.feature_groups.scheme=chunks" in chunks
    assert memory_refusal(False, 10**9, 10**4) is None  # in memory already
    assert memory_refusal(True, 70_000, 784) is None
    big = memory_refusal(True, 1_000_000, 3 * 224 * 224)
    assert big is not None and "\n" not in big and "data.limit_train" in big


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_run_with_eval_baseline_has_the_bar_in_its_result_report_and_mlflow(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "experiment": "tests", "workdir": str(tmp_path)}
    cfg = tiny_config(name="with-bar", eval={"baseline": True}, tracking=tracking)
    result = train_local(cfg, progress=None).result
    bar = result["baseline"]
    assert bar["kind"] == FEATURE_BAR and bar["accuracy"] > 0.9
    assert f"baseline {FEATURE_BAR}: test accuracy {bar['accuracy']:.4f}" in format_report(result)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.data.metrics["final.baseline_accuracy"] == pytest.approx(bar["accuracy"])


def test_a_run_whose_data_the_bar_cannot_handle_says_so_in_one_line_and_goes_on(text_dir: Path):
    cfg = tiny_config(
        eval={"baseline": True},
        data={"name": f"parquet:{text_dir}", "max_len": 16, "batch_size": 20, "feature_groups": CHUNKS},
        net={"backbone": "embedding", "blocks": 2, "width": 8, "embed_dim": 8},
    )
    lines: list[str] = []
    result = train_local(cfg, progress=lines.append).result
    said = [line for line in lines if line.startswith("baseline")]
    assert len(said) == 1 and said[0].startswith("baseline skipped: data.feature_groups.scheme=chunks")
    assert "skipped" in result["baseline"] and result["test_accuracy"] is not None
    assert "baseline" not in format_report(result)  # said once, as the run ended


def test_a_bar_that_fails_on_its_own_is_one_line_and_the_run_stands(tmp_path: Path):
    # every word once: TF-IDF's min_df=2 leaves no terms, and scikit-learn raises its own ValueError
    words = [f"w{i}" for i in range(400)]
    for split, n in (("train", 40), ("test", 20)):
        rows = [" ".join(words[(i * 5) % 400 : (i * 5) % 400 + 5]) for i in range(n)]
        pd.DataFrame({"text": rows, "label": [i % 2 for i in range(n)]}).to_parquet(tmp_path / f"{split}.parquet")
    cfg = tiny_config(eval={"baseline": True}, data={"name": f"parquet:{tmp_path}", "max_len": 8, "batch_size": 20},
                      net={"backbone": "embedding", "blocks": 2, "width": 8, "embed_dim": 8})  # fmt: skip
    said: list[str] = []
    result = ClassicalBar(cfg, said.append).result_fields()
    assert said == [format_bar(result["baseline"])] and said[0].startswith(
        "baseline skipped: the bar failed (ValueError"
    )
    assert "\n" not in said[0]


def test_growpipe_baseline_prints_the_bar_and_writes_its_json_or_refuses_a_kind_in_one_line(
    text_dir: Path, tmp_path: Path, capsys
):
    out = tmp_path / "bar.json"
    name = f"data.name=parquet:{text_dir}"
    assert main(["baseline", "--set", name, "--set", "data.max_len=16", "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert f"baseline {TEXT_BAR}: test accuracy {written['accuracy']:.4f}" in printed
    assert written["dataset"] == f"parquet:{text_dir}" and written["test_rows"] == 30
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    assert main(["baseline", "--set", name, "--json-out", str(mine)]) == 2  # not growpipe's: not replaced
    assert mine.read_text() == "{}"
    capsys.readouterr()
    chunks = ["--set", "data.feature_groups.scheme=chunks", "--set", "data.feature_groups.count=2"]
    assert main(["baseline", "--set", name, *chunks]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "baseline skipped: data.feature_groups.scheme=chunks" in err


def test_baseline_on_data_of_one_class_is_one_line_and_exit_2(tmp_path: Path, capsys):
    rows = pd.DataFrame({"a": [i / 11 for i in range(12)], "b": [1 - i / 11 for i in range(12)], "label": ["cat"] * 12})
    for split in ("train", "test"):
        rows.to_csv(tmp_path / f"{split}.csv", index=False)
    out = tmp_path / "bar.json"
    assert main(["baseline", "--set", f"data.name=csv:{tmp_path}", "--json-out", str(out)]) == 2  # was: a traceback
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"growpipe baseline: error: data.name: every one of the 12 training rows of "
                                    f"csv:{tmp_path} is of class 'cat'; a classifier needs at least 2 classes to "
                                    "learn: point data.name at data with 2 or more classes, or relabel it")  # fmt: skip
    assert "Traceback" not in err
    assert not out.exists()
