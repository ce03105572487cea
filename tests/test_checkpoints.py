"""Run checkpoints: atomic commit, keep-K, hash-checked loading, config checks on resume, and a process
killed while it writes a checkpoint."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from growpipe.checkpoint import CheckpointStore, config_differences
from growpipe.errors import CheckpointError
from growpipe.resume import plan_resume


def _state(v: float) -> dict:
    return {"modules": {"w": torch.full((3, 3), v)}, "optimizers": {}, "frozen": False, "steps": 1}


def _write(store: CheckpointStore, epoch: int, batch: int, seq: int, v: float, config: dict | None = None):
    path = store.dir_for(epoch, batch, seq)
    shards = [store.write_shard(path, {i: _state(v + i)}) for i in range(2)]
    return store.commit(path, {"epoch": epoch, "batch": batch, "seq": seq, "shards": shards, "config": config or {}})


def test_commit_latest_and_keep_k(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), "run", keep=2)
    assert store.latest() is None
    for seq, epoch in enumerate([1, 2, 3], start=1):
        _write(store, epoch, 0, seq, float(epoch))
    done = store.complete()
    assert [(c.epoch, c.seq) for c in done] == [(2, 2), (3, 3)]  # the oldest was pruned
    ref = store.latest()
    manifest = store.read_manifest(ref)
    assert torch.equal(store.load_block(ref.path, manifest["shards"], 1)["modules"]["w"], torch.full((3, 3), 4.0))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [Path(c.path).name for c in done]


def test_changed_shard_and_damaged_manifest_are_refused(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), "run")
    ref = _write(store, 1, 0, 1, 1.0)
    manifest = store.read_manifest(ref)
    shard = Path(ref.path) / "block-0.pt"
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="block-0.pt does not match the SHA-256"):
        store.load_block(ref.path, manifest["shards"], 0)
    (Path(ref.path) / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json is not valid JSON"):
        store.read_manifest(ref)


def test_resume_refuses_a_config_that_does_not_match_naming_the_field(tmp_path: Path):
    from growpipe.config import RunConfig, dump_config

    saved = RunConfig(name="r").model_dump(mode="json")
    store = CheckpointStore(str(tmp_path), "r")
    _write(store, 1, 0, 1, 1.0, config=saved)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(dump_config(RunConfig(name="r")))
    common = [f"checkpoint.uri={tmp_path}"]
    cfg, ref = plan_resume(str(cfg_file), [*common, "train.epochs=20"], "r")  # more epochs: allowed
    assert ref is not None and ref.epoch == 1 and cfg.train.epochs == 20
    with pytest.raises(CheckpointError, match=r"net.width: checkpoint has 256, this run has 64"):
        plan_resume(str(cfg_file), [*common, "net.width=64"], "r")
    with pytest.raises(CheckpointError, match="no complete checkpoint of run 'other'"):
        plan_resume(None, common, "other")
    fresh, none = plan_resume(None, [*common, "name=other"], "auto")
    assert none is None and fresh.name == "other"
    assert config_differences({"a": {"b": 1}, "runtime": {"window": 2}}, {"a": {"b": 2}, "runtime": {"window": 4}}) == [
        "a.b: checkpoint has 1, this run has 2"
    ]


def test_a_checkpoint_older_than_a_config_field_resumes_as_it_ran(tmp_path: Path):
    """A saved config without fields added since (net.input_norm and scpl.classifier_norm, whose defaults change
    a transformer's blocks and an SCPL classifier; data.min_count, whose default changes nothing) resumes: the
    first two keep the value the run had where they matter, the third takes its default."""
    from growpipe.config import RunConfig, dump_config

    common = [f"checkpoint.uri={tmp_path}"]
    for name, net, method in (("tf", {"backbone": "transformer", "width": 8, "heads": 2}, "al"), ("dense", {}, "al"),
                              ("sc", {}, "dascpl")):  # fmt: skip
        config = RunConfig.model_validate({"name": name, "net": net, "method": method})
        saved = config.model_dump(mode="json")
        del saved["net"]["input_norm"], saved["data"]["min_count"], saved["scpl"]["classifier_norm"]
        _write(CheckpointStore(str(tmp_path), name), 1, 0, 1, 1.0, config=saved)
        cfg, ref = plan_resume(None, common, name)
        assert ref is not None and cfg.net.input_norm is (name != "tf") and cfg.data.min_count == 1
        assert cfg.scpl.classifier_norm is (name != "sc")
        if name == "sc":
            continue
        cfg_file = tmp_path / f"{name}.yaml"
        cfg_file.write_text(dump_config(config))
        if name == "dense":  # its own config, defaults and all, matches
            assert plan_resume(str(cfg_file), common, name)[1] == ref
            continue
        with pytest.raises(CheckpointError, match=r"net.input_norm: checkpoint has False, this run has True; .*--set "
                                                  r"the field to the checkpoint's value"):  # fmt: skip
            plan_resume(str(cfg_file), common, name)
        assert plan_resume(str(cfg_file), [*common, "net.input_norm=false"], name)[0].net.input_norm is False


def test_a_run_continuing_an_older_checkpoint_from_its_own_config_builds_the_blocks_as_saved(tmp_path: Path):
    """continue_from (a Tune trial handed a checkpoint): the trial's config takes the checkpoint's values of the
    fields added since it was written, so a transformer DASCPL net saved before them is rebuilt as it was."""
    from growpipe.config import RunConfig
    from growpipe.resume import continue_from

    net = {"backbone": "transformer", "width": 8, "heads": 2}
    saved = RunConfig.model_validate({"name": "old", "net": net, "method": "dascpl"}).model_dump(mode="json")
    del saved["net"]["input_norm"], saved["scpl"]["classifier_norm"]
    store = CheckpointStore(str(tmp_path), "old")
    _write(store, 1, 0, 1, 1.0, config=saved)
    trial = RunConfig.model_validate({"name": "old", "net": net, "method": "dascpl",
                                      "checkpoint": {"uri": str(tmp_path)}})  # fmt: skip
    assert trial.net.input_norm and trial.scpl.classifier_norm
    cfg = continue_from(trial, store.latest().path)
    assert cfg.net.input_norm is False and cfg.scpl.classifier_norm is False and cfg.net.width == 8


def test_process_killed_while_writing_a_checkpoint_leaves_the_previous_one_loadable(tmp_path: Path):
    """A real process writes checkpoint 1, then dies (SIGKILL) halfway through checkpoint 2's manifest."""
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from growpipe.checkpoint import CheckpointStore
        store = CheckpointStore({str(tmp_path)!r}, "run")
        state = {{"modules": {{"w": torch.ones(4)}}, "optimizers": {{}}, "frozen": False, "steps": 1}}
        p1 = store.dir_for(1, 0, 1)
        store.commit(p1, {{"epoch": 1, "batch": 0, "seq": 1, "shards": [store.write_shard(p1, {{0: state}})]}})
        state["modules"]["w"] = torch.zeros(4)
        p2 = store.dir_for(2, 0, 2)
        store.write_shard(p2, {{0: state}})
        with store.fs.open_output_stream(p2 + "/.manifest.json.tmp") as f:
            f.write(b'{{"epoch": 2, "batch"')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    store = CheckpointStore(str(tmp_path), "run")
    ref = store.latest()
    assert (ref.epoch, ref.seq) == (1, 1)  # the half-written one is not complete
    assert (tmp_path / "run" / "ckpt-000002-0000000-0002" / "block-0.pt").is_file()
    manifest = store.read_manifest(ref)
    assert torch.equal(store.load_block(ref.path, manifest["shards"], 0)["modules"]["w"], torch.ones(4))


def test_nothing_in_the_package_unpickles_untrusted_files():
    src = Path(__file__).resolve().parents[1] / "src" / "growpipe"
    for path in src.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.name}:{n}"
            if "torch.load(" in line:
                assert "weights_only=True" in line, where
            if "np.load(" in line:
                assert "allow_pickle=False" in line, where
            assert "pickle.load" not in line and "import pickle" not in line, where


def test_a_uri_goes_through_pyarrow_filesystems(tmp_path: Path):
    store = CheckpointStore(f"file://{tmp_path}/uri", "run")
    ref = _write(store, 1, 5, 1, 2.0)
    assert store.latest() == ref and (tmp_path / "uri" / "run" / "ckpt-000001-0000005-0001" / "manifest.json").is_file()
    with pytest.raises(CheckpointError, match="checkpoint.uri 'nosuchfs://x'"):
        CheckpointStore("nosuchfs://x", "run")


def test_a_local_resume_goes_on_in_the_same_mlflow_run_and_a_ray_one_is_decided_the_same(tmp_path: Path):
    """The resume (checkpoint and MLflow run) is decided once, in the preparation step every runtime takes."""
    from mlflow.tracking import MlflowClient

    from growpipe.cli import main
    from growpipe.prepare import prepare_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = [f"tracking.uri={uri}", "tracking.mlflow=true", "tracking.experiment=resume", "checkpoint.enabled=true",
            f"checkpoint.uri={tmp_path / 'ck'}", "name=again", "net.width=32", "al.code_dim=8", "data.limit_train=256",
            "data.limit_test=64", "tracking.log_model=false", "tracking.system_metrics=false"]  # fmt: skip
    args = [a for kv in sets for a in ("--set", kv)]
    assert main(["train", "--runtime", "local", "-q", *args, "--set", "train.epochs=1"]) == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("resume").experiment_id
    (first,) = client.search_runs([experiment])
    resume = ["--resume", "again", "--set", f"checkpoint.uri={tmp_path / 'ck'}"]
    assert main(["train", "--runtime", "local", "-q", *resume, "--set", "train.epochs=2"]) == 0
    (run,) = client.search_runs([experiment])  # no second run: the first one went on
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    epochs = [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
    assert sorted(set(epochs)) == [1, 2], epochs
    on_ray = prepare_run(None, ["checkpoint.uri=" + str(tmp_path / "ck")], resume_run="again", runtime="ray",
                         address="ray://not-asked:10001", say=None)  # fmt: skip
    assert on_ray.cfg.tracking.run_id == first.info.run_id and "/again/ckpt-000002-" in str(on_ray.resume)
