"""End to end the way users run jobs: a real local Ray head (raylocal/up), `ray job submit` through
raylocal/submit, the run read back from MLflow, the head torn down (raylocal/down)."""

import contextlib
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_head(tmp_path: Path):
    ports = {k: str(_free_port()) for k in ("RAY_PORT", "RAY_DASHBOARD_PORT")}
    # no RAY_NUM_CPUS: up sizes the head for the demo itself; the job agent's port 52365 is the test session
    # Ray's, so up picks a free one (and submit, status and down find it)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "GROWPIPE_"))}
    env.update(ports, GROWPIPE_WORKDIR=str(tmp_path), RAYLOCAL_STATE=str(tmp_path / "raylocal.env"))
    env["HOME"] = str(tmp_path / "home")  # the head's and its jobs' (a plain job's results go to ~/growpipe_results)
    (tmp_path / "home").mkdir()  # with a token of its own, made for this head (token auth needs one in ~/.ray)
    subprocess.run([REPO / ".venv" / "bin" / "ray", "get-auth-token", "--generate"], env=env, capture_output=True,
                   check=True, timeout=60)  # fmt: skip
    holder = socket.socket()
    with contextlib.suppress(OSError):  # make sure the default agent port is taken (a session Ray may hold it)
        holder.bind(("127.0.0.1", 52365))
        holder.listen()
    head_env = {k: v for k, v in env.items() if k != "GROWPIPE_WORKDIR"}  # submit passes it to its jobs only
    up = subprocess.run([REPO / "raylocal" / "up"], env=head_env, capture_output=True, text=True, timeout=180)
    holder.close()
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"dashboard:   http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}" in up.stdout
        assert "logical CPUs" in up.stdout and "RAY_AGENT_PORT) is in use; using" in up.stderr
        yield env
    finally:
        down = subprocess.run([REPO / "raylocal" / "down"], env=env, capture_output=True, text=True, timeout=60)
        assert "stopped" in down.stdout, down.stdout + down.stderr


def test_submitted_demo_job_grows_and_keeps_its_results_where_the_submitter_said(local_head, tmp_path: Path):
    """The README's job path on this machine's smallest head: the demo config, its growth needing a third
    stage; MLflow and checkpoints under GROWPIPE_WORKDIR, not in Ray's temporary copy of the checkout."""
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    env = {**local_head, "RAYLOCAL_NO_WAIT": "1"}
    args = ["--config", "configs/demo.yaml", "--set", "name=job-e2e", "--set", "method=dascpl", "--set",
            "net.width=32", "--set", "train.epochs=2", "--set", "grow.schedule=[{kind: layer, epochs: 1}]",
            "--set", "tracking.experiment=jobs"]  # fmt: skip
    sub = subprocess.run([REPO / "raylocal" / "submit", "train", *args], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job_id = next(w.strip("'") for w in sub.stdout.split() if w.strip("'").startswith("raysubmit_"))
    # the Ray CLI, as a user would, with the head's token (RAY_AUTH_MODE=token)
    ray_cli = [str(REPO / ".venv" / "bin" / "ray"), "job"]
    address = ["--address", f"http://127.0.0.1:{local_head['RAY_DASHBOARD_PORT']}"]
    cli_env = {**{k: v for k, v in local_head.items() if k != "GROWPIPE_WORKDIR"}, "RAY_AUTH_MODE": "token"}
    # `ray job logs --follow` returns when the job ends (one CLI process instead of a status poll loop)
    logs = subprocess.run([*ray_cli, "logs", job_id, "--follow", *address], env=cli_env, capture_output=True,
                          text=True, timeout=600).stdout  # fmt: skip
    out = subprocess.run([*ray_cli, "status", job_id, *address], env=cli_env, capture_output=True, text=True,
                         timeout=60).stdout  # fmt: skip
    ended = re.search(rf"Job '{job_id}' (succeeded|failed|was stopped)", out)
    assert ended, out + logs[-3000:]
    assert ended.group(1) == "succeeded", out + logs[-3000:]
    assert "grow   +layer block 2" in logs and "MLflow: experiment 'jobs'" in logs
    assert f"ray    dashboard http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}" in logs  # printed at the start
    assert "mlflow run " in logs and "#/experiments/" in logs
    assert "\r" not in logs  # job logs get plain lines, no progress bar

    mlflow = MlflowClient(tracking_uri=uri)
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("jobs").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.params["method"] == "dascpl"
    assert run.data.params["grow.schedule"].startswith("[{")
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "loss.b1.ce")] == [1, 2]
    assert [(m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "growth.blocks")] == [(2, 3.0)]
    assert (tmp_path / "runs" / "checkpoints" / "job-e2e").is_dir()  # durable: the submitter's directory
    assert run.info.artifact_uri.removeprefix("file://").startswith(f"{tmp_path}/runs/mlartifacts/")
    plots = {a.path for a in mlflow.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/exit_accuracy.png", "plots/accuracy_vs_compute.png", "plots/stage_timeline.png"} <= plots
    (model,) = mlflow.search_logged_models([run.info.experiment_id])  # the net, a LoggedModel of the job's run
    assert model.source_run_id == run.info.run_id and model.status == "READY"
    assert model.artifact_location.removeprefix("file://").startswith(f"{tmp_path}/runs/mlartifacts/")

    # the README's plain line (no GROWPIPE_WORKDIR, no MLFLOW_TRACKING_URI): results outside the job's copy
    plain = ["name=plain", "train.epochs=1", "grow.schedule=[]", "net.width=32", "checkpoint.enabled=true",
             "tracking.log_model=false", "tracking.experiment=plain"]  # fmt: skip
    job = subprocess.run([*ray_cli, "submit", *address, "--working-dir", ".", "--runtime-env", "jobs/runtime_env.yaml",
                          "--", "python", "jobs/train.py", "--config", "configs/demo.yaml",
                          *(a for kv in plain for a in ("--set", kv))], cwd=REPO, env=cli_env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    results = tmp_path / "home" / "growpipe_results"
    assert f"store  results in {results} (Ray job working dir is temporary" in job.stdout, job.stdout[-3000:]
    assert (results / "runs" / "checkpoints" / "plain").is_dir(), job.stdout[-3000:]
    assert (results / "runs" / "clusters" / "plain.json").is_file()  # where growpipe grow --run plain asks
    store = MlflowClient(tracking_uri=f"sqlite:///{results / 'runs' / 'mlflow.db'}")
    plain_runs = store.search_runs([store.get_experiment_by_name("plain").experiment_id])
    assert [r.info.status for r in plain_runs] == ["FINISHED"], job.stdout[-3000:]
