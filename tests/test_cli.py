"""The growpipe command end to end on digits: train, result JSON, checkpoint, evaluate, data; bad input."""

import json
import os
from pathlib import Path

import pytest

from growpipe.checkpoint import load_net, save_net
from growpipe.cli import main
from growpipe.errors import CheckpointError

FAST = [
    "--set",
    "net.width=32",
    "--set",
    "train.epochs=1",
    "--set",
    "al.code_dim=8",
    "--set",
    "tracking.mlflow=false",
    "--set",
    "checkpoint.enabled=false",
]


def test_train_writes_result_json_and_checkpoint_then_evaluate(tmp_path: Path, capsys, monkeypatch):
    (tmp_path / "workdir").mkdir()
    monkeypatch.setenv("GROWPIPE_WORKDIR", str(tmp_path / "workdir"))
    out, ck = tmp_path / "r" / "result.json", tmp_path / "ck"
    grow = ["--set", "grow.schedule=[{kind: layer, epochs: 1}]"]
    assert main(["train", *FAST, *grow, "--json-out", str(out), "--save", str(ck)]) == 0  # on Ray
    text = capsys.readouterr().out
    assert "epoch   1/2" in text and "grow   +layer block 2" in text
    r = json.loads(out.read_text())
    for key in ("method", "dataset", "blocks", "epochs", "test_accuracy", "exit_accuracy", "train_seconds",
                "samples_per_second", "adaptive", "growth"):  # fmt: skip
        assert key in r
    assert (r["method"], r["dataset"], r["blocks"], r["epochs"]) == ("al", "digits", 3, 2)
    (record,) = [json.loads(f.read_text()) for f in (tmp_path / "workdir" / "runs" / "clusters").glob("*.json")]
    assert record["address"] and text.count(f"run    {record['run']}") == 1  # the cluster growpipe grow asks
    png = tmp_path / "plots" / "acc.png"
    assert main(["evaluate", "--checkpoint", str(ck), "--set", "eval.thresholds=[0.9]", "--json-out",
                 str(tmp_path / "ev.json"), "--plot-out", str(png)]) == 0  # fmt: skip
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["full_accuracy"] == pytest.approx(r["test_accuracy"])
    assert [row["threshold"] for row in ev["adaptive"]] == [0.9]
    assert ev["plots"]["accuracy_vs_compute"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_checkpoint_round_trip_gives_identical_predictions(tmp_path: Path):
    from growpipe.local import train_local
    from tests.conftest import tiny_config

    cfg = tiny_config(method="dascpl", net={"backbone": "cnn", "widths": [4, 8]})
    r = train_local(cfg, progress=None)
    save_net(tmp_path / "ck", r.net, cfg)
    net, manifest = load_net(tmp_path / "ck")
    x = r.bundle.test.x[:20]
    assert (net.predict(x) == r.net.predict(x)).all()
    assert manifest["topology"] == r.net.topology()


def test_bad_config_is_one_line_per_problem_and_writes_nothing(tmp_path: Path, capsys):
    out = tmp_path / "result.json"
    code = main(["train", "--set", "method=foo", "--set", "net.backbone=vgg", "--json-out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "method: got 'foo'" in err and "net.backbone: got 'vgg'" in err
    assert not out.exists() and not any(tmp_path.iterdir())


def test_missing_data_fails_before_training_and_writes_nothing(tmp_path: Path, capsys):
    out, ck = tmp_path / "result.json", tmp_path / "ck"
    # --runtime local: on Ray the same error comes from stage 0 (test_images checks it names the node)
    code = main(["train", "--runtime", "local", "--set", "data.name=fashion-mnist", "--set",
                 f"data.root={tmp_path / 'none'}", "--json-out", str(out), "--save", str(ck)])  # fmt: skip
    assert code == 2
    assert "data.root:" in capsys.readouterr().err
    assert not out.exists() and not ck.exists()


def test_failed_checkpoint_write_keeps_the_old_one(tmp_path: Path, monkeypatch):
    from growpipe.local import train_local
    from tests.conftest import tiny_config

    cfg = tiny_config()
    r = train_local(cfg, progress=None)
    save_net(tmp_path / "ck", r.net, cfg)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("growpipe.checkpoint.torch.save", boom)
    with pytest.raises(OSError):
        save_net(tmp_path / "ck", r.net, cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    load_net(tmp_path / "ck")


def test_evaluate_refuses_non_checkpoint(tmp_path: Path, capsys):
    assert main(["evaluate", "--checkpoint", str(tmp_path)]) == 2
    assert "is not a checkpoint" in capsys.readouterr().err
    with pytest.raises(CheckpointError):
        load_net(tmp_path)


def test_data_list_and_check(capsys):
    assert main(["data", "list"]) == 0
    assert "fashion-mnist" in capsys.readouterr().out
    assert main(["data", "check", "digits"]) == 0
    assert "digits: image, train 1347" in capsys.readouterr().out
    assert main(["data", "check", "nope"]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err


def test_help_lists_commands_and_the_python_api_trains(capsys, tmp_path: Path, monkeypatch):
    import growpipe

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(c in out for c in ("train", "grow", "evaluate", "data", "bench", "mlflow"))
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"growpipe {growpipe.__version__}" != "growpipe 0+unknown"
    monkeypatch.chdir(tmp_path)  # a run's relative paths (checkpoints) land here
    monkeypatch.delenv("GROWPIPE_WORKDIR")  # (the tests' own folder for them, see conftest)
    run = growpipe.train({"train": {"epochs": 1}, "tracking": {"mlflow": False}}, runtime="local", progress=None)
    assert run.net.depth == 2 and run.result["epochs"] == 1 and run.result["runtime"] == "local"
    assert (tmp_path / "runs" / "checkpoints" / run.result["config"]["name"]).is_dir()


def test_evaluate_refuses_overrides_and_data_the_checkpoint_was_not_trained_on(tmp_path: Path, capsys):
    ck = tmp_path / "ck"
    assert main(["train", "--runtime", "local", *FAST, "--save", str(ck)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(ck), "--set", "net.blocks=4"]) == 2
    assert "evaluate takes eval.* and data.root" in capsys.readouterr().err
    # the override, the data that is not there, a bad threshold and an output: together, before any reading
    bad = ["--set", "net.blocks=4", "--set", f"data.root={tmp_path / 'none'}", "--set", "eval.thresholds=[]"]
    assert main(["evaluate", "--checkpoint", str(ck), *bad, "--json-out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("3 problem(s) before the run") and len(err) == 4, err
    assert "--set net.blocks=4: evaluate takes" in err[1] and err[2].startswith("  eval.thresholds: give at least")
    assert err[3].startswith(f"  --json-out {tmp_path}: is a folder"), err
    import growpipe
    from growpipe.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.thresholds: give at least one"):
        growpipe.evaluate(ck, ["eval.thresholds=[]"])
    fm = tmp_path / "fm"
    fm.mkdir()
    import numpy as np

    from tests.conftest import write_idx

    for name, n in (("train-images-idx3-ubyte.gz", 20), ("t10k-images-idx3-ubyte.gz", 10)):
        write_idx(fm / name, np.zeros((n, 28, 28)))
    for name, n in (("train-labels-idx1-ubyte.gz", 20), ("t10k-labels-idx1-ubyte.gz", 10)):
        write_idx(fm / name, np.arange(n) % 10)
    manifest = json.loads((ck / "manifest.json").read_text())
    manifest["config"]["data"]["name"] = "fashion-mnist"  # same checkpoint, other data: shapes differ
    (ck / "manifest.json").write_text(json.dumps(manifest))
    assert main(["evaluate", "--checkpoint", str(ck), "--set", f"data.root={fm}"]) == 2
    assert (
        "the loaded data's shape is [1, 28, 28] but the checkpoint was trained on [1, 8, 8]" in capsys.readouterr().err
    )


def test_cuda_asked_for_on_a_machine_without_one(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", "--runtime", "local", "--set", "device=cuda", *FAST]) == 2
    assert "device: 'cuda' asked for but torch sees no CUDA device; use device: auto or cpu" in capsys.readouterr().err


def test_damaged_manifest_is_named(tmp_path: Path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "state.pt").write_bytes(b"")
    (ck / "manifest.json").write_text("{not json")
    assert main(["evaluate", "--checkpoint", str(ck)]) == 2
    assert "manifest.json is not valid JSON" in capsys.readouterr().err


def test_problems_found_before_ray_are_reported_together_and_nothing_runs(tmp_path: Path, capsys):
    out = "/proc/forbidden/r.json"
    sets = ["checkpoint.enabled=true", "checkpoint.uri=foo://bar", "net.blocks=64"]
    code = main(["train", *FAST, *(a for kv in sets for a in ("--set", kv)), "--json-out", out])
    err = capsys.readouterr().err
    assert code == 2 and "3 problem(s) before the run" in err
    assert "checkpoint.uri 'foo://bar'" in err and f"--json-out {out}: /proc" in err
    assert "net.blocks: the run's 64 block(s) need 64 CPUs" in err and "--address" in err


def test_config_mistakes_are_listed_with_every_other_problem_from_the_command_and_the_api(tmp_path: Path, capsys):
    """A field pydantic refuses does not hide the rest: the data that is not there (on Ray, before any actor
    starts), an output that cannot be written, an unknown runtime.engine; one ConfigError, one line each."""
    import growpipe
    from growpipe.errors import ConfigError

    sets = ["method=bp", "runtime.engine=pipedream", "net.widht=3", "data.name=fashion-mnist",
            f"data.root={tmp_path / 'none'}"]  # fmt: skip
    out = "/proc/forbidden/r.json"
    code = main(["train", *FAST, *(a for kv in sets for a in ("--set", kv)), "--json-out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].endswith("4 problem(s) before the run"), err
    assert len(err) == 5 and err[1:4] == [
        "  net.widht: unknown field; check the spelling (see configs/ for every field)",
        "  runtime.engine: got 'pipedream'; input should be 'auto', 'pipeline', 'gpipe', '1f1b' or 'ddp'",
        f"  data.root: {tmp_path / 'none'} does not exist; point it at the directory of the fashion-mnist files",
    ], err
    assert err[4].startswith(f"  --json-out {out}: /proc is not writable"), err
    raw = {"method": "bp", "runtime": {"engine": "pipedream"}, "tracking": {"mlflow": False}}
    for runtime in ("ray", "local"):
        with pytest.raises(ConfigError) as caught:
            growpipe.train(raw, runtime=runtime, progress=None)
        lines = str(caught.value).splitlines()
        assert lines == [
            "1 problem(s) before the run",
            "  runtime.engine: got 'pipedream'; input should be 'auto', 'pipeline', 'gpipe', '1f1b' or 'ddp'",
        ]


def test_evaluate_reads_run_checkpoints_and_refuses_a_damaged_saved_net(tmp_path: Path, capsys):
    from growpipe.checkpoint import CheckpointStore
    from growpipe.local import train_local
    from tests.conftest import tiny_config

    cfg = tiny_config(name="ev", checkpoint={"enabled": True, "uri": str(tmp_path / "runs")})
    r = train_local(cfg, progress=None)
    latest = CheckpointStore(str(tmp_path / "runs"), "ev").latest()
    for where in (latest.path, str(tmp_path / "runs" / "ev")):  # one run checkpoint, or the run's folder
        assert main(["evaluate", "--checkpoint", where, "--json-out", str(tmp_path / "ev.json")]) == 0
        assert json.loads((tmp_path / "ev.json").read_text())["full_accuracy"] == r.result["test_accuracy"]
    save_net(tmp_path / "ck", r.net, cfg)
    state = tmp_path / "ck" / "state.pt"
    data = bytearray(state.read_bytes())
    data[-100] ^= 0xFF
    state.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "ck")]) == 2
    assert "state.pt does not match the SHA-256 in its manifest" in capsys.readouterr().err


@pytest.mark.usefixtures("ray_session")
def test_a_refused_ray_auth_token_is_named_with_the_fix_at_once(tmp_path: Path):
    """No token, another cluster's token: one line that says the cluster refused it (never "no cluster
    answered"), without the ~25 s of Ray's retries and their log lines."""
    import os
    import subprocess
    import sys

    import ray

    address = ray.get_runtime_context().gcs_address  # the session's Ray: token auth on (Ray 2.60)
    (tmp_path / "other_token").write_text("0123456789abcdef0123456789abcdef")
    no_token = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}  # a home without ~/.ray/auth_token
    wrong_token = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "other_token")}  # RAY_AUTH_MODE unset: offered anyway
    for extra, found in ((no_token, "no token was found here"), (wrong_token, "the token here is not its own")):
        env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}, **extra}
        out = subprocess.run([sys.executable, "-m", "growpipe.cli", "grow", "--run", "x", "--address", address],
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [
            f"growpipe grow: error: --address {address}: the Ray cluster at {address} refused this process (it uses "
            f"token authentication and {found}); put the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / "
            "RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token"
        ], out.stderr


def test_grow_without_an_address_or_a_record_of_the_run_guesses_no_cluster(tmp_path: Path):
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "GROWPIPE_WORKDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "growpipe.cli", "grow", "--run", "unknown"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"growpipe grow: error: --run unknown: no record of the cluster it runs on ({tmp_path}/runs/clusters/"
        f"unknown.json or {Path('~/growpipe_results').expanduser()}/runs/clusters/unknown.json) and no --address or "
        "RAY_ADDRESS; give the cluster's address (--address HOST:PORT, or --address auto for the newest Ray on "
        "this machine)"
    ], out.stderr


def test_a_job_in_rays_temporary_working_directory_keeps_its_results_in_a_durable_default(tmp_path, monkeypatch,
                                                                                           capsys):  # fmt: skip
    """What Ray sets for a job (RAY_JOB_CONFIG_JSON_ENV_VAR, the cwd in its working_dir_files copy): the run's
    MLflow store and checkpoints go to ~/growpipe_results, said once; GROWPIPE_WORKDIR chooses another place."""
    from growpipe.prepare import resolve_paths
    from tests.conftest import tiny_config

    job_dir = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1234"
    job_dir.mkdir(parents=True)
    monkeypatch.chdir(job_dir)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GROWPIPE_WORKDIR", raising=False)
    sets = [
        "tracking.mlflow=true",
        "tracking.log_model=false",
        "tracking.system_metrics=false",
        "checkpoint.enabled=true",
        "name=job",
        "data.limit_train=256",
    ]
    assert main(["train", "--runtime", "local", *FAST, *(a for kv in sets for a in ("--set", kv))]) == 0
    out = capsys.readouterr().out
    results = tmp_path / "home" / "growpipe_results"
    assert out.count("store  results in") == 1 and f"store  results in {results} (Ray job working dir" in out
    assert (results / "runs" / "mlflow.db").is_file() and (results / "runs" / "checkpoints" / "job").is_dir()
    assert not list(job_dir.iterdir())  # nothing in the copy that goes away with the job
    monkeypatch.setenv("GROWPIPE_WORKDIR", str(tmp_path / "keep"))  # what raylocal/submit sets
    resolved = resolve_paths(tiny_config(tracking={"mlflow": True}, checkpoint={"enabled": True}))
    assert resolved.checkpoint.uri == str(tmp_path / "keep" / "runs" / "checkpoints")
    assert resolved.tracking.uri == f"sqlite:///{tmp_path / 'keep' / 'runs' / 'mlflow.db'}"


def test_a_results_directory_that_does_not_exist_is_one_line_from_the_command_and_the_api(tmp_path, monkeypatch,
                                                                                          capsys):  # fmt: skip
    import growpipe
    from growpipe.errors import ConfigError

    missing = tmp_path / "nowhere"
    monkeypatch.setenv("GROWPIPE_WORKDIR", str(missing))
    assert main(["train", "--runtime", "local", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[1:] == [f"  GROWPIPE_WORKDIR={missing}: does not exist; give an existing directory for the run's "
                       "results (mkdir it) or unset it"], err  # fmt: skip
    with pytest.raises(ConfigError, match="GROWPIPE_WORKDIR=.*does not exist"):
        growpipe.train({"train": {"epochs": 1}}, runtime="local", progress=None)
    assert not missing.exists()


def test_grow_asks_the_cluster_given_else_the_one_the_run_recorded(tmp_path: Path):
    from growpipe.runtime.cluster_record import choose_cluster, record_cluster, recorded_address

    assert recorded_address("r", [tmp_path / "a"]) is None
    path = record_cluster(tmp_path / "b", "r", "10.0.0.5:6379")
    assert path == tmp_path / "b" / "clusters" / "r.json" and not list(path.parent.glob(".*.tmp"))
    recorded = recorded_address("r", [tmp_path / "a", tmp_path / "b"])
    assert recorded == ("10.0.0.5:6379", path)
    assert choose_cluster("ray://h:10001", "1.2.3.4:6379", recorded) == ("ray://h:10001", "--address ray://h:10001")
    assert choose_cluster(None, "1.2.3.4:6379", recorded) == ("1.2.3.4:6379", "RAY_ADDRESS=1.2.3.4:6379")
    assert choose_cluster(None, None, recorded) == ("10.0.0.5:6379", f"recorded when the run started, {path}")
    assert choose_cluster(None, None, None) is None  # never a guess
    (tmp_path / "b" / "clusters" / "r.json").write_text("{not json")
    assert recorded_address("r", [tmp_path / "b"]) is None


def test_grow_against_a_recorded_cluster_that_is_gone_is_one_line_at_once(tmp_path: Path):
    """ray.init waits minutes for a GCS that is gone: the address is probed first (in a process of its own:
    this one may be connected to the test session's Ray)."""
    import socket
    import subprocess
    import sys

    from growpipe.runtime.cluster_record import record_cluster

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "GROWPIPE_WORKDIR": str(tmp_path)}
    record = record_cluster(tmp_path / "runs", "ended", gone)
    grow = [sys.executable, "-m", "growpipe.cli", "grow", "--run", "ended"]
    out = subprocess.run(grow, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"growpipe grow: error: --run ended: the cluster it started on ({gone}, recorded when the run started, "
        f"{record}) does not answer (Connection refused); the run may have ended, or give --address / RAY_ADDRESS"
    ], out.stderr
    out = subprocess.run([*grow, "--address", gone], env=env, capture_output=True, text=True, timeout=120)
    assert (
        out.returncode == 2 and f"--address {gone}: no Ray cluster answers at {gone} (Connection refused)" in out.stderr
    )


def test_what_bp_on_ray_needs_is_listed_with_the_rest(tmp_path: Path):
    import growpipe
    from growpipe.errors import ConfigError

    raw = {"method": "bp", "runtime": {"engine": "1f1b"}, "net": {"blocks": 3}, "data": {"limit_train": 64}}
    with pytest.raises(ConfigError) as caught:  # refused before any cluster is asked
        growpipe.train(raw, address="ray://nowhere:10001", outputs={"--json-out": (str(tmp_path), "json")})
    lines = str(caught.value).splitlines()
    assert lines[0] == "2 problem(s) before the run" and len(lines) == 3, lines
    assert lines[1].startswith("  data.batch_size: an epoch has 1 batch(es) for 3 stages; 1F1B needs")
    assert lines[2].startswith(f"  --json-out {tmp_path}: is a folder")


def test_an_address_where_no_cluster_answers_is_one_line_before_ray_starts(tmp_path: Path):
    """ray.init waits minutes for a GCS that is not there (was: still waiting at 290 s): the address is probed
    first (the command in a process of its own: this one may be connected to the test session's Ray)."""
    import subprocess
    import sys
    import time

    from growpipe.prepare import cluster_problem

    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "growpipe.cli", "train", *FAST, "--address", "127.0.0.1:1",
                           "--json-out", str(out)], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "growpipe train: error: 1 problem(s) before the run",
        "  --address 127.0.0.1:1: no Ray cluster answers there (Connection refused); check the host and port (the "
        "head's GCS port, 6379 by default) and that the cluster is up, or leave --address out for an embedded local "
        "Ray"], done.stderr  # fmt: skip
    assert time.monotonic() - start < 60 and not out.exists() and list(tmp_path.iterdir()) == []
    assert cluster_problem(None, "127.0.0.1:1") == (
        "RAY_ADDRESS=127.0.0.1:1: no Ray cluster answers there (Connection refused); check the address and that the "
        "cluster is up, or unset RAY_ADDRESS for an embedded local Ray")  # fmt: skip
    assert cluster_problem(None, None) is None and cluster_problem("auto", None) is None  # nothing to probe


def test_a_net_too_big_for_the_machine_is_refused_naming_the_field_before_ray_starts(tmp_path: Path, capsys):
    import psutil

    from growpipe.memory import memory_problem, run_memory

    out = tmp_path / "r.json"
    for sets, field in ((["net.width=100000000"], "net.width"), (["al.code_dim=100000000"], "al.code_dim"),
                        (["net.width=10000000000"], "net.width")):  # fmt: skip
        code = main(["train", *FAST[2:], *(a for kv in sets for a in ("--set", kv)), "--json-out", str(out)])
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and err[0].endswith("1 problem(s) before the run") and len(err) == 2, err
        assert err[1].startswith(f"  {field}: ") and err[1].endswith(f"lower {field}" + (
            ", or join a cluster of bigger nodes with --address" if "PiB" in err[1] else "")), err  # fmt: skip
    assert not out.exists()
    from growpipe.config import load_config

    big = load_config(None, ["net.width=100000000"])
    total, largest, _ = run_memory(big)
    assert largest < total and total > 1e16 * 16  # the 1e8 x 1e8 layer of block 2 with its Adam state
    problem, warning = memory_problem(big, here=False)  # on a cluster: said, not refused; nodes may be larger
    assert problem is None and warning.startswith("warn   net.width: the run needs at least ")
    have = psutil.virtual_memory().total
    assert memory_problem(load_config(None, ["net.width=4096", "net.blocks=3"]), here=True) == (None, None)
    assert run_memory(load_config(None, ["net.width=4096", "net.blocks=3"]))[0] < have
