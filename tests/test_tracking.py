"""MLflow tracking against a real sqlite store, and a tracking server that is not there."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from growpipe.errors import PipelineError
from growpipe.local import train_local
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import actor_exists, tiny_config


def _tracked(tmp_path: Path, name: str, uri: str | None = None, mlflow: bool = True, **extra):
    uri = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    return tiny_config(
        name=name,
        method="dascpl",
        threads=1,
        train={"epochs": 2},
        grow={"schedule": [{"kind": "layer", "epochs": 1}]},
        tracking={"mlflow": mlflow, "uri": uri, "experiment": "tests", "workdir": str(tmp_path)},
        **extra,
    )


def _only_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tests")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def _check_logged_run(client: MlflowClient, run, blocks: int) -> set[str]:
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == "dascpl" and run.data.params["net.blocks"] == "2"
    history = client.get_metric_history(run.info.run_id, "loss.b0.ce")
    assert [m.step for m in history] == [1, 2]  # frozen after the growth: no loss in epoch 3
    assert [m.step for m in client.get_metric_history(run.info.run_id, f"acc.exit{blocks}")] == [3]
    growth = client.get_metric_history(run.info.run_id, "growth.blocks")
    assert [(m.step, m.value) for m in growth] == [(2, 3.0)]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    names |= {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    for want in ("config.yaml", "growth_history.json", "result.json", "evaluation.txt", "checkpoint",
                 "plots/exit_accuracy.png", "plots/accuracy_vs_compute.png", "plots/accuracy_vs_threshold.png",
                 "plots/exit_depth_histogram.png"):  # fmt: skip
        assert want in names, (want, names)
    return names


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_reference_run_is_logged_to_mlflow_with_its_artifacts_beside_the_store(tmp_path: Path, monkeypatch):
    from growpipe.tracking import artifact_root

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's own default would put the artifacts in ./mlruns here
    cfg = _tracked(tmp_path, "tracked-local")
    train_local(cfg, progress=None)
    client, run = _only_run(cfg.tracking.uri)
    _check_logged_run(client, run, blocks=3)
    assert run.info.artifact_uri.removeprefix("file://").startswith(f"{tmp_path}/mlartifacts/")
    assert not (elsewhere / "mlruns").exists()
    assert artifact_root("sqlite:////data/runs/mlflow.db") == "/data/runs/mlartifacts"
    assert artifact_root("http://mlflow:5000") is None


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_grown_ray_run_matches_the_reference_reports_its_stages_and_is_logged_from_the_controller(tmp_path: Path):
    from tests.test_runtime import _assert_same_weights

    reference = train_local(_tracked(tmp_path, "tracked-ray", mlflow=False), progress=None)
    cfg = _tracked(tmp_path, "tracked-ray")
    lines: list[str] = []
    with Pipeline(cfg) as p:
        result = p.train(progress=lines.append)
        net = p.final_net()
    _assert_same_weights(reference.net, net, atol=1e-6)
    assert result["blocks"] == 3 and result["growth"][0]["kind"] == "layer"
    assert any(line.startswith("grow   +layer block 2 (mlp) -> 3 blocks, stage actor 2") for line in lines)
    stages = result["stages"]
    assert [s["stage"] for s in stages] == [0, 1, 2]
    for s in stages:
        assert 0 < s["utilisation"] <= 1 and s["busy_s"] > 0 and s["samples_per_second"] > 0
    assert result["hop_overhead_ms"] is not None and result["hop_overhead_ms"] >= 0
    events = result["timeline"]["traceEvents"]
    assert {e["tid"] for e in events} == {0, 1} and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)

    client, run = _only_run(cfg.tracking.uri)
    names = _check_logged_run(client, run, blocks=3)
    assert {"pipeline_trace.json", "plots/stage_timeline.png"} <= names
    assert client.get_metric_history(run.info.run_id, "stage0.utilisation")
    assert any(line.startswith(f"mlflow run {run.info.run_id}") for line in lines)


def test_unreachable_tracking_server_never_stops_training(tmp_path: Path):
    cfg = _tracked(tmp_path, "offline", uri="http://127.0.0.1:9")  # nothing listens on the discard port
    lines: list[str] = []
    result = train_local(cfg, progress=lines.append)
    assert result.net.depth == 3 and len(result.history) == 3
    warnings = [line for line in lines if line.startswith("warn   MLflow")]
    assert len(warnings) == 2 and "not reachable" in warnings[0]
    spilled = list(tmp_path.glob("mlflow-unsent-offline-*.jsonl"))
    assert len(spilled) == 1 and '"op": "params"' in spilled[0].read_text()
    # once a server is there: growpipe mlflow replay sends them into a run of the same name
    from growpipe.cli import main

    uri = f"sqlite:///{tmp_path / 'later.db'}"
    assert main(["mlflow", "replay", str(spilled[0]), "--tracking-uri", uri]) == 0
    client, run = _only_run(uri)
    assert run.info.run_name == "offline" and run.info.status == "FINISHED" and run.data.params["method"] == "dascpl"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1, 2, 3]
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}


def _wait(predicate, timeout: float = 120.0) -> None:
    import time

    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_ray_run_stopped_midway_ends_killed_with_its_reason_and_releases_everything(tmp_path, monkeypatch):
    """As the driver stops a run on an error or Ctrl-C: the MLflow run KILLED, the stages, the controller and
    their CPUs released, and the progress bar (drawn in place while the epochs ran) cleared."""
    import io
    import re
    import threading

    import ray

    from growpipe.progress import EpochBar

    monkeypatch.setenv("GROWPIPE_STEP_DELAY_MS", "20")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "experiment": "tests", "workdir": str(tmp_path)}
    cfg = tiny_config(name="stopped", threads=1, train={"epochs": 200}, tracking=tracking)
    free = ray.available_resources().get("CPU", 0)
    stream = io.StringIO()
    bar = EpochBar(stream, active=True)
    p = Pipeline(cfg).start()
    errors: list[BaseException] = []

    def train() -> None:
        try:
            p.train(progress=bar.line, bar=bar)
        except PipelineError as e:
            errors.append(e)

    thread = threading.Thread(target=train)
    thread.start()
    cleared_line = re.compile(r"\r\x1b\[Kepoch +\d+/200 \| blocks 2")  # the bar cleared before an epoch's line
    _wait(lambda: ray.get(p.controller.status.remote())["epoch"] >= 3 and cleared_line.search(stream.getvalue()))
    stopped_in = ray.get(p.controller.status.remote())["epoch"]
    p.stop("stopped by the test")
    thread.join(timeout=60)
    assert errors and "stopped: stopped by the test" in str(errors[0])
    drawn = stream.getvalue()
    assert re.search(r"\repoch \d+/200 \[[#-]+\] +\d+/22 batches", drawn), drawn[-500:]
    assert drawn.endswith(("\n", "\r\x1b[K"))  # not left on the bar: the error starts on a clean line
    assert not EpochBar(io.StringIO()).active  # not a terminal: plain lines only
    client, run = _only_run(uri)
    assert run.info.status == "KILLED" and run.data.tags["growpipe.end_reason"] == "stopped by the test"
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
    assert logged and max(logged) <= stopped_in  # nothing after the stop
    assert "error.txt" not in {a.path for a in client.list_artifacts(run.info.run_id)}
    _wait(lambda: ray.available_resources().get("CPU", 0) >= free, 30)
    assert ray.available_resources().get("CPU", 0) == free
    assert not actor_exists("stopped/stage0") and not actor_exists("stopped")


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_sigterm_ends_a_local_run_as_killed_and_its_resume_is_tagged_as_such(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = ["name=sigterm", "train.epochs=500", "net.width=32", f"tracking.uri={uri}", "tracking.experiment=tests",
            f"tracking.workdir={tmp_path}", f"checkpoint.uri={tmp_path / 'ck'}"]  # fmt: skip
    cmd = [sys.executable, "-m", "growpipe.cli", "train", "--runtime", "local", "-q",
           *(a for kv in sets for a in ("--set", kv))]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = MlflowClient(tracking_uri=uri)

    def trained_two_epochs() -> bool:
        assert proc.poll() is None, proc.communicate()
        exp = client.get_experiment_by_name("tests") if (tmp_path / "mlflow.db").exists() else None
        runs = client.search_runs([exp.experiment_id]) if exp else []
        return bool(runs) and len(client.get_metric_history(runs[0].info.run_id, "test_accuracy")) >= 2

    _wait(trained_two_epochs)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "growpipe train: stopped by SIGTERM", err
    assert "Traceback" not in err
    _, run = _only_run(uri)
    assert run.info.status == "KILLED" and run.data.tags["growpipe.end_reason"] == "interrupted (SIGTERM)"
    done = len(client.get_metric_history(run.info.run_id, "test_accuracy"))
    resume = [sys.executable, "-m", "growpipe.cli", "train", "--runtime", "local", "-q", "--resume", "sigterm",
              "--set", f"checkpoint.uri={tmp_path / 'ck'}", "--set", f"train.epochs={done + 1}"]  # fmt: skip
    resumed = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _, run = _only_run(uri)  # the same MLflow run, now describing how the resumed run ended
    assert run.info.status == "FINISHED" and run.data.tags["growpipe.end_reason"] == "finished"


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_run_records_data_machine_and_a_registered_model_that_serves_in_a_fresh_process(tmp_path, monkeypatch):
    import json
    import os
    import subprocess
    import sys

    from growpipe.api import evaluate

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "workdir": str(tmp_path), "register_model": True}
    grow = {"schedule": [{"kind": "layer", "epochs": 1}]}
    cfg = tiny_config(method="dascpl", train={"epochs": 2}, grow=grow, tracking=tracking)
    assert cfg.name is None and cfg.tracking.experiment is None  # the defaults the run fills in
    train_local(cfg, progress=None)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("from-env").experiment_id])
    name = run.info.run_name
    assert name.startswith("dascpl-digits-") and run.info.status == "FINISHED"
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"digits-train", "digits-test"} and all(len(d.digest) == 16 for d in inputs.values())
    assert any(k.startswith("system/cpu") for k in run.data.metrics)
    (version,) = client.search_model_versions(f"name = '{name}'")
    assert version.run_id == run.info.run_id

    ck = client.download_artifacts(run.info.run_id, "checkpoint", str(tmp_path))
    full = evaluate(ck)["full_accuracy"]  # growpipe evaluate on the same checkpoint
    script = f"""
import json, mlflow, numpy as np
from growpipe.config import DataSpec
from growpipe.data import load_data
test = load_data(DataSpec(name="digits", normalize="none")).test  # as read: the model standardises
model = mlflow.pyfunc.load_model("models:/{name}/1")
full = model.predict(test.x.numpy())
early = model.predict(test.x.numpy(), params={{"threshold": 0.05}})
print(json.dumps({{"full": float((full["prediction"].to_numpy() == test.y.numpy()).mean()),
                  "depth": float(full["exit_depth"].mean()), "early_depth": float(early["exit_depth"].mean())}}))
"""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    served = json.loads(out.stdout.strip().splitlines()[-1])
    assert served["full"] == pytest.approx(full) and served["depth"] == 3.0  # the full path by default
    assert served["early_depth"] == 1.0  # any 10-class softmax reaches 0.05 at the first exit
