"""Surviving failures on a real local Ray: a stage actor killed mid-run, and the driver killed then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient

from growpipe.checkpoint import CheckpointStore
from growpipe.errors import PipelineError
from growpipe.local import train_local
from growpipe.runtime import NAMESPACE
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import run_actors, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, name: str, **extra):
    base = {
        "name": name,
        "method": "dascpl",
        "threads": 1,
        "net": {"width": 32},
        "train": {"epochs": 4},
        "checkpoint": {"enabled": True, "uri": str(tmp_path / "ck"), "every_epochs": 1},
        "runtime": {"timeline_epoch": 0},
    }
    base.update(extra)
    return tiny_config(**base)


def _hold(monkeypatch, tmp_path: Path, epoch: int) -> Path:
    """Stage 0 waits before batch 2 of `epoch` until the returned gate file exists: a kill lands mid-epoch
    however slow the machine is."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"{epoch}:2:{gate}")
    return gate


def _kill_stage_during(p: Pipeline, stage: str, epoch: int, killed: list[str], gate: Path,
                       at: list[float] | None = None) -> None:  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and ray.get(p.controller.status.remote())["epoch"] < epoch:
        time.sleep(0.05)
    name = f"{p.actor_name}/{stage}"  # the stage actor of this attempt of the run (runtime/names.py)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)  # the epoch is held open at the gate
    killed.append(stage)
    if at is not None:
        at.append(time.perf_counter())
    gate.touch()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("transport", ["object_store", "compiled"])
def test_killed_stage_actor_is_replaced_and_the_run_ends_as_if_undisturbed(tmp_path: Path, monkeypatch, transport):
    """compiled: the kill closes the graph's channels; the recovery tears it down and compiles a new one."""
    gate = _hold(monkeypatch, tmp_path, 2)
    # undisturbed, the pipeline ends with the reference trainer's weights (tested elsewhere): the oracle
    calm = train_local(_cfg(tmp_path, "calm", checkpoint={"enabled": False}), progress=None).summary()
    lines: list[str] = []
    killed: list[str] = []
    with Pipeline(_cfg(tmp_path, f"disturbed-{transport}", pipeline={"transport": transport})) as p:
        t = threading.Thread(target=_kill_stage_during, args=(p, "stage1", 2, killed, gate))
        t.start()
        result = p.train(progress=lines.append)
        t.join(timeout=60)
    assert killed == ["stage1"]
    assert result["restarts"] == 1 and any(line.startswith("recover a stage actor died") or
                                           line.startswith("recover stage") for line in lines), lines  # fmt: skip
    assert result["epochs"] == 4 and [r["epoch"] for r in result["history"]] == [1, 2, 3, 4]
    # rolled back to a whole-epoch checkpoint and replayed from there: the same weights as undisturbed
    assert result["test_accuracy"] == calm["test_accuracy"]
    assert result["exit_accuracy"] == calm["exit_accuracy"]
    if transport == "compiled":
        assert result["transport"]["graphs_compiled"] == 2  # the first, and the one over the new actor


@pytest.mark.usefixtures("ray_session")
def test_without_checkpoints_a_lost_stage_fails_the_run_clearly_within_seconds(tmp_path: Path, monkeypatch):
    gate = _hold(monkeypatch, tmp_path, 1)
    cfg = _cfg(tmp_path, "nockpt", checkpoint={"enabled": False})
    killed: list[str] = []
    killed_at: list[float] = []
    with Pipeline(cfg) as p:
        t = threading.Thread(target=_kill_stage_during, args=(p, "stage1", 1, killed, gate, killed_at))
        t.start()
        with pytest.raises(PipelineError, match="no checkpoint to recover from") as failed:
            p.train(progress=None)
        failed_at = time.perf_counter()
        t.join(timeout=60)
    assert killed == ["stage1"] and failed_at - killed_at[0] < 10
    assert "stage 1 died" in str(failed.value) or "actor died" in str(failed.value)
    assert run_actors("nockpt") == []


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_killed_driver_resumes_from_its_checkpoint_in_the_same_mlflow_run(tmp_path: Path):
    """The driver of a run on a cluster (the session's Ray, as with `growpipe train --address`) is killed
    mid-run: Ray ends its actors; the same command with --resume auto goes on from the newest checkpoint."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = {
        "name": "resumable",
        "method": "dascpl",
        "net": {"width": 32},
        "al": {"code_dim": 8},
        "train": {"epochs": 1},
        "grow": {"schedule": [{"kind": "layer", "epochs": 2}]},
        "checkpoint": {"uri": str(tmp_path / "ck"), "every_epochs": 1},
        "tracking": {"uri": uri, "experiment": "resume", "workdir": str(tmp_path)},
        "runtime": {"dashboard": False, "timeline_epoch": 0},
    }
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(config))
    env = {**os.environ, "GROWPIPE_STEP_DELAY_MS": "40"}
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "growpipe.cli", "train", "--config", str(cfg_file), "--address", address, "-q"]
    driver = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    store = CheckpointStore(str(tmp_path / "ck"), "resumable")
    deadline = time.time() + 240
    try:
        while time.time() < deadline:  # past the growth (end of epoch 1) and one more epoch
            ref = store.latest()
            if ref is not None and ref.epoch >= 2:
                break
            assert driver.poll() is None, "the driver ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no checkpoint past epoch 2 within 4 minutes")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, mid-run
        driver.wait(timeout=60)
    deadline = time.time() + 60
    while run_actors("resumable"):  # Ray ends a dead driver's actors (its controller too)
        assert time.time() < deadline, "the killed driver's controller outlived it by a minute"
        time.sleep(0.2)
    out = tmp_path / "result.json"
    resumed = subprocess.run([*cmd, "--resume", "auto", "--json-out", str(out)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resume {tmp_path / 'ck' / 'resumable'}/ckpt-" in resumed.stdout
    result = json.loads(out.read_text())
    assert result["epochs"] == 3 and result["blocks"] == 3
    assert [(g["epoch"], g["blocks"]) for g in result["growth"]] == [(1, 3)]  # no repeated growth
    assert [r["epoch"] for r in result["history"]] == [1, 2, 3]

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert len(runs) == 1  # the resumed run logged into the same MLflow run
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "growth.blocks")] == [(1, 3.0)]
    assert {m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")} == {1, 2, 3}
