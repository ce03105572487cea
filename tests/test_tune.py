"""Ray Tune sweeps on the test session's local Ray: a real 2-trial sweep into a real MLflow store, a threshold
sweep that re-reads stored predictions, and sweep files refused before any trial starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from growpipe.cli import main
from growpipe.config import load_config
from growpipe.errors import ConfigError
from growpipe.tune.predictions import compute_exits, load_exits
from growpipe.tune.spec import Domain, load_sweep
from growpipe.tune.sweep import run_sweep

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "net.width": 32,
    "al.code_dim": 8,
    "scpl.proj_dim": 16,
    "threads": 1,
    "runtime.dashboard": False,
    "runtime.timeline_epoch": 0,
}


def _sweep_file(tmp_path: Path, **fields: Any) -> Path:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"tracking.mlflow": True, "tracking.uri": uri, "tracking.experiment": "sweeps",
                "tracking.workdir": str(tmp_path)}  # fmt: skip
    spec = {"name": "tiny", "output": str(tmp_path / "out"), **fields}
    spec["set"] = {**TINY, **tracking, **fields.get("set", {})}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.usefixtures("ray_session")
def test_two_trial_sweep_is_recorded_and_its_best_config_trains(tmp_path: Path, capsys):
    path = _sweep_file(
        tmp_path,
        set={"train.epochs": 2},
        search_space={"method": {"grid": ["al", "dascpl"]}},
        scheduler={"name": "fifo"},
    )
    summary = run_sweep(load_sweep(path))
    assert len(summary["trials"]) == 2 and all(t["error"] is None for t in summary["trials"])
    assert {t["params"]["method"] for t in summary["trials"]} == {"al", "dascpl"}
    assert all(t["epochs"] == 2 and 0.0 <= t["metric"] <= 1.0 for t in summary["trials"])
    best = summary["best"]
    assert best["metric"] == max(t["metric"] for t in summary["trials"])
    assert Path(best["checkpoint"], "manifest.json").is_file()  # the trained net, as a Tune checkpoint

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeps")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_id == summary["mlflow_run_id"]]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == summary["mlflow_run_id"]]
    assert len(parent) == 1 and len(runs) == 3 and len(children) == 2
    assert parent[0].data.metrics["best.test_accuracy"] == pytest.approx(best["metric"])
    assert {c.data.params["method"] for c in children} == {"al", "dascpl"}
    assert all(c.info.status == "FINISHED" for c in children)
    assert all([m.step for m in client.get_metric_history(c.info.run_id, "test_accuracy")] == [1, 2] for c in children)
    assert {a.path for a in client.list_artifacts(parent[0].info.run_id)} >= {"best.yaml", "trials.md"}

    # the best config round-trips through growpipe train --config
    best_yaml = Path(summary["best_config"])
    cfg = load_config(best_yaml)
    assert cfg.method == best["params"]["method"] and cfg.net.width == 32
    assert cfg.tracking.parent_run_id is None and cfg.tracking.run_id is None
    out = tmp_path / "again.json"
    code = main(["train", "--config", str(best_yaml), "--runtime", "local", "--set", "tracking.mlflow=false",
                 "--json-out", str(out), "-q"])  # fmt: skip
    assert code == 0 and out.is_file()


@pytest.mark.usefixtures("ray_session")
def test_threshold_sweep_reuses_stored_predictions_without_training(tmp_path: Path):
    ck = tmp_path / "ck"
    code = main(["train", "--runtime", "local", "--set", "method=dascpl", "--set", "net.blocks=3",
                 "--set", "net.width=32", "--set", "train.epochs=2", "--set", "data.val_fraction=0.2",
                 "--set", "tracking.mlflow=false", "--save", str(ck), "-q"])  # fmt: skip
    assert code == 0
    state_before = (ck / "state.pt").read_bytes()
    grid = [0.4, 0.8, 0.99]
    path = _sweep_file(
        tmp_path,
        kind="thresholds",
        source={"checkpoint": str(ck), "split": "val"},
        search_space={"threshold": {"grid": grid}, "eval.confidence": {"grid": ["max_prob", "entropy"]}},
        cost_weight=0.2,
    )
    summary = run_sweep(load_sweep(path))
    assert len(summary["trials"]) == 6 and all(t["error"] is None for t in summary["trials"])
    assert (ck / "state.pt").read_bytes() == state_before  # nothing retrained the source

    stored = load_exits(tmp_path / "out" / "exits.npz")
    direct = compute_exits(ck, "val")  # the oracle: the same numbers straight from the net
    assert stored.preds.depths == direct.preds.depths == [1, 2, 3]
    for d in stored.preds.depths:
        assert torch.equal(stored.preds.probs[d], direct.preds.probs[d])
    for t in summary["trials"]:
        want = direct.trade_off(t["params"]["threshold"], t["params"]["eval.confidence"], 0.2)["score"]
        assert t["metric"] == pytest.approx(want)
    best = load_config(summary["best_config"])
    assert best.eval.thresholds == [summary["best"]["params"]["threshold"]]
    assert best.eval.confidence == summary["best"]["params"]["eval.confidence"]
    assert best.net.blocks == 3 and best.method == "dascpl"  # the source net's own config

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeps")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'")
    assert len(children) == 6


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"search_spce": {"method": {"grid": ["al"]}}}, "search_spce: unknown field"),
        ({"search_space": {}}, "search_space is empty"),
        ({"search_space": {"net.blockz": {"grid": [2, 3]}}}, "net.blockz: unknown field"),
        ({"search_space": {"net.blocks": {"grid": [2, 0]}}}, "search_space.net.blocks=0"),
        ({"search_space": {"train.lr": {"loguniform": [0, 0.1]}}}, "loguniform bounds must be positive"),
        ({"search_space": {"method": {"grid": ["al"]}}, "metric": "acuracy"}, "metric: 'acuracy'"),
        (
            {"search_space": {"method": {"grid": ["al"]}}, "resources": {"cpus_per_stage": 3}},
            "resources: one trial needs CPU 6.1",
        ),
    ],
)
@pytest.mark.usefixtures("ray_session")
def test_bad_sweep_files_are_refused_before_any_trial(tmp_path: Path, capsys, fields, message):
    path = _sweep_file(tmp_path, **fields)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "out" / "trials").exists()  # no trial started


def test_shipped_sweep_files_check_out(capsys):
    files = sorted((REPO / "tune_configs").glob("*.yaml"))
    assert len(files) >= 3
    kinds = set()
    for f in files:
        assert main(["sweep", str(f), "--check"]) == 0, capsys.readouterr().err
        kinds.add(load_sweep(f).kind)
    assert kinds == {"train", "thresholds"}


def test_domains_need_exactly_one_valid_kind():
    assert Domain(grid=[1, 2]).corners() == [1, 2]
    assert Domain(randint=(2, 5)).corners() == [2, 4]
    for bad in ({}, {"grid": [1], "choice": [2]}, {"uniform": (1.0, 0.5)}, {"choice": []}):
        with pytest.raises(ValueError):
            Domain(**bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_sweep("/nonexistent/sweep.yaml")
