"""growpipe serve's checks before Serve starts (exit 2, one line naming the option) and the follower's
decision; no Ray here."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
import yaml

from growpipe.checkpoint import CheckpointStore, save_net
from growpipe.cli import main
from growpipe.local import train_local
from growpipe.serve.follow import next_checkpoint
from tests.conftest import tiny_config
from tests.test_checkpoints import _damage


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cfg = tiny_config(method="dascpl", name="cli")
    run = train_local(cfg, progress=None)
    return save_net(tmp_path_factory.mktemp("net") / "ck", run.net, cfg, run.result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--run", "no-such-run"], "--run: run 'no-such-run' has no complete checkpoint"),
        (["--checkpoint", "/nonexistent/ck"], "checkpoint: /nonexistent/ck is not a checkpoint"),
        (["--model", "models:/no-such-model/1"], "--model: models:/no-such-model/1 does not resolve"),
        (["--model", "s3://bucket/model"], "--model: 's3://bucket/model' is not an MLflow model URI"),
        (["--checkpoint", "CK", "--follow"], "--follow: follows a run; give --run NAME"),
        (["--checkpoint", "CK", "--replicas", "3-1"], "--replicas: 3-1 is not MIN-MAX"),
        (["--checkpoint", "CK", "--replicas", "many"], "--replicas: 'many' is not N or MIN-MAX"),
        (["--checkpoint", "CK", "--port", "70000"], "--port: 70000 is not a TCP port"),
    ],
)
def test_a_source_or_option_that_is_wrong_is_one_line_and_exit_2_before_serve_starts(saved, args, says, capsys,
                                                                                      mlflow_db):  # fmt: skip
    args = [str(saved) if a == "CK" else a for a in args]
    code = main(["serve", *args, "--tracking-uri", mlflow_db])
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


def test_a_port_in_use_is_named_with_the_option_that_chooses_another(saved, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", "--checkpoint", str(saved), "--port", str(port)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"--port: 127.0.0.1:{port} is in use; choose another port with --port N" in err, err


def test_print_config_is_a_serve_config_that_serve_accepts(saved, capsys):
    from ray.serve.schema import ServeDeploySchema

    assert main(["serve", "--checkpoint", str(saved), "--replicas", "1-3", "--print-config"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    schema = ServeDeploySchema.model_validate(config)
    deployment = schema.applications[0].deployments[0]
    assert deployment.user_config["source"] == str(saved)
    assert deployment.autoscaling_config["max_replicas"] == 3


def test_the_follower_serves_the_newest_whole_checkpoint_and_never_goes_back():
    done = ["ck1", "ck2", "ck3"]
    assert next_checkpoint(done, "ck2", set()) == "ck3"
    assert next_checkpoint(done, "ck3", set()) is None, "already served"
    assert next_checkpoint(done, "ck2", {"ck3"}) is None, "the newest was refused: keep ck2, never try ck3 again"
    assert next_checkpoint(["ck1", "ck2", "ck3", "ck4"], "ck2", {"ck3"}) == "ck4", "a newer one is tried"
    assert next_checkpoint([], None, set()) is None


def test_a_model_in_a_store_that_is_not_there_is_named_and_no_store_is_created(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "mlflow.db"
    code = main(["serve", "--model", "models:/m/1", "--tracking-uri", f"sqlite:///{missing}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"--tracking-uri: no MLflow store at {missing}" in err and not missing.parent.exists()


@pytest.mark.parametrize("how", ["truncated", "hash", "hostile"])
def test_a_damaged_checkpoint_is_one_line_and_exit_2_before_serve_starts(saved, tmp_path, how, capsys):
    """A truncated shard (hash fixed up), an edited hash, a pickle payload (hash fixed up): checked as a
    replica would load it (hashes, weights_only), before Ray or Serve start."""
    ck = Path(shutil.copytree(saved, tmp_path / "ck"))
    shard = _damage(ck, how)
    code = main(["serve", "--checkpoint", str(ck), "--port", "1"])  # a port no one may bind: never reached
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"--checkpoint: checkpoint {ck}: {shard}" in err, err
    assert "weights_only" not in err, err


def test_a_followed_run_holds_the_newest_whole_checkpoint_it_picks_until_released(saved, tmp_path):
    """newest_whole with claims (what serve --run does before deploying): the newest checkpoint is damaged, so
    it is skipped with a line and the one before is claimed; the run's pruning then keeps it; closing the
    claims withdraws them."""
    from growpipe.serve.deploy import Claims
    from growpipe.serve.source import newest_whole

    store = CheckpointStore(str(tmp_path), "run", keep=1)
    for seq in (1, 2):
        shutil.copytree(saved, store.dir_for(seq, 0, seq))
    damaged = Path(store.dir_for(2, 0, 2))
    _damage(damaged, "hash")
    lines: list[str] = []
    with Claims(store) as claims:
        held = newest_whole(store, claims, lines.append)
        assert held == store.dir_for(1, 0, 1) and len(lines) == 1 and lines[0].startswith(f"skip   {damaged.name}:")
        assert [p.name for p in Path(held).glob(".claim-*.json")] == [f".claim-{claims.holder}.json"]
        store.prune()
        assert (Path(held) / "manifest.json").is_file(), "older than the newest, but held"
    assert list(Path(held).glob(".claim-*")) == []
    store.prune()
    assert not Path(held).exists(), "released: pruned as any older checkpoint"
