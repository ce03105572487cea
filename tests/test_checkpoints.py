"""Run checkpoints: atomic commit, keep-K, hash-checked loading, config checks on resume, and a process
killed while it writes a checkpoint."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from growpipe.checkpoint import (
    CLAIM_TTL_S,
    CheckpointStore,
    claim_holds,
    prune_plan,
    run_folder_problem,
)
from growpipe.errors import CheckpointError
from growpipe.resume import plan_resume
from growpipe.saved_config import config_differences


def _state(v: float) -> dict:
    return {"modules": {"w": torch.full((3, 3), v)}, "optimizers": {}, "frozen": False, "steps": 1}


def _write(store: CheckpointStore, epoch: int, batch: int, seq: int, v: float, config: dict | None = None, say=None):
    path = store.dir_for(epoch, batch, seq)
    shards = [store.write_shard(path, {i: _state(v + i)}) for i in range(2)]
    return store.commit(path, {"epoch": epoch, "batch": batch, "seq": seq, "shards": shards, "config": config or {},
                               "topology": [{"index": i} for i in range(2)]}, say=say)  # fmt: skip


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


def _as_format_2(ckpt_dir: str | Path, drop: tuple[str, ...] = ()) -> None:
    """Make checkpoint `ckpt_dir` as growpipe wrote it in format 2: no rule or architecture in the block specs
    and, in the config, none of the dotted fields `drop` (fields added since it was written)."""
    path = Path(ckpt_dir) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 2
    manifest["topology"] = [{k: v for k, v in d.items() if k not in ("method", "arch")} for d in manifest["topology"]]
    for dotted in drop:
        section, key = dotted.split(".")
        del manifest["config"][section][key]
    path.write_text(json.dumps(manifest))


def _tiny_transformer(method: str, **sections) -> tuple:
    """A 2-block transformer net of `method` on 6-token text (untrained), its config and input."""
    from growpipe.config import RunConfig
    from growpipe.nn.net import GrowableNet
    from growpipe.nn.specs import InputInfo

    net = {"backbone": "transformer", "width": 8, "heads": 2, "blocks": 2, "embed_dim": 8}
    cfg = RunConfig.model_validate({"name": "tf", "method": method, "net": {**net, **sections.pop("net", {})},
                                    "scpl": {"proj_dim": 4}, "al": {"code_dim": 4}, **sections})  # fmt: skip
    info = InputInfo(shape=(6,), dtype="long", num_classes=3, vocab_size=20)
    return GrowableNet.build(cfg.rule(), cfg.net, info), cfg, info


def test_a_checkpoint_older_than_a_config_field_resumes_as_it_ran(tmp_path: Path):
    """A format-2 manifest whose config lacks fields added since (net.input_norm and scpl.classifier_norm, whose
    defaults change a transformer's blocks and an SCPL classifier; data.min_count, whose default changes
    nothing) resumes: the versioned reader gives the first two the value the run had where they matter (its
    block specs take the rule's architecture, classifier_norm off), the third takes its default."""
    from growpipe.config import RunConfig, dump_config

    common = [f"checkpoint.uri={tmp_path}"]
    for name, net, method in (("tf", {"backbone": "transformer", "width": 8, "heads": 2}, "al"), ("dense", {}, "al"),
                              ("sc", {}, "dascpl")):  # fmt: skip
        config = RunConfig.model_validate({"name": name, "net": net, "method": method})
        store = CheckpointStore(str(tmp_path), name)
        ref = _write(store, 1, 0, 1, 1.0, config=config.model_dump(mode="json"))
        _as_format_2(ref.path, drop=("net.input_norm", "data.min_count", "scpl.classifier_norm"))
        manifest = store.read_manifest(ref)
        assert manifest["format_version"] == 3 and {d["method"] for d in manifest["topology"]} == {method}
        if name == "sc":
            assert all(d["arch"]["classifier_norm"] is False for d in manifest["topology"])
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
    manifest_file = Path(ref.path) / "manifest.json"
    manifest_file.write_text(json.dumps({**json.loads(manifest_file.read_text()), "format_version": 1}))
    with pytest.raises(CheckpointError, match=r"format 1, this growpipe reads 2 to 3 \(written by another growpipe"):
        CheckpointStore(str(tmp_path), "sc").read_manifest(ref)  # the last one written


def test_a_run_continuing_an_older_checkpoint_from_its_own_config_builds_the_blocks_as_saved(tmp_path: Path):
    """continue_from (a Tune trial handed a checkpoint): a transformer DASCPL net saved in format 2 before
    net.input_norm and scpl.classifier_norm existed is rebuilt as it was from the specs the versioned reader
    gives, though the trial's config turns both on; the trial keeps its own config."""
    from growpipe.checkpoint import save_net
    from growpipe.config import RunConfig
    from growpipe.nn.methods import build_block
    from growpipe.nn.specs import BlockSpec
    from growpipe.resume import continue_from

    old, cfg, info = _tiny_transformer("dascpl", net={"input_norm": False}, scpl={"classifier_norm": False})
    store = CheckpointStore(str(tmp_path), "tf")
    path = store.dir_for(1, 0, 1)
    save_net(path, old, cfg)
    _as_format_2(path, drop=("net.input_norm", "scpl.classifier_norm"))
    trial = RunConfig.model_validate({**cfg.model_dump(mode="json"), "checkpoint": {"uri": str(tmp_path)},
                                      "net": {**cfg.net.model_dump(mode="json"), "input_norm": True},
                                      "scpl": {"proj_dim": 4, "classifier_norm": True}})  # fmt: skip
    run_cfg = continue_from(trial, path)
    assert run_cfg.net.input_norm and run_cfg.scpl.classifier_norm
    specs = [BlockSpec.from_dict(d) for d in store.read_manifest(path)["topology"]]
    for spec, saved in zip(specs, old.blocks, strict=True):
        block = build_block(run_cfg.rule(), spec, info)
        assert block.modules.state_dict().keys() == saved.modules.state_dict().keys()
        block.load_state_dict(saved.state_dict())  # strict: the same modules, shapes and optimizer
    assert isinstance(block.modules["cls"], torch.nn.Linear)  # no LayerNorm before the classifier


@pytest.mark.parametrize("method", ["dascpl", "al"])
def test_a_checkpoint_rebuilds_its_net_whatever_its_saved_config_says(tmp_path: Path, method: str):
    """The architecture is in the manifest's specs: with its saved config's architecture fields changed (the
    rule's heads, net.input_norm, the method itself), evaluate / serve / the MLflow model (load_net), the
    block groups of `serve --stages` and a resume's blocks (build_block under the changed config) are the net
    that was saved: the same modules and the same outputs."""
    from growpipe.checkpoint import load_net, save_net
    from growpipe.config import build_config
    from growpipe.nn.methods import build_block
    from growpipe.nn.packet import Packet
    from growpipe.nn.specs import BlockSpec
    from growpipe.serve.groups import BlockGroupNet

    net, cfg, info = _tiny_transformer(method)
    save_net(tmp_path / "ck", net, cfg)
    path = tmp_path / "ck" / "manifest.json"
    manifest = json.loads(path.read_text())
    changed = manifest["config"]
    changed["method"] = "scpl" if method == "al" else "al"
    changed["net"]["input_norm"] = False
    changed["scpl"].update(classifier_norm=False, proj_dim=32, projector="linear")
    changed["al"].update(code_dim=32, bridge_hidden=8)
    path.write_text(json.dumps(manifest))
    x = torch.randint(2, 20, (5, 6))
    want = net.exit_logits(Packet(x=x))

    loaded, _ = load_net(tmp_path / "ck")
    assert [b.modules.state_dict().keys() for b in loaded.blocks] == [b.modules.state_dict().keys() for b in net.blocks]
    got = loaded.exit_logits(Packet(x=x))
    assert got.keys() == want.keys() and all(torch.equal(got[d], want[d]) for d in want)
    groups = [BlockGroupNet.load(tmp_path / "ck", 2, i) for i in range(2)]
    assert [type(g.blocks[0]) for g in groups] == [type(b) for b in net.blocks]
    resumed = build_config(changed, "the changed config")
    for d, saved in zip(manifest["topology"], net.blocks, strict=True):
        block = build_block(resumed.rule(), BlockSpec.from_dict(d), info)
        block.load_state_dict(saved.state_dict())  # strict: the same modules and shapes
        assert type(block) is type(saved)


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


def test_pruning_keeps_the_newest_the_protected_and_the_claimed_and_a_claim_expires():
    """The decisions, pure: which folders pruning removes, and whether a claim still holds its checkpoint."""
    dirs = [("a", (0, 0, 1), True), ("b", (1, 0, 2), False), ("c", (1, 0, 3), True), ("d", (2, 0, 4), True),
            ("e", (3, 0, 5), True)]  # fmt: skip
    assert prune_plan(dirs, 2, set()) == ["a", "b", "c"], "older than the oldest of the newest 2, incomplete too"
    assert prune_plan(dirs, 2, {"a"}) == ["b", "c"], "a held (claimed, protected) checkpoint stays"
    assert prune_plan(dirs, 2, {"e"}) == ["a", "b"], "and does not count towards keep"
    assert prune_plan(dirs[:2], 2, set()) == [] and prune_plan(dirs[1:2], 1, set()) == []
    now, alive = 1000.0, lambda pid: pid == 42
    claim = {"holder": "ab12cd34", "host": "here", "pid": 42, "written_at": now - 10}
    assert claim_holds(claim, now, "here", alive)
    assert not claim_holds({**claim, "written_at": now - CLAIM_TTL_S - 1}, now, "here", alive), "not refreshed"
    assert not claim_holds({**claim, "written_at": now + CLAIM_TTL_S + 1}, now, "here", alive), "a bogus time"
    assert not claim_holds({**claim, "pid": 7}, now, "here", alive), "its holder is gone"
    assert claim_holds({**claim, "pid": 7}, now, "elsewhere", alive), "another machine's holder: by time only"
    assert not claim_holds("junk", now, "here", alive) and not claim_holds({**claim, "written_at": True}, now, "here",
                                                                           alive)  # fmt: skip


def test_a_claimed_checkpoint_outlives_pruning_until_its_claim_is_withdrawn_or_stale(tmp_path: Path):
    store = CheckpointStore(str(tmp_path), "run", keep=2)
    first = _write(store, 1, 0, 1, 1.0)
    assert store.claim(first.path, "ab12cd34")
    for seq in (2, 3):
        _write(store, seq, 0, seq, 1.0)
    assert [c.seq for c in store.complete()] == [1, 2, 3], "the claimed one is kept beside the newest 2"
    claim_file = Path(first.path) / ".claim-ab12cd34.json"
    claim = json.loads(claim_file.read_text())
    claim_file.write_text(json.dumps({**claim, "written_at": claim["written_at"] - CLAIM_TTL_S - 1}))
    _write(store, 4, 0, 4, 1.0)
    assert [c.seq for c in store.complete()] == [3, 4] and not Path(first.path).exists(), "a stale claim holds nothing"
    assert not store.claim(first.path, "ab12cd34"), "a pruned checkpoint cannot be claimed"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    third = store.complete()[0]
    assert store.claim(third.path, "ef56ab78")
    claim_file = Path(third.path) / ".claim-ef56ab78.json"
    claim_file.write_text(json.dumps({**json.loads(claim_file.read_text()), "pid": gone.pid}))
    _write(store, 5, 0, 5, 1.0)
    assert not Path(third.path).exists(), "its holder's process is gone"
    fourth = store.complete()[0]
    assert store.claim(fourth.path, "0123abcd")
    _write(store, 6, 0, 6, 1.0)
    assert Path(fourth.path, "manifest.json").is_file()
    store.unclaim(fourth.path, "0123abcd")
    _write(store, 7, 0, 7, 1.0)
    assert [c.seq for c in store.complete()] == [6, 7]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [Path(c.path).name for c in store.complete()]


def test_removing_checkpoints_deletes_only_the_files_growpipe_wrote(tmp_path: Path):
    """Pruning removes a checkpoint's own files and leaves a user's file (one line); a ckpt-* folder holding
    anything else is named before a run starts, and --overwrite / a fresh run refuse to clear it."""
    store = CheckpointStore(str(tmp_path), "run", keep=1)
    first = _write(store, 1, 0, 1, 1.0)
    (Path(first.path) / "notes.txt").write_text("mine")
    lines: list[str] = []
    _write(store, 2, 0, 2, 1.0, say=lines.append)
    _write(store, 3, 0, 3, 1.0, say=lines.append)
    assert os.listdir(first.path) == ["notes.txt"] and (Path(first.path) / "notes.txt").read_text() == "mine"
    assert len(lines) == 1 and "ckpt-000001-0000000-0001 kept: it holds what growpipe did not write (notes.txt)" in (
        lines[0]), lines  # fmt: skip
    odd = tmp_path / "run" / "ckpt-000000-0000000-0009"
    odd.mkdir()
    (odd / "data.csv").write_text("x")
    assert store.foreign() == ["ckpt-000000-0000000-0009/data.csv", "ckpt-000001-0000000-0001/notes.txt"]
    why = run_folder_problem(store, fresh=True, overwrite=True)
    assert why and "holds what growpipe did not write (ckpt-000000-0000000-0009/data.csv, ckpt-000001" in why
    with pytest.raises(CheckpointError, match="refusing to remove its checkpoints"):
        store.clear()
    assert (odd / "data.csv").read_text() == "x" and store.latest() is not None
    shutil.rmtree(odd)
    (Path(first.path) / "notes.txt").unlink()
    cut = Path(store.dir_for(4, 0, 4))  # a write cut short: shards and the manifest's temporary name
    cut.mkdir()
    (cut / "block-0.pt").write_bytes(b"x")
    (cut / ".manifest.json.tmp").write_text("{")
    assert store.foreign() == [] and store.clear() == 3 and os.listdir(tmp_path / "run") == []


def test_a_fresh_run_or_overwrite_refuses_a_checkpoint_folder_holding_a_users_file(tmp_path: Path, capsys):
    from growpipe.cli import main

    user = tmp_path / "ck" / "mine" / "ckpt-000000-0000000-0001" / "notes.txt"
    user.parent.mkdir(parents=True)
    user.write_text("mine")
    sets = ["name=mine", f"checkpoint.uri={tmp_path / 'ck'}", "checkpoint.enabled=true", "tracking.mlflow=false",
            "data.limit_train=64", "data.limit_test=32", "net.width=16"]  # fmt: skip
    for extra in ([], ["--overwrite"]):
        code = main(["train", "--runtime", "local", "-q", *[a for kv in sets for a in ("--set", kv)], *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("growpipe train: error: 1 problem(s) before the run"), err
        assert "holds what growpipe did not write (ckpt-000000-0000000-0001/notes.txt)" in err, err
    assert user.read_text() == "mine"


def _undeletable(path: Path) -> None:
    """Make entries in folder `path` impossible to remove (root ignores permission bits: the immutable flag)."""
    if os.geteuid() != 0:
        path.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not available: no way to make a folder read-only")


def _deletable(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_checkpoint_that_cannot_be_pruned_is_one_line_and_the_run_goes_on(tmp_path: Path):
    """A real run whose first checkpoint folder turns read-only: pruning it fails, said once, and the run
    finishes with every later checkpoint written."""
    from growpipe.local import train_local
    from tests.conftest import tiny_config

    cfg = tiny_config(method="dascpl", name="ro", train={"epochs": 3},
                      checkpoint={"enabled": True, "uri": str(tmp_path), "every_epochs": 1})  # fmt: skip
    lines: list[str] = []
    frozen: list[Path] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line.startswith("ckpt   ckpt-") and not frozen:
            frozen.append(tmp_path / "ro" / line.split()[1])
            _undeletable(frozen[0])

    try:
        run = train_local(cfg, progress=on_line)
    finally:
        for path in frozen:
            _deletable(path)
    said = [line for line in lines if "could not be removed" in line]
    assert len(said) == 1 and frozen[0].name in said[0] and "the run goes on" in said[0], lines
    assert run.result["epochs"] == 3
    store = CheckpointStore(str(tmp_path), "ro")
    assert store.latest().epoch == 3 and Path(frozen[0], "manifest.json").is_file()


class _Payload:
    """A pickled object that runs code when unpickled without weights_only (here: a harmless call)."""

    def __reduce__(self):
        return (os.getpid, ())


def _damage(ckpt: Path, how: str) -> str:
    """Damage checkpoint folder `ckpt`'s first shard: `hostile` (a pickle payload, its hash fixed up in the
    manifest), `truncated` (hash fixed up too) or `hash` (the manifest's SHA-256 edited); the shard's name."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    entry = manifest["shards"][0]
    shard = ckpt / entry["file"]
    if how == "hostile":
        buf = io.BytesIO()
        torch.save({"blocks": {str(i): _Payload() for i in entry["blocks"]}}, buf)
        shard.write_bytes(buf.getvalue())
    elif how == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest() if how != "hash" else "0" * 64
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    return entry["file"]


def test_a_damaged_or_hostile_checkpoint_is_one_line_naming_the_file_and_resume_goes_back_to_a_whole_one(
    tmp_path: Path, capsys
):
    """evaluate and --resume on a checkpoint whose shard is a pickle payload (its hash fixed up): one line
    naming the file, never torch's hint to load it unsafely (exit 2); --resume goes back to the newest whole
    checkpoint (keep: 2) and says so, and refuses (exit 2) when none is whole."""
    from growpipe.cli import main

    sets = ["name=back", f"checkpoint.uri={tmp_path}", "checkpoint.enabled=true", "tracking.mlflow=false",
            "data.limit_train=256", "data.limit_test=64", "net.width=32", "al.code_dim=8",
            "train.epochs=2"]  # fmt: skip
    args = [a for kv in sets for a in ("--set", kv)]
    assert main(["train", "--runtime", "local", "-q", *args]) == 0
    capsys.readouterr()
    store = CheckpointStore(str(tmp_path), "back")
    older, newest = store.complete()
    shard = _damage(Path(newest.path), "hostile")
    assert main(["evaluate", "--checkpoint", newest.path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{shard} holds a pickled object" in err and "weights_only" not in err, err
    resume = ["--resume", "back", "--set", f"checkpoint.uri={tmp_path}", "--set", "train.epochs=3"]
    assert main(["train", "--runtime", "local", *resume]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "damaged" in line and line.startswith("resume back:")]
    assert len(said) == 1 and Path(older.path).name in said[0] and shard in said[0], out
    assert f"resume {older.path}: epoch {older.epoch}" in out, "trained on from the whole one"
    assert "set aside as manifest.json.damaged" in said[0], said
    assert store.latest().epoch == 3 and store.latest().seq > newest.seq, "new checkpoints numbered past it"
    assert not Path(newest.path).exists(), "pruned as an old checkpoint once newer ones were written"
    for ref in store.complete():
        _damage(Path(ref.path), "truncated")
    assert main(["train", "--runtime", "local", *resume]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume back: no checkpoint of the run is whole" in err, err
    assert "is not a readable torch file" in err, err
