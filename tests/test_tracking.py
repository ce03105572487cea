"""MLflow tracking against a real sqlite store, and a tracking server that is not there."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from growpipe.errors import PipelineError
from growpipe.local import train_local
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import assert_same_weights, run_actors, tiny_config
from tests.noise import library_noise


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


def _logged_model(client: MlflowClient, run):
    """The run's model: a READY LoggedModel `model`, an output of the run at its last epoch, carrying the run's
    metrics of that epoch (the last epoch's and the final ones)."""
    from mlflow.entities import LoggedModelStatus

    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.name == "model" and model.status == LoggedModelStatus.READY
    assert model.source_run_id == run.info.run_id
    epochs = max(m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy"))
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(model.model_id, epochs)]
    linked = {m.key: m for m in model.metrics}
    assert {m.step for m in linked.values()} == {epochs} and not any(k.startswith("system/") for k in linked)
    for key in ("final.test_accuracy", "test_accuracy", f"acc.exit{run.data.metrics['blocks']:.0f}"):
        assert linked[key].value == run.data.metrics[key], key
    assert model.params["method"] == run.data.params["method"]
    return model


def _check_logged_run(client: MlflowClient, run, blocks: int) -> set[str]:
    assert run.info.status == "FINISHED"
    _logged_model(client, run)
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
    assert _logged_model(client, run).artifact_location.removeprefix("file://").startswith(f"{tmp_path}/mlartifacts/")
    assert not (elsewhere / "mlruns").exists()
    assert artifact_root("sqlite:////data/runs/mlflow.db") == "/data/runs/mlartifacts"
    assert artifact_root("http://mlflow:5000") is None


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_grown_ray_run_matches_the_reference_reports_its_stages_and_is_logged_from_the_controller(
    tmp_path: Path, monkeypatch
):
    """A Ray run grown once: the reference's weights, its stages reported, logged from the controller (its
    model a LoggedModel of the run, the controller's machine as system metrics)."""

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # MLFLOW_* reach the controller
    reference = train_local(_tracked(tmp_path, "tracked-ray", mlflow=False), progress=None)
    cfg = _tracked(tmp_path, "tracked-ray")
    lines: list[str] = []
    with Pipeline(cfg) as p:
        result = p.train(progress=lines.append)
        net = p.final_net()
        exported = _exported(cfg.name, result)  # while the controller that records them lives
    assert_same_weights(reference.net, net, atol=1e-6)
    assert result["blocks"] == 3 and result["growth"][0]["kind"] == "layer"
    assert any(line.startswith("grow   +layer block 2 (mlp) -> 3 blocks, stage actor 2") for line in lines)
    stages = result["stages"]
    assert [s["stage"] for s in stages] == [0, 1, 2]
    for s in stages:  # as measured, nothing clamped
        assert 0 < s["utilisation"] <= 1 and s["busy_s"] > 0 and s["samples_per_second"] > 0
    assert stages[1]["hop_ms_min"] >= 0 and result["hop_overhead_ms"] >= stages[1]["hop_ms_min"]
    assert stages[0]["hop_ms_min"] is None  # stage 0 takes no packet from a stage
    _check_exported(exported, result)
    events = result["timeline"]["traceEvents"]
    assert {e["tid"] for e in events} == {0, 1} and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)

    client, run = _only_run(cfg.tracking.uri)
    names = _check_logged_run(client, run, blocks=3)
    assert {"pipeline_trace.json", "plots/stage_timeline.png"} <= names
    assert client.get_metric_history(run.info.run_id, "stage0.utilisation")
    assert any(k.startswith("system/cpu") for k in run.data.metrics)
    assert any(line.startswith(f"mlflow run {run.info.run_id}") for line in lines)


def _exported(run: str, result: dict, timeout_s: float = 60.0) -> dict[tuple[str, tuple], float]:
    """The run's series on the head node's Prometheus endpoint ({(name, ((tag, value), ...)): value}), once
    Ray has exported the last epoch's exit accuracies and the growth (it exports every few seconds)."""
    import re
    import time
    import urllib.request

    import ray

    head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    url = f"http://127.0.0.1:{head['MetricsExportPort']}/metrics"
    last = result["history"][-1]
    want = {
        (("exit", str(d)), ("run", run)): a for d, a in zip(last["exit_depths"], last["exit_accuracy"], strict=True)
    }
    deadline = time.monotonic() + timeout_s
    while True:
        series = {}
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            m = re.match(r"(ray_growpipe_\w+)\{(.*)\} (\S+)$", line)
            tags = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))) if m else {}
            if tags.get("run") == run:
                keep = sorted((k, v) for k, v in tags.items() if k in ("run", "stage", "exit", "kind", "source"))
                series[(m.group(1), tuple(keep))] = float(m.group(3))
        exits = {k: v for (name, k), v in series.items() if name == "ray_growpipe_exit_accuracy"}
        if exits == pytest.approx(want) and series.get(("ray_growpipe_growth_events_total", (
                ("kind", "layer"), ("run", run), ("source", "schedule")))) == 1.0:  # fmt: skip
            return series
        assert time.monotonic() < deadline, f"not exported within {timeout_s:g}s: {series}"
        time.sleep(0.5)


def _check_exported(series: dict[tuple[str, tuple], float], result: dict) -> None:
    """Every stage's gauges (the values of the last epoch it trained in), within their ranges."""
    run = result["config"]["name"]

    def of(name: str) -> dict[int, float]:
        return {int(dict(k)["stage"]): v for (n, k), v in series.items() if n == f"ray_growpipe_stage_{name}"}

    assert set(of("utilisation")) == set(of("samples_per_second")) == set(of("inflight_packets")) == {0, 1, 2}
    assert all(0 < u <= 1 for u in of("utilisation").values()) and all(v > 0 for v in of("samples_per_second").values())
    window = result["config"]["pipeline"]["window"]
    assert 1 <= of("inflight_packets")[0] <= window and of("inflight_packets")[2] == 0  # the last stage sends nothing
    assert set(of("hop_ms")) == {1} and of("hop_ms")[1] >= 0  # stage 2 only ever streamed from its prefix cache
    assert {dict(k)["run"] for _, k in series} == {run}


def test_clock_offset_comes_from_the_shortest_round_trip():
    from growpipe.runtime.clocks import offset_from_round_trips

    # (asked, their clock, answered): the second trip is the shortest, its midpoint 10.5 read as 13.5
    assert offset_from_round_trips([(0.0, 5.0, 4.0), (10.0, 13.5, 11.0), (20.0, 20.0, 23.0)]) == 3.0


def test_ray_metrics_points_from_an_epoch_and_a_growth():
    from growpipe.ray_metrics import METRICS, exit_points, growth_points, stage_points

    row = {"stage": 0, "samples_per_second": 900.0, "utilisation": 0.4, "max_inflight": 3, "hop_ms_median": None}
    rows = [row, {**row, "stage": 1, "max_inflight": 0, "hop_ms_median": 1.5}]
    points = stage_points("r", rows)
    assert ("growpipe_stage_hop_ms", {"run": "r", "stage": "1"}, 1.5) in points
    assert not any(name == "growpipe_stage_hop_ms" and tags["stage"] == "0" for name, tags, _ in points)
    assert ("growpipe_stage_inflight_packets", {"run": "r", "stage": "0"}, 3.0) in points
    assert len(points) == 7
    assert exit_points("r", {"exit_depths": [1, 3], "exit_accuracy": [0.5, 0.75]}) == [
        ("growpipe_exit_accuracy", {"run": "r", "exit": "1"}, 0.5),
        ("growpipe_exit_accuracy", {"run": "r", "exit": "3"}, 0.75),
    ]
    assert growth_points("r", {"kind": "layer", "source": "request"}) == [
        ("growpipe_growth_events", {"run": "r", "kind": "layer", "source": "request"}, 1.0)
    ]
    specs = {m.name: m for m in METRICS}  # every point names a metric with exactly its tags
    for name, tags, _ in [*points, *exit_points("r", {"exit_depths": [1], "exit_accuracy": [1.0]})]:
        assert set(specs[name].tags) == set(tags)


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
    _logged_model(client, run)  # the model too: its staged directory is sent as a LoggedModel of the run


def test_a_model_entry_sent_again_after_failing_midway_goes_on_with_the_same_logged_model(mlflow_db: str, tmp_path):
    """The queue sends an entry again when it failed (the server went away): the model's steps already done
    are not done twice, no second LoggedModel (nor registered version) appears. The version is the LoggedModel's
    (source models:/m-ID, listed in its mlflow.modelVersions tag, serving its files), made through this client's
    store: the process's global tracking URI is another one, and stays so."""
    import json

    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    from growpipe.tracking import registered_line, send_entry

    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    mlflow.set_tracking_uri(elsewhere)  # what a notebook (or an earlier test) may have set

    client = MlflowClient(tracking_uri=mlflow_db)
    exp = client.create_experiment("tests", artifact_location=str(tmp_path / "mlartifacts"))
    run_id = client.create_run(exp).info.run_id
    client.log_metric(run_id, "test_accuracy", 0.5, step=3)
    client.log_metric(run_id, "system/cpu_utilization_percentage", 9.0, step=3)
    staged = tmp_path / "staged" / "model"  # missing: the upload fails after the model, its output and metrics
    entry = {"op": "model", "path": str(staged), "name": "model", "step": 3, "register": "again"}
    with pytest.raises((OSError, MlflowException)):
        send_entry(client, run_id, entry)
    assert entry["done"] == ["output", "metrics"]
    staged.mkdir(parents=True)
    Model().save(str(staged / "MLmodel"))
    send_entry(client, run_id, entry)
    assert entry["done"] == ["output", "metrics", "files", "ready", "register"]
    (model,) = client.search_logged_models([exp])
    assert model.model_id == entry["model_id"] and model.status == "READY"
    assert [(m.key, m.value, m.step) for m in model.metrics] == [("test_accuracy", 0.5, 3)]
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [model.model_id]
    assert Model.load(f"{model.artifact_location}/MLmodel").model_id == model.model_id
    try:
        assert mlflow.get_tracking_uri() == elsewhere
    finally:
        mlflow.set_tracking_uri(None)
    (version,) = client.search_model_versions("name = 'again'")
    assert version.source == f"models:/{model.model_id}" and version.run_id == run_id
    assert client.get_model_version_download_uri("again", version.version) == model.artifact_location
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": "again", "version": 1}]
    entry["done"].remove("register")  # the tag failed after the version was made: sent again, no second version
    send_entry(client, run_id, entry)
    assert len(client.search_model_versions("name = 'again'")) == 1
    assert json.loads(client.get_logged_model(model.model_id).tags["mlflow.modelVersions"]) == [
        {"name": "again", "version": 1}
    ]
    assert registered_line(entry) == f"mlflow model again version 1 registered (LoggedModel models:/{model.model_id})"


def test_mlflow_serve_refuses_a_model_uri_that_does_not_resolve_and_a_port_in_use(mlflow_db: str, tmp_path, capsys):
    """Each in one line naming it and the fix, exit 2, before MLflow's server starts."""
    import socket

    from mlflow.models import Model

    from growpipe.cli import main

    assert main(["mlflow", "serve", "models:/nope/1", "--tracking-uri", mlflow_db]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"growpipe mlflow: error: models:/nope/1: no MLflow model there in {mlflow_db} (")
    assert "--tracking-uri" in line
    local = tmp_path / "model"
    local.mkdir()
    Model().save(str(local / "MLmodel"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["mlflow", "serve", str(local), "--port", str(port), "--tracking-uri", mlflow_db]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"growpipe mlflow: error: port {port} on 127.0.0.1 is not free") and "--port" in line


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
    assert run_actors("stopped") == []


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
    assert "Traceback" not in err and library_noise(err) == []  # MLflow's table creation, monitor lines
    _, run = _only_run(uri)
    assert run.info.status == "KILLED" and run.data.tags["growpipe.end_reason"] == "interrupted (SIGTERM)"
    done = len(client.get_metric_history(run.info.run_id, "test_accuracy"))
    resume = [sys.executable, "-m", "growpipe.cli", "train", "--runtime", "local", "-q", "--resume", "sigterm",
              "--set", f"checkpoint.uri={tmp_path / 'ck'}", "--set", f"train.epochs={done + 1}"]  # fmt: skip
    resumed = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert library_noise(resumed.stdout + resumed.stderr) == []
    _, run = _only_run(uri)  # the same MLflow run, now describing how the resumed run ended
    assert run.info.status == "FINISHED" and run.data.tags["growpipe.end_reason"] == "finished"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_run_records_data_machine_and_a_registered_logged_model_that_mlflow_serves(tmp_path, monkeypatch, capfd):
    """A local run: dataset inputs, system metrics, and the net as a LoggedModel of the run (models-from-code,
    real rows as its input example, written without a warning), registered; `growpipe mlflow serve` (as the
    docs give it, no virtualenv on PATH) answers as the model loaded here and growpipe evaluate do."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import urllib.request
    import warnings

    import mlflow
    import numpy as np

    from growpipe.api import evaluate
    from growpipe.config import DataSpec
    from growpipe.data import load_data

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "3600")  # a run within one interval: it still
    # records its machine (the samples of the unfinished interval, which MLflow's monitor drops)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "workdir": str(tmp_path), "register_model": True}
    grow = {"schedule": [{"kind": "layer", "epochs": 1}]}
    cfg = tiny_config(method="dascpl", train={"epochs": 2}, grow=grow, tracking=tracking)
    assert cfg.name is None and cfg.tracking.experiment is None  # the defaults the run fills in
    capfd.readouterr()
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_local(cfg, progress=lines.append)
    printed = capfd.readouterr()
    # what Python prints by default: library DeprecationWarnings stay hidden outside __main__
    assert not [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert "warn" not in (printed.out + printed.err + "\n".join(lines)).lower(), printed
    assert library_noise(printed.out + printed.err) == []
    assert "Downloading artifacts" not in printed.err and "cloudpickle" not in printed.err.lower()

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("from-env")
    (run,) = client.search_runs([exp.experiment_id])
    name = run.info.run_name
    assert name.startswith("dascpl-digits-") and run.info.status == "FINISHED"
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"digits-train", "digits-test"} and all(len(d.digest) == 16 for d in inputs.values())
    assert any(k.startswith("system/cpu") for k in run.data.metrics)
    model = _logged_model(client, run)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    (found,) = mlflow.search_logged_models(experiment_ids=[exp.experiment_id], output_format="list")
    assert found.model_id == model.model_id
    (version,) = client.search_model_versions(f"name = '{name}'")
    assert version.run_id == run.info.run_id and version.source == f"models:/{model.model_id}"  # linked to it
    assert f"mlflow model {name} version 1 registered (LoggedModel models:/{model.model_id})" in lines

    local = mlflow.artifacts.download_artifacts(f"models:/{name}/1", dst_path=str(tmp_path / "model"))
    mlmodel = mlflow.models.Model.load(local)
    assert mlmodel.model_id == model.model_id and mlmodel.run_id == run.info.run_id
    assert "python_model.pkl" not in os.listdir(local)  # models-from-code: nothing cloudpickled
    test = load_data(DataSpec(name="digits", normalize="none")).test  # as read: the model standardises
    example = mlmodel.load_input_example(local)
    assert example.shape == (3, 1, 8, 8) and example.any() and np.allclose(example, test.x[:3].numpy(), atol=1e-6)

    port = _free_port()
    cmd = [sys.executable, "-m", "growpipe.cli", "mlflow", "serve", f"models:/{name}/1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": "/usr/bin:/bin"}  # not activated
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:

        def answering() -> bool:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait(answering)
        url = f"http://127.0.0.1:{port}/invocations"
        served_full = _post(url, {"inputs": test.x.numpy().tolist()})["predictions"]
        early_request = {"inputs": test.x[:20].numpy().tolist(), "params": {"threshold": 0.05}}
        served_early = _post(url, early_request)["predictions"]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the server and its uvicorn: the process group started here
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)

    loaded = mlflow.pyfunc.load_model(f"models:/{name}/1")
    here = loaded.predict(test.x.numpy())
    assert [r["prediction"] for r in served_full] == here["prediction"].tolist()
    assert [r["exit_depth"] for r in served_full] == here["exit_depth"].tolist() == [3] * len(test)  # full path
    assert np.allclose([r["confidence"] for r in served_full], here["confidence"], atol=1e-6)
    early = loaded.predict(test.x[:20].numpy(), params={"threshold": 0.05})
    assert [r["exit_depth"] for r in served_early] == early["exit_depth"].tolist() == [1] * 20  # any 10-class
    # softmax reaches 0.05 at the first exit
    ck = client.download_artifacts(run.info.run_id, "checkpoint", str(tmp_path))
    full = evaluate(ck)["full_accuracy"]  # growpipe evaluate on the same checkpoint
    assert (here["prediction"].to_numpy() == test.y.numpy()).mean() == pytest.approx(full)
