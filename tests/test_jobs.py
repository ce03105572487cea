"""End to end the way users run jobs, as jobs/README.md and raylocal/README.md write them: one real local Ray
head for this module, started and stopped by the raylocal/README block's own `raylocal/up` and `raylocal/down`
in a checkout view (its own runs/); every documented command run on it as written (tiny data and epochs through
GROWPIPE_SET, one of the sweep's samples through GROWPIPE_SWEEP_SET, the dashboard address and the serve port
filled in), each job once; the runs read back from the one MLflow store every job path of the head writes to."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import ray
from mlflow.tracking import MlflowClient

from tests import test_raylocal as raylocal
from tests.doc_blocks import block, commands
from tests.docs_run import Background, checkout_view, environment, sh, unique, wait_until
from tests.noise import library_noise

JOBS_SET = "train.epochs=2; data.limit_train=256; data.limit_test=128"
"""GROWPIPE_SET of every job here: TINY's rows, 2 epochs (the documented sweep's ASHA grace period is 2)."""
SWEEP_SET = "num_samples=1"
"""GROWPIPE_SWEEP_SET: the documented sweep on 1 of its 8 samples (tests/test_tune.py has sweeps of several)."""
DOC_DASHBOARD = "http://127.0.0.1:8265"
"""The dashboard address the docs write; raylocal/up prints the head's (this one's ports are free ones)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Head:
    """A head started by raylocal/up in `view`; `env` is the user's shell (a home of its own with the head's
    token, the ports, GROWPIPE_SET)."""

    view: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess
    ran: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, str]:
        """What raylocal/up recorded (ports, GROWPIPE_WORKDIR, pids)."""
        lines = (self.view / "runs" / "raylocal.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.state['RAY_DASHBOARD_PORT']}"

    @property
    def store(self) -> str:
        """The MLflow store of every job on this head: raylocal/up's GROWPIPE_WORKDIR, the checkout's runs/."""
        return f"sqlite:///{self.view / 'runs' / 'mlflow.db'}"

    def command(self, documented: str) -> str:
        return documented.replace(DOC_DASHBOARD, self.dashboard)

    def run(self, documented: str) -> subprocess.CompletedProcess:
        """A documented command on this head, once: two blocks share the plain submit and the sweep."""
        command = self.command(documented)
        if command not in self.ran:
            self.ran[command] = sh(command, self.view, self.env, timeout=600)
        return self.ran[command]

    def output(self, job_id: str) -> str:
        """What job `job_id`'s driver printed (Ray's line before its entrypoint left out)."""
        log = Path(f"/tmp/raylocal-{self.state['RAY_PORT']}/session_latest/logs/job-driver-{job_id}.log")
        text = log.read_text() if log.is_file() else ""
        return text[text.find("Running entrypoint for job") :] if "Running entrypoint" in text else ""

    def wait_for(self, job_id: str, pattern: str, timeout: float = 300) -> re.Match:
        """The first match of `pattern` in job `job_id`'s output, once there (the job failing fails the test)."""
        deadline = time.time() + timeout
        while not (found := re.search(pattern, text := self.output(job_id))):
            assert "Traceback" not in text and time.time() < deadline, f"{job_id}: no {pattern!r}:\n{text[-3000:]}"
            time.sleep(0.2)
        return found


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Iterator[Head]:
    """The raylocal/README block's first command, `raylocal/up`, and at the end its last, `raylocal/down`, in a
    checkout view. Ports are free ones but the job agent's: its default is held here (a session Ray may hold it
    too), so up picks a free one, says so, and submit, status and down find it in up's state file."""
    first, *_, last = commands(block("raylocal").text)
    assert (first, last) == ("raylocal/up", "raylocal/down")
    root = tmp_path_factory.mktemp("jobs")
    view = checkout_view(root / "checkout")
    home = root / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))  # as `ray get-auth-token --generate` makes it
    ports = {k: str(_free_port()) for k in ("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_CLIENT_PORT")}
    user = {k: v for k, v in environment(growpipe_set=JOBS_SET).items()
            if k == "GROWPIPE_SET" or not k.startswith(("RAY_", "RAYLOCAL_", "MLFLOW_", "GROWPIPE_"))}  # fmt: skip
    env = {**user, **ports, "HOME": str(home), "GROWPIPE_SWEEP_SET": SWEEP_SET}
    holder = socket.socket()
    with contextlib.suppress(OSError):
        holder.bind(("127.0.0.1", 52365))
        holder.listen()
    try:
        up = sh(first, view, env, timeout=240)  # a failing up stops what it started itself
    finally:
        holder.close()
    try:
        yield Head(view, env, up)
    finally:
        _down(last, view, env, ports["RAY_PORT"])


def _down(command: str, view: Path, env: dict[str, str], port: str) -> None:
    """`raylocal/down`: every process of the head ends (those up recorded, what they started since, and what
    names the head on its command line), while a process that merely mentions the head's temp dir (what
    `pkill -f` would match) keeps running."""
    state = view / "runs" / "raylocal.env"
    ours = {*raylocal.head.recorded(state), *raylocal._processes_of(port)}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", f"/tmp/raylocal-{port}/"])
    try:
        down = subprocess.run(["bash", "-c", command], cwd=view, env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"ray head on 127.0.0.1:{port} stopped: " in down.stdout, down.stdout
        for name in ("gcs_server", "ray.util.client.server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"):
            assert f"{name} " in down.stdout
        assert [p for p in ours if not raylocal._gone(p)] == [] and not raylocal._gone(bystander.pid)
        assert not state.exists()
    finally:
        bystander.kill()
        bystander.wait()
        shutil.rmtree(f"/tmp/raylocal-{port}", ignore_errors=True)  # the head's logs


def _job_id(out: subprocess.CompletedProcess) -> str:
    found = re.search(r"Job '(raysubmit_\w+)' submitted successfully", out.stdout + out.stderr)
    assert found, out.stdout[-3000:] + out.stderr[-3000:]
    return found.group(1)


def _succeeded(head: Head, out: subprocess.CompletedProcess) -> str:
    """The output of the job a waiting submit ran, which succeeded; free of library lines a user cannot act on."""
    job_id = _job_id(out)
    assert f"Job '{job_id}' succeeded" in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    text = head.output(job_id)
    assert text and "\r" not in text  # a job's log gets plain lines, no progress bar
    noise = library_noise(text)
    assert not noise, "library lines a user cannot act on:\n" + "\n".join(noise)
    return text


def _train_run(head: Head, text: str) -> tuple[str, str]:
    """(run name, MLflow run id) of a train job's output; its run is in the head's store."""
    name = re.search(r"^run    (\S+) \(checkpoints in (\S+)\)", text, re.M)
    mlflow = re.search(r"^mlflow run ([0-9a-f]{32}) in (\S+) ", text, re.M)
    assert name and mlflow, text[-3000:]
    assert name.group(2) == str(head.view / "runs" / "checkpoints" / name.group(1))
    assert mlflow.group(2) == head.store
    return name.group(1), mlflow.group(1)


def test_doc_jobs_submit(head: Head):
    """jobs/README.md's first block: the demo through raylocal/submit and through a plain `ray job submit`
    (each grows a third stage on the head's 4 logical CPUs), then the sweep; both train jobs in the one store,
    the checkout's runs/ (raylocal/up's GROWPIPE_WORKDIR, not ~/growpipe_results), with checkpoints, cluster
    records, plots and the net as a LoggedModel."""
    submit, plain, sweep = (head.run(c) for c in commands(block("jobs-submit").text))
    store = MlflowClient(tracking_uri=head.store)
    for out in (submit, plain):
        text = _succeeded(head, out)
        assert "grow   +layer block 2" in text and f"ray    dashboard {head.dashboard}\n" in text
        assert "store  results in" not in text  # the head's GROWPIPE_WORKDIR, not the job's temporary copy
        assert f"MLflow: experiment 'growpipe' in {head.store}" in text and "#/experiments/" in text
        name, run_id = _train_run(head, text)
        run = store.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["method"] == "al"
        assert run.data.params["grow.schedule"].startswith("[{")
        assert [m.step for m in store.get_metric_history(run_id, "loss.b1.assoc")] == [1, 2]
        assert [(m.step, m.value) for m in store.get_metric_history(run_id, "growth.blocks")] == [(2, 3.0)]
        assert (head.view / "runs" / "checkpoints" / name).is_dir()
        assert json.loads((head.view / "runs" / "clusters" / f"{name}.json").read_text())["auth"] == "token"
        assert run.info.artifact_uri.removeprefix("file://").startswith(f"{head.view}/runs/mlartifacts/")
        plots = {a.path for a in store.list_artifacts(run_id, "plots")}
        assert {"plots/exit_accuracy.png", "plots/accuracy_vs_compute.png", "plots/stage_timeline.png"} <= plots
        (model,) = [m for m in store.search_logged_models([run.info.experiment_id]) if m.source_run_id == run_id]
        assert model.status == "READY" and f"{head.view}/runs/mlartifacts/" in model.artifact_location
    text = _succeeded(head, sweep)
    assert "sweep  digits-lr-width: train, metric test_accuracy (max), 1 sample(s)" in text
    assert re.search(r"^best   test_accuracy \d\.\d{4} with ", text, re.M), text[-3000:]
    parent = re.search(r"^mlflow sweep run ([0-9a-f]{32}) in (\S+) ", text, re.M)
    assert parent and parent.group(2) == head.store, text[-3000:]
    trials = store.search_runs([store.get_run(parent.group(1)).info.experiment_id],
                               f"tags.mlflow.parentRunId = '{parent.group(1)}'")  # fmt: skip
    assert [t.info.status for t in trials] == ["FINISHED"]


def test_doc_jobs_plain(head: Head):
    """jobs/README.md's plain `ray job submit` (the first block's too: it runs once) and the `ls` that shows
    where its results went: the checkout's runs/, the store raylocal/submit's jobs write to."""
    plain, ls = commands(block("jobs-plain").text)
    text = _succeeded(head, head.run(plain))
    name, run_id = _train_run(head, text)
    listed = sh(ls, head.view, head.env).stdout.split()
    assert {"mlflow.db", "checkpoints", "clusters"} <= set(listed), listed
    assert name in (p.name for p in (head.view / "runs" / "checkpoints").iterdir())
    assert MlflowClient(tracking_uri=head.store).get_run(run_id).info.status == "FINISHED"


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_doc_jobs_serve(head: Head, tmp_path: Path):
    """jobs/README.md's serve block: the training job is held in its second epoch (GROWPIPE_HOLD_AT) so that the
    follower starts on a run that still trains; the curls as written on the follower's port (a free one for
    8000, which another Serve of this machine may hold). Released, the run grows and the follower serves its
    newest checkpoint, 3 blocks; `ray job stop` ends the follower and deletes its application."""
    run, port, gate = unique("serve-demo"), str(_free_port()), tmp_path / "gate"
    names = {"name=demo": f"name={run}", "checkpoints/demo/": f"checkpoints/{run}/", "--run demo": f"--run {run}",
             "--port 8000": f"--port {port}", "127.0.0.1:8000": f"127.0.0.1:{port}"}  # fmt: skip
    documented = commands(block("jobs-serve").text)
    train, ls, serve, version, predict = [head.command(_filled(c, names)) for c in documented]
    assert train.startswith("RAYLOCAL_NO_WAIT=1 raylocal/submit train") and serve.startswith("RAYLOCAL_NO_WAIT=1")
    train_id = _job_id(sh(train, head.view, {**head.env, "GROWPIPE_HOLD_AT": f"2:2:{gate}"}))
    head.wait_for(train_id, r"ckpt   ckpt-000001-\S+ \(epoch 1, batch 0\)")
    assert any(p.startswith("ckpt-000001-") for p in sh(ls, head.view, head.env).stdout.split())
    serve_id = _job_id(sh(serve, head.view, head.env))
    try:
        served = head.wait_for(
            serve_id, rf"serve  http://127.0.0.1:{port}/predict  run {run}, (ckpt-\S+) \(epoch 1, 2 blocks\)"
        )
        head.wait_for(serve_id, f"follow run {run}")
        shown = json.loads(sh(version, head.view, head.env).stdout)
        assert shown["version"] == {"run": run, "checkpoint": served.group(1), "epoch": 1, "blocks": 2}, shown
        answer = json.loads(sh(predict, head.view, head.env).stdout)
        assert len(answer["prediction"]) == 1 and answer["version"] == shown["version"], answer
        gate.touch()
        head.wait_for(train_id, r"al on digits \(mlp, 3 blocks, 6 epochs\)")
        head.wait_for(serve_id, r"serve  ckpt-\S+ \(epoch \d+, 3 blocks\) in ")
        assert _get(f"http://127.0.0.1:{port}/version")["version"]["blocks"] == 3
    finally:
        stop = f"RAY_AUTH_MODE=token .venv/bin/ray job stop {serve_id} --address {head.dashboard}"
        stopped = sh(stop, head.view, head.env)
    assert f"Job '{serve_id}' was stopped" in stopped.stdout + stopped.stderr
    assert head.wait_for(serve_id, "growpipe serve: stopped by SIGTERM")
    wait_until("the follower's application deleted", lambda: _not_found(f"http://127.0.0.1:{port}/version"), 120)
    noise = library_noise(head.output(train_id) + head.output(serve_id))
    assert not noise, "library lines a user cannot act on:\n" + "\n".join(noise)


def _filled(command: str, names: dict[str, str]) -> str:
    for placeholder, value in names.items():
        command = command.replace(placeholder, value)
    return command


def _not_found(url: str) -> bool:
    """Whether Serve answers 404 at `url` (its proxy stays, the application is gone)."""
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except urllib.error.HTTPError as e:
        return e.code == 404
    return False


def test_doc_raylocal(head: Head, tmp_path: Path):
    """raylocal/README.md's block between its `up` (the module's head: checked here) and `down` (at the
    module's end): the demo job held before batch 2 so that the grow job, submitted while `submit` still
    follows it, finds it running; the sweep (jobs/README.md's too: it runs once); status."""
    _, train, grow, sweep, status, _ = commands(block("raylocal").text)
    up = head.up.stdout
    assert f"dashboard:   {head.dashboard}\n" in up and "4 logical CPUs" in up
    assert f"results:     {head.view}/runs/ " in up and head.state["GROWPIPE_WORKDIR"] == str(head.view)
    assert "RAY_AGENT_PORT) is in use; using" in head.up.stderr
    gate = tmp_path / "gate"
    job = Background(train, head.view, {**head.env, "GROWPIPE_HOLD_AT": f"1:2:{gate}"}, tmp_path / "train.log")
    try:
        wait_until("the demo job's first checkpoint", lambda: job.says("ckpt   ckpt-"))
        grown = sh(grow, head.view, head.env)
        assert "run demo: +layer block 2 -> 3 blocks" in _succeeded(head, grown), grown.stdout[-3000:]
        gate.touch()
        assert job.wait(300) == 0, job.output()[-3000:]
    finally:
        job.stop()
    trained = _succeeded(head, subprocess.CompletedProcess(train, 0, job.output(), ""))
    assert "al on digits (mlp, 4 blocks" in trained  # the requested block and the planned one
    assert "best   test_accuracy" in _succeeded(head, head.run(sweep))
    shown = sh(status, head.view, head.env).stdout
    assert "CPU" in shown and _job_id(grown) in shown, shown[-3000:]
    _listens_where_the_readme_says(head)


def _listens_where_the_readme_says(head: Head) -> None:
    """Every process of the head, found independently of up's record (by what names the head on its command
    line), is a recorded one or started by one, and the ports raylocal/README.md names listen where it says."""
    recorded = raylocal.head.recorded(head.view / "runs" / "raylocal.env")
    found = raylocal._processes_of(head.state["RAY_PORT"])
    covered = raylocal.head.family({p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}, recorded)
    assert found and found <= covered, [psutil.Process(p).cmdline()[:1] for p in found - covered]
    labels = {raylocal.head.label(psutil.Process(p).cmdline(), psutil.Process(p).name()) for p in recorded}
    assert {"gcs_server", "raylet", "ray.util.client.server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= labels
    on = raylocal._listening(recorded)
    machine = ray.util.get_node_ip_address()  # the machine's address: the node address Ray picks
    port = {k: int(head.state[k]) for k in ("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_AGENT_PORT", "RAY_CLIENT_PORT")}
    assert machine != "127.0.0.1" and on[port["RAY_PORT"]] in ({"::"}, {"0.0.0.0"})  # the GCS: all interfaces
    assert on[port["RAY_DASHBOARD_PORT"]] == {"127.0.0.1"}
    assert on[port["RAY_AGENT_PORT"]] == on[port["RAY_CLIENT_PORT"]] == {"127.0.0.1", machine}
    assert set().union(*on.values()) <= {"127.0.0.1", machine, "0.0.0.0", "::"}
