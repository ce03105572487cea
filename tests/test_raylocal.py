"""raylocal/: cluster.yaml is a valid config for Ray's cluster launcher (its own JSON schema); up records every
process of its head and checks that the job agent answering is its own; down ends exactly those processes, and
keeps its record while a recorded pid it cannot confirm still runs. A real head's processes, where they listen and
that down ends them all: tests/test_jobs.py, on the head its documented commands run on."""

import http.server
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import jsonschema
import psutil
import pytest
import ray
import yaml

from tests.conftest import REPO


def test_cluster_yaml_validates_against_rays_cluster_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "raylocal" / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    assert config["provider"]["type"] == "local"
    assert any("--dashboard-host=127.0.0.1" in c for c in config["head_start_ray_commands"])


def test_a_misspelled_field_is_caught_by_the_same_check():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "raylocal" / "cluster.yaml").read_text())
    config["idle_timeout_minute"] = config.pop("idle_timeout_minutes")
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as e:
        assert "idle_timeout_minute" in str(e)
    else:
        raise AssertionError("the schema accepted a misspelled field")


# --- raylocal/up and raylocal/down: which processes are the head's, whose agent answers --------------------------


def _load_head_module():
    spec = importlib.util.spec_from_file_location("raylocal_head", REPO / "raylocal" / "_head.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


head = _load_head_module()


def test_the_head_is_its_roots_and_their_descendants_only():
    parent_of = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20, 30: 12}
    assert head.family(parent_of, [10]) == {10, 11, 12, 13, 30}
    assert head.family(parent_of, [11, 20]) == {11, 12, 30, 20, 21}
    assert head.family(parent_of, []) == set()


def test_a_recorded_process_is_the_heads_when_it_started_then_or_runs_the_recorded_command_line():
    Seen = head.Seen
    recorded = {
        100: Seen(1000.25, "aaaa"),
        101: Seen(1000.30, "bbbb"),
        102: Seen(1000.40, "cccc"),
        103: Seen(1000.50, ""),
        104: Seen(1000.60, "dddd"),
    }
    running = {
        100: Seen(1001.90, "zzzz"),  # the wall clock stepped 1.65 s (its title changed too)
        101: Seen(1500.00, "bbbb"),  # the clock stepped 500 s: the same command line says it is ours
        103: Seen(2000.00, "eeee"),  # started later, no command line recorded: cannot tell
        104: Seen(2000.00, "ffff"),  # started later, another command line: the pid was reused (or retitled)
    }  # 102 has ended
    assert head.match(recorded, running) == ({100, 101}, {103, 104})
    assert head.match(recorded, {}) == (set(), set())
    assert head.decode(head.encode(recorded)) == recorded
    assert head.signature(["/bin/python", "-c", "x"]) == head.signature(["/bin/python", "-c", "x"]) != ""
    assert head.signature(["/bin/python", "-c", "x"]) != head.signature(["/bin/python", "-c x"])
    assert head.signature([]) == ""


def test_the_state_file_keeps_the_ports_and_the_pids(tmp_path: Path):
    state = tmp_path / "raylocal.env"
    assert head.recorded(state) == {}
    state.write_text("RAY_PORT=6379\nRAYLOCAL_PIDS=7@12.50@0a1b2c3d,9@13.00\n")  # 9: written before signatures
    assert head.recorded(state) == {7: head.Seen(12.5, "0a1b2c3d"), 9: head.Seen(13.0, "")}


def test_whose_agent_answers():
    ours, other, hidden = head.Listener("127.0.0.1", 5), head.Listener("127.0.0.1", 99), head.Listener("::1", None)
    assert head.agent_verdict([], {5, 6}) == ("waiting", None)
    assert head.agent_verdict([ours], {5, 6}) == ("ours", None)
    assert head.agent_verdict([other], {5, 6}) == ("foreign", other)
    assert head.agent_verdict([ours, hidden], {5, 6}) == ("foreign", hidden)  # another user's listener


def test_the_gcs_started_first_is_stopped_last():
    assert head.stop_order({40: 3.0, 10: 1.0, 30: 2.0}) == [[30, 40], [10]]
    assert head.stop_order({10: 1.0}) == [[10]]
    assert head.stop_order({}) == []


def test_reports_name_processes_by_what_they_run():
    assert (
        head.label(["/v/bin/python3", "-u", "/v/ray/dashboard/dashboard.py", "--port=1"], "python3") == "dashboard.py"
    )
    assert head.label(["/v/bin/python3", "-m", "ray.util.client.server", "--port=1"], "python3") == (
        "ray.util.client.server"
    )
    assert head.label(["ray::DashboardAgent"], "ray::DashboardA") == "ray::DashboardAgent"
    assert head.label(["/v/ray/core/src/ray/gcs/gcs_server", "--log_dir=x"], "gcs_server") == "gcs_server"
    assert head.label([], "raylet") == "raylet"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # this machine's init may not reap
    except psutil.NoSuchProcess:
        return True


# A stand-in for `ray start`: starts a daemon (which starts a child of its own), writes the daemon's pid, exits.
_FAKE_RAY_START = """
import subprocess, sys
daemon = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open(sys.argv[2], "w").write(str(daemon.pid))
"""
_DAEMON = """
import socket, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if {listen}:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", {port}))
    s.listen()
time.sleep(600)
"""


def _run_head(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "raylocal" / "_head.py"), *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_start_records_the_daemons_the_command_left_behind_and_stop_ends_exactly_them(tmp_path: Path):
    """No Ray: the command's daemon listens on the agent port itself; start records it and its child, stop ends
    both, and a process whose command line carries the same words but is not theirs keeps running."""
    port, pid_file = _free_port(), tmp_path / "daemon.pid"
    daemon = _DAEMON.format(listen=True, port=port)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", daemon])  # same words
    try:
        start = _run_head("start", str(port), "--", sys.executable, "-c", _FAKE_RAY_START, daemon, str(pid_file))
        assert start.returncode == 0, start.stderr
        recorded = head.decode(start.stdout.strip().removeprefix("RAYLOCAL_PIDS="))
        daemon_pid = int(pid_file.read_text())
        children = [p.pid for p in psutil.Process(daemon_pid).children()]
        assert set(recorded) == {daemon_pid, *children} and len(children) == 1
        state = tmp_path / "raylocal.env"
        state.write_text(f"RAY_PORT=1\n{start.stdout}")
        assert _run_head("running", str(state)).returncode == 0
        stop = _run_head("stop", str(state), "127.0.0.1:1")
        assert stop.returncode == 0 and stop.stdout.startswith("ray head on 127.0.0.1:1 stopped: 2 processes")
        assert f" -c {daemon_pid}" in stop.stdout  # each named by what it runs
        assert all(_gone(pid) for pid in recorded)
        assert not _gone(bystander.pid)
        assert _run_head("running", str(state)).returncode == 1
        assert "nothing to stop" in _run_head("stop", str(state), "127.0.0.1:1").stdout
    finally:
        bystander.kill()
        bystander.wait()


def test_start_fails_in_one_line_and_stops_what_it_started_when_another_process_answers_the_agent_port(
    tmp_path: Path,
):
    """Another Ray's agent that took the port, simulated by an HTTP server in this test: the head's own processes
    (here a stand-in daemon that never listens) are stopped and the line names the process that answered."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port, pid_file = server.server_address[1], tmp_path / "daemon.pid"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        daemon = _DAEMON.format(listen=False, port=port)
        start = _run_head("start", str(port), "--", sys.executable, "-c", _FAKE_RAY_START, daemon, str(pid_file))
    finally:
        server.shutdown()
        server.server_close()
    assert start.returncode == 1 and start.stdout == ""
    [line] = start.stderr.splitlines()
    assert line.startswith(f"raylocal/up: port {port} (RAY_AGENT_PORT) is answered by pid {os.getpid()} (")
    assert "not by this head's job agent; set RAY_AGENT_PORT to a free port; stopped the " in line
    assert _gone(int(pid_file.read_text()))


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_down_stops_a_recorded_process_whose_start_time_moved_and_keeps_the_record_of_one_it_cannot_confirm(
    tmp_path: Path,
):
    """No Ray: the state file records two live processes with start times 100 s off (a wall-clock step). The one
    whose command line matches the record is the head's and is stopped; the other is left running, and down
    keeps the state file, says why and exits 1."""
    ours, other = _sleeper(), _sleeper()
    try:
        recorded = {
            p.pid: head.Seen(psutil.Process(p.pid).create_time() + 100, sig)
            for p, sig in ((ours, head.signature(psutil.Process(ours.pid).cmdline())), (other, "0000beef"))
        }
        env = {**_head_env(tmp_path), "RAY_PORT": "1"}
        state = Path(env["RAYLOCAL_STATE"])
        state.write_text(f"RAY_PORT=1\nRAYLOCAL_PIDS={head.encode(recorded)}\n")
        assert _run_head("running", str(state)).returncode == 0
        name = head.label(psutil.Process(ours.pid).cmdline(), "")
        down = subprocess.run([REPO / "raylocal" / "down"], env=env, capture_output=True, text=True, timeout=60)
        assert down.returncode == 1, down
        assert down.stdout == f"ray head on 127.0.0.1:1 stopped: 1 processes: {name} {ours.pid}\n", down.stdout
        [line] = down.stderr.splitlines()
        assert line.startswith(f"raylocal/down: pid {other.pid} (") and f"recorded in {state} still runs" in line
        assert line.endswith(f"kept {state} (delete it once none of its pids is the head's)")
        assert ours.wait(timeout=30) is not None and not _gone(other.pid) and state.is_file()
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def _head_env(tmp_path: Path) -> dict[str, str]:
    """The environment of raylocal scripts run by a test: free ports and a state file of its own."""
    prefixes = ("RAY_", "RAYLOCAL_", "MLFLOW_", "GROWPIPE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    ports = {k: str(_free_port()) for k in ("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_AGENT_PORT", "RAY_CLIENT_PORT")}
    state = str(tmp_path / "raylocal.env")
    return {**env, **ports, "RAY_NUM_CPUS": "1", "GROWPIPE_WORKDIR": str(tmp_path), "RAYLOCAL_STATE": state}


def _processes_of(ray_port: str) -> set[int]:
    """Found independently of raylocal's record: the processes that name the head's temp dir or GCS address on
    their command line (GCS, raylet, dashboard, monitors, client server) and their descendants (the agents)."""
    marks = (f"/tmp/raylocal-{ray_port}/", f"127.0.0.1:{ray_port}", f"{ray.util.get_node_ip_address()}:{ray_port}")
    roots = set()
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and any(m in a for a in p.info["cmdline"] or () for m in marks):
            roots.add(p)
    return {q.pid for p in roots for q in [p, *p.children(recursive=True)] if not _gone(q.pid)}


def _listening(pids: Iterable[int]) -> dict[int, set[str]]:
    """The TCP ports the processes `pids` listen on, each with its addresses ("::ffff:" dropped)."""
    on: dict[int, set[str]] = {}
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            on.setdefault(c.laddr.port, set()).add(c.laddr.ip.removeprefix("::ffff:"))
    return on


def test_up_fails_in_one_line_and_leaves_nothing_when_something_else_listens_on_the_agent_port(tmp_path: Path):
    """A listener on [::1]:RAY_AGENT_PORT: up's free-port check (127.0.0.1) and the agent's own bind both succeed,
    but the port is not the head's alone, so up stops its head and says who else listens there."""
    env = _head_env(tmp_path)
    other = socket.socket(socket.AF_INET6)
    try:
        other.bind(("::1", int(env["RAY_AGENT_PORT"])))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    other.listen()
    try:
        up = subprocess.run([REPO / "raylocal" / "up"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        other.close()
    assert up.returncode == 1 and up.stdout == "", up.stdout + up.stderr
    [line] = up.stderr.splitlines()
    assert f"(RAY_AGENT_PORT) is answered by pid {os.getpid()} (" in line and "on ::1, not by this head's" in line
    assert _processes_of(env["RAY_PORT"]) == set()
    assert not Path(env["RAYLOCAL_STATE"]).exists()
    shutil.rmtree(f"/tmp/raylocal-{env['RAY_PORT']}", ignore_errors=True)


def test_up_refuses_a_results_folder_that_does_not_exist_before_it_starts_anything(tmp_path: Path):
    """Every job on the head inherits up's GROWPIPE_WORKDIR: one that is not there is one line, exit 2."""
    env = {**_head_env(tmp_path), "GROWPIPE_WORKDIR": str(tmp_path / "missing")}
    up = subprocess.run([REPO / "raylocal" / "up"], env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 2 and up.stdout == "", up.stdout + up.stderr
    assert up.stderr.splitlines() == [
        f"raylocal/up: GROWPIPE_WORKDIR={tmp_path / 'missing'} is not a directory; give an existing one for the jobs' "
        "results (mkdir it) or unset it (this checkout)"
    ]
    assert _processes_of(env["RAY_PORT"]) == set() and not Path(env["RAYLOCAL_STATE"]).exists()
