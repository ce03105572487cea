"""Nothing lost: outputs replace only growpipe's own earlier ones, a run never takes another run's checkpoints,
run names stay inside their folders, and every mistake before a run is one line, all of them at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from growpipe.cli import main
from growpipe.outputs import MARK, is_own, output_problem

LOCAL = ["--runtime", "local", "--set", "net.width=32", "--set", "train.epochs=1", "--set", "al.code_dim=8",
         "--set", "tracking.mlflow=false"]  # fmt: skip


def _train(tmp_path: Path, *args: str) -> list[str]:
    return ["train", *LOCAL, "--set", f"checkpoint.uri={tmp_path / 'ck'}", *args]


def _refused(capsys, argv: list[str]) -> str:
    """Run `growpipe ARGV`: it must stop before any training with exit 2; its stderr."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "epoch " not in out and "data   " not in out  # nothing ran
    return err


def _user_files(tmp_path: Path) -> dict[str, Path]:
    """A user's data folder, a result file, a plot and a config that growpipe did not write."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("a,label\n1,0\n")
    (data / "test.csv").write_text("a,label\n1,0\n")
    files = {"data": data, "json": tmp_path / "mine.json", "png": tmp_path / "mine.png", "yaml": tmp_path / "mine.yaml"}
    files["json"].write_text('{"mine": true}\n')
    files["png"].write_bytes(b"\x89PNG\r\n\x1a\nnot growpipe's")
    files["yaml"].write_text("mine: true\n")
    return files


def _snapshot(paths: list[Path]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in paths:
        for f in [p, *p.rglob("*")] if p.is_dir() else [p]:
            out[str(f)] = f.read_bytes() if f.is_file() else None
    return out


def test_no_output_flag_touches_a_file_or_folder_growpipe_did_not_write(tmp_path: Path, capsys):
    files = _user_files(tmp_path)
    before = _snapshot([tmp_path])
    cases = [
        (["--save", str(files["data"])], "holds files growpipe did not write"),
        (["--save", str(files["json"])], "is a file, not a folder"),
        (["--json-out", str(files["json"])], "is a file growpipe did not write"),
        (["--json-out", str(files["data"])], "is a folder; give the path of a JSON file"),
        (["--plot-out", str(files["png"])], "is a file growpipe did not write"),
        (["--plot-out", str(files["data"])], "is a folder"),
        (["--trace-out", str(files["yaml"])], "is a file growpipe did not write"),
    ]
    for flags, needle in cases:
        err = _refused(capsys, _train(tmp_path, *flags))
        assert needle in err, (flags, err)
        assert len(err.strip().splitlines()) == 2, err  # the count, then the one problem
    # all at once, each on its line; two outputs on one path
    err = _refused(capsys, _train(tmp_path, "--save", str(files["data"]), "--json-out", str(files["json"])))
    assert "2 problem(s)" in err
    out = tmp_path / "new"
    err = _refused(capsys, _train(tmp_path, "--save", str(out), "--json-out", str(out / "r.json")))
    assert f"--json-out {out / 'r.json'} and --save {out}: one output would overwrite the other" in err or \
        f"--save {out} and --json-out {out / 'r.json'}: one output would overwrite the other" in err  # fmt: skip
    # the other commands that write
    err = _refused(capsys, ["evaluate", "--checkpoint", str(tmp_path), "--plot-out", str(files["png"])])
    assert "--plot-out" in err and "did not write" in err
    err = _refused(capsys, ["evaluate", "--checkpoint", str(tmp_path), "--plot-out", "/proc/x/y.png"])
    assert "--plot-out /proc/x/y.png: /proc" in err and "not writable" in err
    err = _refused(capsys, ["partition", "--stages", "2", "--write", str(files["yaml"])])
    assert "--write" in err and "did not write" in err
    assert _snapshot([tmp_path]) == before  # not one byte changed, nothing added


def test_the_same_command_twice_replaces_its_own_outputs_and_keeps_both_runs_checkpoints(tmp_path: Path, capsys):
    """`make demo` twice: the second run replaces the first one's --save, --json-out and --plot-out (its own
    files) and each run keeps its restore points under its own name."""
    ck, out, png = tmp_path / "out" / "checkpoint", tmp_path / "out" / "result.json", tmp_path / "out" / "acc.png"
    cmd = _train(tmp_path, "--config", "configs/demo.yaml", "--set", "grow.schedule=[]", "--save", str(ck),
                 "--json-out", str(out), "--plot-out", str(png))  # fmt: skip
    names = []
    for _ in range(2):
        assert main(cmd) == 0
        text = capsys.readouterr().out
        names.append(next(line.split()[1] for line in text.splitlines() if line.startswith("run    ")))
        result = json.loads(out.read_text())
        assert result["written_by"] == MARK and is_own(png, "png") and is_own(ck, "checkpoint")
    assert names[0] != names[1] and names[0].startswith("al-digits-")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == sorted(names)  # both runs' restore points
    assert sorted(p.name for p in ck.parent.iterdir()) == ["acc.png", "checkpoint", "result.json"]  # no leftovers


def test_a_saved_net_with_files_added_is_not_replaced_and_what_appears_mid_run_is_left_alone(
    tmp_path: Path, capsys, monkeypatch
):
    import growpipe.api

    saved, out = tmp_path / "saved", tmp_path / "result.json"
    assert main(_train(tmp_path, "--save", str(saved))) == 0
    capsys.readouterr()
    (saved / "notes.txt").write_text("mine")  # the user's file inside an earlier --save
    err = _refused(capsys, _train(tmp_path, "--save", str(saved)))
    assert "holds files growpipe did not write" in err and (saved / "notes.txt").read_text() == "mine"
    later = tmp_path / "later"
    real_train = growpipe.api.train

    def and_then_a_folder_appears(*args, **kwargs):
        result = real_train(*args, **kwargs)
        later.mkdir()
        (later / "theirs.txt").write_text("theirs")
        return result

    monkeypatch.setattr(growpipe.api, "train", and_then_a_folder_appears)
    assert main(_train(tmp_path, "--save", str(later), "--json-out", str(out))) == 1
    captured = capsys.readouterr()
    assert f"growpipe train: error: --save {later}: holds files growpipe did not write" in captured.err
    assert json.loads(out.read_text())["written_by"] == MARK  # the other output was still written
    assert sorted(p.name for p in later.iterdir()) == ["theirs.txt"]


def test_a_new_run_refuses_the_name_of_one_with_checkpoints_until_told_to_replace_them(tmp_path: Path, capsys):
    named = _train(tmp_path, "--set", "name=mine")
    assert main(named) == 0
    capsys.readouterr()
    kept = sorted((tmp_path / "ck" / "mine").iterdir())
    err = _refused(capsys, named)
    assert "name: run 'mine' already has 2 checkpoint(s)" in err and "--resume mine" in err and "--overwrite" in err
    assert sorted((tmp_path / "ck" / "mine").iterdir()) == kept
    assert main([*named, "--overwrite"]) == 0
    assert "removed 2 checkpoint folder(s) of an earlier run 'mine' (--overwrite)" in capsys.readouterr().out
    # a run folder holding what growpipe did not write is not written into
    (tmp_path / "ck" / "theirs").mkdir()
    (tmp_path / "ck" / "theirs" / "notes.txt").write_text("mine")
    err = _refused(capsys, _train(tmp_path, "--set", "name=theirs", "--overwrite"))
    assert "holds what growpipe did not write (notes.txt)" in err


def test_run_names_never_leave_their_folder_and_paths_that_cannot_be_written_are_named(tmp_path: Path, capsys):
    for bad in ("../../escape_test", "a/b", ".hidden", "x..y", "x y"):
        err = _refused(capsys, _train(tmp_path, "--set", f"name={bad}"))
        assert "is not a run name" in err, (bad, err)
    assert not (tmp_path.parent / "escape_test").exists()
    assert "--resume: '../x' is not a run name" in _refused(capsys, ["train", "--resume", "../x"])
    assert "--run: 'a/b' is not a run name" in _refused(capsys, ["grow", "--run", "a/b", "--address", "127.0.0.1:1"])
    err = _refused(capsys, _train(tmp_path, "--set", "checkpoint.uri=/proc/x"))
    assert "checkpoint.uri /proc/x: /proc is not writable" in err
    (tmp_path / "afile").write_text("x")
    assert "is a file" in _refused(capsys, _train(tmp_path, "--set", f"checkpoint.uri={tmp_path / 'afile'}"))


def test_tracking_uris_mlflow_cannot_use_are_refused_and_a_silent_server_is_warned(tmp_path: Path, capsys):
    mlflow_on = ["--set", "tracking.mlflow=true", "--set", f"tracking.workdir={tmp_path}"]
    for uri, needle in (("foo://bar", "no tracking store for scheme 'foo://'"),
                        (str(tmp_path / "plain"), "no longer writes plain-path"),
                        ("file:///tmp/x", "no longer writes plain-path")):  # fmt: skip
        err = _refused(capsys, _train(tmp_path, *mlflow_on, "--set", f"tracking.uri={uri}"))
        assert f"tracking.uri {uri}: MLflow" in err and needle in err
    assert main(_train(tmp_path, *mlflow_on, "--set", "tracking.uri=http://127.0.0.1:9")) == 0
    out = capsys.readouterr().out
    assert out.startswith("warn   tracking.uri http://127.0.0.1:9: no MLflow server answered")
    assert "mlflow-unsent-" in out and list(tmp_path.glob("mlflow-unsent-*.jsonl"))  # kept, as the warning said


def test_config_mistakes_name_the_line_and_every_problem_at_once(tmp_path: Path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("method: al\nnet:\n  blocks: 2\n  widht: 3\ndata:\n  normalize: {mean: [0.5], std: [0]}\n"
                   "eval:\n  thresholds: []\n")  # fmt: skip
    err = _refused(capsys, ["train", "--config", str(cfg)])
    assert "3 problem(s)" in err and "net.widht (line 4): unknown field" in err
    assert "eval.thresholds (line 8): give at least one threshold" in err
    assert "data.normalize (line 6): std[0] is 0" in err and "function-after" not in err
    cfg.write_text("method: al\nnet:\n  blocks: [2\n")
    assert "line 4, column 1: not valid YAML" in _refused(capsys, ["train", "--config", str(cfg)])
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: ok\nset: {train.epochs: 1}\nmetric: nope\n"
                     "search_space:\n  train.lr: {choice: [0.1, -1]}\n  net.blocks: {choice: [2, 0]}\n")  # fmt: skip
    err = _refused(capsys, ["sweep", str(sweep), "--check"])
    assert "3 problem(s)" in err and "search_space.train.lr=-1: train.lr" in err
    assert "search_space.net.blocks=0: net.blocks" in err and "metric: 'nope'" in err
    sweep.write_text("name: ../x\nkind: thresholds\nsearch: optuna\nsearch_space:\n  train.lr: {grid: [0.1]}\n")
    err = _refused(capsys, ["sweep", str(sweep), "--check"])
    assert "5 problem(s)" in err and "name: '../x' is not a run name" in err and "needs source" in err


def test_a_damaged_manifest_and_a_full_disk_are_one_line(tmp_path: Path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "manifest.json").write_text("[1, 2]")
    err = _refused(capsys, ["evaluate", "--checkpoint", str(ck)])
    assert "manifest.json holds a JSON list, not a growpipe manifest" in err and "Traceback" not in err
    # --save past what the file system takes (a file size limit: EFBIG, as ENOSPC on a full disk)
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
        "from growpipe.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    save = tmp_path / "saved"
    argv = [*_train(tmp_path, "--set", "checkpoint.enabled=false", "--set", "net.width=512", "--save", str(save))]
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"growpipe train: error: --save {save}: could not be written (File too large)"), last
    assert "Traceback" not in proc.stderr and not save.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".saved")]  # no half-written folder


@pytest.mark.parametrize("kind", ["json", "png", "yaml", "checkpoint"])
def test_what_counts_as_growpipes_own(tmp_path: Path, kind: str):
    empty = tmp_path / "empty"
    (empty.mkdir() if kind == "checkpoint" else empty.write_bytes(b""))
    assert is_own(empty, kind) and output_problem("--x", empty, kind) is None  # nothing to lose
    assert output_problem("--x", tmp_path / "new" / "path", kind) is None


def test_an_embedded_ray_that_cannot_start_is_one_line(tmp_path: Path):
    import os

    cmd = [sys.executable, "-m", "growpipe.cli", "train", *LOCAL[2:], "--set", "checkpoint.enabled=false"]
    env = {**os.environ, "RAY_TMPDIR": "/proc/no-such-dir"}  # Ray cannot make its session folder there
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("growpipe train: error: the embedded Ray did not start")
