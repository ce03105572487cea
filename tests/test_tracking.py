"""MLflow tracking against a real sqlite store, and a tracking server that is not there."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from growpipe.local import train_local
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import tiny_config


def _tracked(tmp_path: Path, name: str, uri: str | None = None, **extra):
    uri = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    return tiny_config(
        name=name,
        method="dascpl",
        threads=1,
        train={"epochs": 2},
        grow={"schedule": [{"kind": "layer", "epochs": 1}]},
        tracking={"mlflow": True, "uri": uri, "experiment": "tests", "workdir": str(tmp_path)},
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


def test_reference_run_is_logged_to_mlflow(tmp_path: Path):
    cfg = _tracked(tmp_path, "tracked-local")
    train_local(cfg, progress=None)
    client, run = _only_run(cfg.tracking.uri)
    _check_logged_run(client, run, blocks=3)


@pytest.mark.usefixtures("ray_session")
def test_ray_run_is_logged_from_the_controller_with_the_stage_timeline(tmp_path: Path):
    cfg = _tracked(tmp_path, "tracked-ray")
    lines: list[str] = []
    with Pipeline(cfg) as p:
        p.train(progress=lines.append)
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
