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
from tests.docs_run import wait_until
from tests.noise import library_noise

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


def _epochs_in_tune_and_mlflow(tmp_path: Path, sweep: str) -> dict[str, tuple[str, str | None, list[int]]]:
    """Every trial's MLflow status, end reason and epochs; asserts Tune recorded the same epochs its MLflow run
    logged."""
    from ray.tune import ExperimentAnalysis

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeps")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    seen = {}
    for trial_id, df in ExperimentAnalysis(str(tmp_path / "out" / "trials")).trial_dataframes.items():
        run = runs[f"{sweep}-{trial_id}"]
        in_tune = [int(i) for i in df["training_iteration"]]
        in_mlflow = [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
        assert in_tune == in_mlflow, (trial_id, in_tune, in_mlflow)
        seen[trial_id] = (run.info.status, run.data.tags.get("growpipe.end_reason"), in_tune)
    return seen


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_trial_asha_stops_trains_no_epoch_past_the_report_tune_stopped_it_at(tmp_path: Path, capfd):
    """ASHA stops the poor trial (a learning rate that learns nothing) at its first rung: the run trains no
    epoch after the report Tune answered with stop, so Tune and MLflow have the same epochs for both trials;
    both end FINISHED, the stopped one with the end reason stopped_early (recorded by the sweep: Tune ends the
    trial's process, and the controller it owns, before the trial could), the other finished. The sweep's
    output holds no library log line."""
    fast = {"train.epochs": 2, "tracking.log_model": False, "tracking.system_metrics": False}
    # one trial at a time (2.1 of the session's 4 CPUs each), the good one first: the poor one meets its rung
    path = _sweep_file(tmp_path, name="asha", set=fast, search_space={"train.lr": {"grid": [0.003, 1e-9]}},
                       metric="acc.exit1", scheduler={"name": "asha", "grace_period": 1, "reduction_factor": 2},
                       resources={"cpus_per_stage": 1.0, "max_concurrent_trials": 1})  # fmt: skip
    summary = run_sweep(load_sweep(path))
    stopped = {t["trial"]: t["stopped_early"] for t in summary["trials"]}
    assert sorted(stopped.values()) == [False, True], summary["trials"]
    seen = _epochs_in_tune_and_mlflow(tmp_path, "asha")
    for trial, early in stopped.items():
        assert seen[trial] == (("FINISHED", "stopped_early", [1]) if early else ("FINISHED", "finished", [1, 2])), seen
    printed = capfd.readouterr()
    assert library_noise(printed.out + printed.err) == []  # Tune's tables and growpipe's lines only


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_threshold_sweep_reuses_stored_predictions_without_training(tmp_path: Path):
    ck = tmp_path / "ck"
    code = main(["train", "--runtime", "local", "--set", "method=dascpl", "--set", "net.blocks=3",
                 "--set", "net.width=32", "--set", "train.epochs=2", "--set", "data.val_fraction=0.2",
                 "--set", "tracking.mlflow=false", "--save", str(ck), "-q"])  # fmt: skip
    assert code == 0
    state_before = (ck / "state.pt").read_bytes()
    grid = [0.4, 0.99]
    path = _sweep_file(
        tmp_path,
        kind="thresholds",
        source={"checkpoint": str(ck), "split": "val"},
        search_space={"threshold": {"grid": grid}, "eval.confidence": {"grid": ["max_prob", "entropy"]}},
        cost_weight=0.2,
    )
    summary = run_sweep(load_sweep(path))
    assert len(summary["trials"]) == 4 and all(t["error"] is None for t in summary["trials"])
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
    assert len(children) == 4
    assert {(c.info.status, c.data.tags.get("growpipe.end_reason")) for c in children} == {("FINISHED", "finished")}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"search_spce": {"method": {"grid": ["al"]}}}, "search_spce (line 3): unknown field"),
        ({"search_space": {}}, "search_space is empty"),
        ({"search_space": {"net.blockz": {"grid": [2, 3]}}}, "net.blockz: unknown field"),
        ({"search_space": {"net.blocks": {"grid": [2, 0]}}}, "search_space.net.blocks=0"),
        ({"search_space": {"train.lr": {"loguniform": [0, 0.1]}}}, "loguniform bounds must be positive"),
        ({"search_space": {"method": {"grid": ["al"]}}, "metric": "acuracy"}, "metric: 'acuracy'"),
        (
            {"search_space": {"method": {"grid": ["al"]}}, "resources": {"cpus_per_stage": 3}},
            "resources: one trial needs CPU 6.1",
        ),
        ({"search_space": {"method": {"grid": ["al"]}}, "search": "hyperopt"}, "search (line 3): got 'hyperopt'"),
        ({"search_space": {"method": {"grid": ["al"]}}, "search": "optuna"}, "use choice instead of grid"),
        ({"search_space": {"method": {"grid": ["al"]}}, "scheduler": {"name": "pbt"}}, "pbt mutates choice"),
    ],
)
@pytest.mark.usefixtures("ray_session")
def test_bad_sweep_files_are_refused_before_any_trial(tmp_path: Path, capsys, fields, message):
    path = _sweep_file(tmp_path, **fields)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "out" / "trials").exists()  # no trial started


@pytest.mark.usefixtures("ray_session")
def test_a_malformed_sweep_gate_is_refused_before_any_trial(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("GROWPIPE_STOP_SWEEP_AT", "one")
    assert main(["sweep", str(_sweep_file(tmp_path, search_space={"method": {"grid": ["al"]}}))]) == 2
    err = capsys.readouterr().err
    assert "GROWPIPE_STOP_SWEEP_AT='one': expected EPOCH:PATH" in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "trials").exists()


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


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
@pytest.mark.timeout(1200)  # 219 s in a loaded CI run; its first trial alone passed 240 s at a load of 8
def test_an_interrupted_optuna_sweep_resumes_without_training_any_trial_twice(tmp_path: Path):
    """SIGTERM stops the sweep the way Ctrl-C does (Tune saves its state, exit 143, the parent MLflow run
    KILLED and so the run of the trial that was running); the same command resumes it: the trials that had
    finished are kept, the one that was running goes on from its last epoch's checkpoint (its Tune iterations
    going on from there too), Optuna proposes the rest, all in the same MLflow runs, with the epochs Tune
    saw. The sweep is recorded in MLflow (a parent run, a child per trial) and its best config trains again."""
    import json
    import signal
    import subprocess
    import sys

    fast = {"train.epochs": 2, "tracking.log_model": False, "tracking.system_metrics": False}
    path = _sweep_file(tmp_path, name="resumable", search="optuna", seed=3, num_samples=2, set=fast,
                       search_space={"train.lr": {"loguniform": [0.0005, 0.01]}}, scheduler={"name": "fifo"},
                       resources={"cpus_per_stage": 0.5, "max_concurrent_trials": 1})  # fmt: skip
    out = tmp_path / "out"
    import ray

    address = ray.get_runtime_context().gcs_address  # the session's Ray: no second one to start
    cmd = [sys.executable, "-m", "growpipe.cli", "sweep", str(path), "--address", address]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def one_done_and_the_second_running() -> bool:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        return len(list(out.glob("trials/*/checkpoint_000000"))) >= 2

    # 600 s: a guard against a sweep that never checkpoints, not a timing expectation
    wait_until("the sweep's second trial's first checkpoint", one_done_and_the_second_running, timeout=600)
    proc.send_signal(signal.SIGTERM)
    printed, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert library_noise(printed + err) == []  # the trials' and controllers' lines reach it (it joined with --address)
    state = json.loads((out / "sweep.json").read_text())
    assert state["status"] == "interrupted"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweeps")
    runs = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{state['parent_run_id']}'")
    ends = {(r.info.status, r.data.tags.get("growpipe.end_reason")) for r in runs}  # none left RUNNING
    assert len(runs) == 2 and ends <= {("FINISHED", "finished"), ("KILLED", "killed: the sweep was interrupted")}

    summary = run_sweep(load_sweep(path))  # the same command again: resumes
    assert summary["mlflow_run_id"] == state["parent_run_id"]
    assert len(summary["trials"]) == 2 and all(t["epochs"] == 2 and not t["error"] for t in summary["trials"])
    best = summary["best"]
    assert best["metric"] == max(t["metric"] for t in summary["trials"])
    assert Path(best["checkpoint"], "manifest.json").is_file()  # a growpipe checkpoint, as a Tune checkpoint
    parent = client.get_run(state["parent_run_id"])
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert parent.data.metrics["best.test_accuracy"] == pytest.approx(best["metric"])
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"best.yaml", "trials.md"}
    for c in children:
        assert float(c.data.params["train.lr"]) > 0
    # no trial started over (an epoch cut short by the stop is trained again); Tune counted on from epoch 1
    assert sorted(_epochs_in_tune_and_mlflow(tmp_path, "resumable").values()) == [("FINISHED", "finished", [1, 2])] * 2

    # the best config round-trips through growpipe train --config
    best_yaml = Path(summary["best_config"])
    cfg = load_config(best_yaml)
    assert cfg.train.lr == pytest.approx(best["params"]["train.lr"]) and cfg.net.width == 32
    assert cfg.tracking.parent_run_id is None and cfg.tracking.run_id is None
    again = tmp_path / "again.json"
    code = main(["train", "--config", str(best_yaml), "--runtime", "local", "--set", "tracking.mlflow=false",
                 "--set", "train.epochs=1", "--json-out", str(again), "-q"])  # fmt: skip
    assert code == 0 and again.is_file()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_sweep_stopped_between_a_report_and_its_checkpoint_resumes_without_reporting_the_epoch_again(
    tmp_path: Path, monkeypatch
):
    """Tune records a trial's report in one step of its loop and registers the checkpoint the report carries in
    a later one: a stop between them (GROWPIPE_STOP_SWEEP_AT puts it there; a SIGTERM that landed there failed
    the optuna resume test above 2 times in 24) saves a state whose trial has its epoch-1 row and no checkpoint.
    The resumed trial goes on from the epoch-1 checkpoint it wrote itself and reports epoch 2 only: Tune and
    MLflow have epochs 1 and 2 once each."""
    from ray.tune import ExperimentAnalysis

    fast = {"train.epochs": 2, "net.blocks": 1, "tracking.log_model": False, "tracking.system_metrics": False}
    path = _sweep_file(tmp_path, name="gap", set=fast, search_space={"train.lr": {"grid": [0.003]}},
                       scheduler={"name": "fifo"}, resources={"cpus_per_stage": 0.5})  # fmt: skip
    marker = tmp_path / "stopped"
    monkeypatch.setenv("GROWPIPE_STOP_SWEEP_AT", f"1:{marker}")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(path))
    assert marker.is_file()
    (trial,) = ExperimentAnalysis(str(tmp_path / "out" / "trials")).trials  # what Tune saved
    assert trial.last_result["training_iteration"] == 1 and trial.checkpoint is None

    summary = run_sweep(load_sweep(path))  # resumes
    assert [(t["epochs"], t["error"]) for t in summary["trials"]] == [(2, None)]
    assert Path(summary["best"]["checkpoint"], "manifest.json").is_file()
    assert list(_epochs_in_tune_and_mlflow(tmp_path, "gap").values()) == [("FINISHED", "finished", [1, 2])]


def test_pbt_with_one_trial_at_a_time_is_refused_naming_the_fix():
    """PBT copies a running trial's checkpoint into another: with one trial at a time it never exploits."""
    from growpipe.tune.spec import SweepSpec
    from growpipe.tune.sweep import scheduler_problem, trials_at_once

    need = {"CPU": 2.1}
    assert trials_at_once(need, {"CPU": 2.0}, None) == 0
    assert trials_at_once(need, {"CPU": 4.2}, None) == 2 and trials_at_once(need, {"CPU": 8.0}, 1) == 1
    assert trials_at_once({"CPU": 1.1, "GPU": 1.0}, {"CPU": 16.0, "GPU": 1.0}, None) == 1
    space = {"train.lr": {"loguniform": [0.001, 0.1]}}
    pbt = SweepSpec.model_validate({"name": "p", "search_space": space, "scheduler": {"name": "pbt"}})
    why = scheduler_problem(pbt, 1, {"CPU": 2.1}, {"CPU": 2.0})
    assert why and why.startswith("scheduler pbt: only 1 trial runs at a time (the cluster has CPU 2 and a trial")
    assert "runtime.num_cpus" in why and "scheduler asha or fifo" in why and "\n" not in why
    assert scheduler_problem(pbt, 2, need, {"CPU": 4.2}) is None
    asha = SweepSpec.model_validate({"name": "a", "search_space": space})
    assert scheduler_problem(asha, 1, need, {"CPU": 2.0}) is None
    one = pbt.model_copy(update={"resources": pbt.resources.model_copy(update={"max_concurrent_trials": 1})})
    assert "resources.max_concurrent_trials is 1" in (scheduler_problem(one, 1, need, {"CPU": 8.0}) or "")


def test_a_sweep_whose_data_is_not_there_is_refused_with_its_other_problems(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # an embedded Ray: the trials read the data on this machine
    path = _sweep_file(tmp_path, search_space={"train.lr": {"grid": [0.1]}}, metric="nope",
                       set={"data.name": "fashion-mnist", "data.root": str(tmp_path / "none")})  # fmt: skip
    assert main(["sweep", str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("2 problem(s)") and err[1].startswith("  metric: 'nope'"), err
    assert (
        err[2]
        == f"  data.root: {tmp_path / 'none'} does not exist; point it at the directory of the fashion-mnist files"
    )


def test_an_asha_grace_period_longer_than_the_trials_is_one_line():
    """Was Ray's AssertionError and a traceback (the digits sweep run with GROWPIPE_SET train.epochs=1)."""
    from growpipe.tune.spec import SweepSpec
    from growpipe.tune.sweep import grace_problem

    space = {"train.lr": {"loguniform": [0.001, 0.1]}}
    asha = SweepSpec.model_validate({"name": "a", "search_space": space, "scheduler": {"grace_period": 2}})
    assert grace_problem(asha, 1) == (
        "scheduler.grace_period: 2 epochs is more than the trials' 1; ASHA stops a trial only after its grace "
        "period: lower it to at most 1, or train longer (train.epochs)"
    )
    assert grace_problem(asha, 2) is None
    fifo = asha.model_copy(update={"scheduler": asha.scheduler.model_copy(update={"name": "fifo"})})
    assert grace_problem(fifo, 1) is None
