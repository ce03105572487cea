"""The documentation is tested: every command block of README.md, docs/, jobs/, raylocal/, k8s/ and
tune_configs/ runs here as written (tiny data and epochs through GROWPIPE_SET, placeholders such as NAME
filled in), or says in the doc why it cannot run here. A test runs the block marked `run as KEY` by
calling block with that key. The tests share one checkout-like folder, as a user's shell session would: what one command
writes (runs/fm/ck, a registered run) the next one reads; a command already run there is not run again. As in
that session, a Ray started once is running (fixture `cluster`): the commands that need no Ray of their own join
it through RAY_ADDRESS."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.doc_blocks import COMMAND_LANGUAGES, COMMAND_START, all_blocks, block, commands
from tests.docs_run import (
    TINY,
    Background,
    answers,
    checkout_view,
    environment,
    filled,
    held_run,
    python_block,
    run_block,
    run_command,
    sh,
    unique,
    wait_until,
)
from tests.noise import library_noise

DEMO_FAST = "train.epochs=2; grow.schedule=[{kind: layer, epochs: 1}]"


@pytest.fixture(scope="module")
def view(tmp_path_factory) -> Path:
    """The folder every documented command of this module runs in (one user's checkout)."""
    return checkout_view(tmp_path_factory.mktemp("docs") / "checkout")


@pytest.fixture(scope="module")
def cluster(ray_session) -> str:
    """The address of a Ray that outlives the commands (this session's): the commands that do not test how a
    run starts or stops its own Ray join it through RAY_ADDRESS. The README's demo, the runs held open and
    the servers start their own, as a user's first commands do."""
    return ray_session.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def fm(view: Path, cluster: str) -> Path:
    """The README's first everyday command (a Fashion-MNIST run saved to runs/fm/ck), which the pages that
    evaluate or serve runs/fm/ck take up."""
    out = run_command(commands(block("readme-everyday").text)[0], view, environment(ray_address=cluster))
    assert (view / "runs/fm/ck/manifest.json").is_file() and (view / "runs/fm/result.json").is_file(), out.stdout
    return view / "runs/fm/ck"


def _quiet(*outs) -> None:
    noise = [line for o in outs for line in library_noise(o.stdout + o.stderr)]
    assert not noise, "library lines a user cannot act on:\n" + "\n".join(noise)


def test_every_command_block_is_run_or_says_why_not():
    """A new command block fails here until it is given a runner (run as KEY) or a reason."""
    problems = []
    keys: dict[str, list[str]] = {}
    for b in all_blocks():
        if b.language in COMMAND_LANGUAGES:
            if b.key:
                keys.setdefault(b.key, []).append(b.where)
            elif not b.reason:
                problems.append(f"{b.where}: a ```{b.language} block with neither '<!-- doc: run as KEY -->' nor "
                                "'<!-- doc: not run here: REASON -->' on the line above")  # fmt: skip
        elif b.language == "" and any(COMMAND_START.match(line) for line in b.text.splitlines()):
            problems.append(f"{b.where}: a block without a language (a picture) holds a command")
    runners = {m for f in Path(__file__).parent.glob("test_*.py")
               for m in re.findall(r"""\bblock\("([\w.-]+)"\)""", f.read_text())}  # fmt: skip
    problems += [f"{', '.join(w)}: run as {k}, but no test runs block(\"{k}\")" for k, w in keys.items()
                 if k not in runners]  # fmt: skip
    problems += [f'a test runs block("{k}"), but no block is marked "run as {k}"' for k in runners if k not in keys]
    problems += [f"run as {k} marks {len(w)} blocks: {', '.join(w)}" for k, w in keys.items() if len(w) > 1]
    assert not problems, "\n".join(problems)
    ran = sum(b.key is not None for b in all_blocks())
    marked = sum(b.reason is not None for b in all_blocks())
    assert ran >= 15 and marked <= 12, (ran, marked)  # most of it runs here


def test_the_block_reader_joins_continuations_and_drops_comments():
    text = "a --x 1 \\\n    --y 2   # two\n\n# only a comment\nb '#not a comment' # but this is\n"
    assert commands(text) == ["a --x 1      --y 2", "b '#not a comment'"]


def test_doc_readme_demo(view: Path):
    """`make demo` as written (make test is this suite: .ci/run runs it), its output free of library lines."""
    assert commands(block("readme-demo").text) == ["make demo", "make test"]
    out = sh("make demo", view, environment(growpipe_set=DEMO_FAST), timeout=600)
    assert "al on digits (mlp, 3 blocks, 3 epochs): test accuracy" in out.stdout, out.stdout
    assert json.loads((view / "runs/demo/result.json").read_text())["blocks"] == 3
    assert (view / "runs/demo/checkpoint/manifest.json").is_file() and (view / "runs/mlflow.db").is_file()
    _quiet(out)


def test_doc_data(view: Path):
    outs = run_block(block("data"), view, environment())
    assert "fashion-mnist" in outs[0].stdout and "train 60000, test 10000" in outs[1].stdout, outs[1].stdout
    _quiet(*outs)


def test_doc_partition(view: Path, cluster: str):
    outs = run_block(block("partition"), view, environment(ray_address=cluster))
    assert yaml.safe_load((view / "runs/part.yaml").read_text())["net"]["layers"], outs[0].stdout
    _quiet(*outs)


def test_doc_sweep_file(view: Path, monkeypatch):
    """The sweep file the README of tune_configs/ shows is one `growpipe sweep` accepts."""
    from growpipe.tune.spec import base_raw, check_search_space, load_sweep

    (view / "my-sweep.yaml").write_text(block("sweep-file").text)
    monkeypatch.chdir(view)
    spec = load_sweep(view / "my-sweep.yaml")
    assert spec.name == "my-sweep" and spec.scheduler.name == "asha"
    configs, problems = check_search_space(spec, base_raw(spec))
    assert configs and not problems, problems


def test_doc_running(view: Path, fm: Path, cluster: str):
    """A run on an existing cluster (ADDRESS: this test session's Ray), the rest on their own."""
    address = cluster
    outs = run_block(block("running"), view, environment(), {"ADDRESS": address})
    assert (view / "runs/fm/result.json").is_file() and (view / "runs/fm/ck/manifest.json").is_file()
    joined = re.search(r"^run    (\S+) ", outs[2].stdout, re.M)
    assert joined and json.loads((view / "runs/clusters" / f"{joined[1]}.json").read_text())["address"] == address
    assert json.loads((view / "runs/trace.json").read_text())
    assert (view / "runs/fm/acc.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((view / "runs/news-bar.json").read_text())["accuracy"] > 0
    _quiet(*outs)


def test_doc_resume(view: Path, cluster: str):
    name = unique("resumed")
    tiny = "grow.schedule=[]; data.limit_train=256; data.limit_test=128"
    env = environment(growpipe_set=tiny, ray_address=cluster)
    sh(
        f".venv/bin/growpipe train --config configs/demo.yaml --set name={name} --set train.epochs=17 --runtime local",
        view,
        env,
    )  # the run to resume (in one process: its checkpoints are the same), 3 epochs short of the block's 20
    longer, auto = commands(block("resume").text)[1:]
    outs = run_block(block("resume"), view, env, {"NAME": name}, skip=lambda c: c == auto)
    assert "epoch  20/20" in outs[1].stdout and "epoch  18/20" in outs[1].stdout, outs[1].stdout
    assert "epoch  17/20" not in outs[1].stdout  # it went on after epoch 17: nothing trained twice
    # auto: no checkpoint of that name yet, so it starts (2 of its 12 epochs: the rest is the same command's)
    outs.append(run_command(filled(auto, {"name=mine": f"name={unique('mine')}"}), view,
                            environment(growpipe_set=f"{tiny}; train.epochs=2", ray_address=cluster)))  # fmt: skip
    assert "epoch   1/2" in outs[2].stdout, outs[2].stdout
    _quiet(*outs)


def _glove(home: Path, words: list[str], dim: int = 300) -> None:
    """A GloVe text file (word, then `dim` numbers per line) where the doc says it is."""
    rng = np.random.default_rng(0)
    (home / "glove").mkdir(parents=True)
    lines = [" ".join([w, *(f"{v:.4f}" for v in rng.normal(size=dim))]) for w in words]
    with gzip.open(home / "glove" / "glove.6B.300d.txt.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")


def test_doc_text_models(view: Path, tmp_path: Path):
    """The transformer with pretrained vectors, from a GloVe file written where the page says it is."""
    home = tmp_path / "home"
    _glove(home, ["the", "of", "and", "computer", "god", "car", "game", "space"])
    small = f"{TINY}; data.max_len=64; data.vocab_size=2000"  # the transformer at 736 x 46k words: minutes here
    env = environment({"HOME": str(home)}, growpipe_set=small)  # its own Ray: the stages read ~ of this HOME
    outs = run_block(block("text-models"), view, env)
    assert "scpl on 20newsgroups (transformer" in outs[0].stdout and "word vectors" in outs[0].stdout, outs[0].stdout
    _quiet(*outs)


def test_doc_api_train(view: Path, cluster: str):
    out = python_block(block("api-train"), view, environment(ray_address=cluster))
    printed = re.search(r"^(0\.\d+|1\.0) 3$", out.stdout, re.M)  # test accuracy, depth (grown from 2 to 3)
    assert printed and "'threshold': 0.95" in out.stdout, out.stdout
    _quiet(out)


def test_doc_growth_and_api_grow(view: Path, tmp_path: Path):
    """docs/growth.md's two requests and docs/api.md's growpipe.grow, on one running job."""
    name = unique("grows")
    bands = ("data.feature_groups.scheme=bands", "data.feature_groups.count=4", "grow.max_blocks=5")
    with held_run(view, name, tmp_path / "gate", bands) as run:
        address = json.loads((view / "runs" / "clusters" / f"{name}.json").read_text())["address"]
        outs = run_block(block("growth"), view, environment(), {"NAME": name, "ADDRESS": address})
        outs.append(python_block(block("api-grow"), view, environment(), {"NAME": name}))
        (tmp_path / "gate").touch()
        assert run.wait() == 0, run.output()[-3000:]
    assert f"run {name}: +layer block 2 -> 3 blocks" in outs[0].stdout, outs[0].stdout
    assert f"run {name}: +feature block 3 -> 4 blocks" in outs[1].stdout, outs[1].stdout
    assert "'blocks': 5" in outs[2].stdout and "'kind': 'layer'" in outs[2].stdout, outs[2].stdout
    assert "al on digits (mlp, 5 blocks" in run.output()
    _quiet(*outs)


if __name__ == "__main__":  # the list of blocks and what becomes of each
    for b in all_blocks():
        print(f"{b.where:28} {b.language or '-':7} {b.key or ('not run: ' + b.reason if b.reason else '')}")


@pytest.mark.timeout(1200)
def test_doc_a_running_job_grown_followed_resumed_served_and_its_model(
    view: Path, fm: Path, tmp_path: Path, cluster: str
):
    """The README's everyday commands, docs/serving.md's three sources and its API, docs/tracking.md's model
    blocks: one plain `growpipe train` of run NAME (registered in MLflow) held open while it is grown and a
    follower serves it, then resumed, served from its registered model, and its model loaded and served by
    MLflow; runs/fm/ck served and evaluated."""
    from tests.conftest import text_frames

    name, gate = unique("job"), tmp_path / "gate"
    (tmp_path / "news").mkdir()
    for split, frame in zip(("train", "test"), text_frames(), strict=True):
        frame.to_parquet(tmp_path / "news" / f"{split}.parquet")
    names = {"NAME": name, "DIR": str(tmp_path / "news"), "/ABSOLUTE/PATH": str(view)}
    env = environment({"GROWPIPE_SWEEP_SET": "num_samples=1"})  # the README's sweep on 1 of its 8 trials
    joined = environment({"GROWPIPE_SWEEP_SET": "num_samples=1"}, ray_address=cluster)
    everyday = [filled(c, names) for c in commands(block("readme-everyday").text)]
    sources = [filled(c, names) for c in commands(block("serving").text)]
    assert sources[0] == everyday[7] == f".venv/bin/growpipe serve --run {name} --follow"
    outs = []
    with held_run(view, name, gate, ("tracking.register_model=true",)) as run:
        outs.append(run_command(everyday[1], view, env))  # growpipe grow --run NAME
        assert f"run {name}: +layer block 2 -> 3 blocks" in outs[-1].stdout, outs[-1].stdout
        follow = Background(everyday[7], view, env, tmp_path / "follow.log")
        try:
            wait_until("serve --follow", lambda: answers("http://127.0.0.1:8000/version", follow))
            gate.touch()  # the run goes on: the follower serves each newer checkpoint
            assert run.wait() == 0, run.output()[-3000:]
            last = sorted((view / "runs/checkpoints" / name).glob("ckpt-*"))[-1].name
            wait_until("the follower at the run's last checkpoint", lambda: last in follow.output())
        finally:
            assert follow.stop() in (0, 143, -15), follow.output()[-3000:]
        assert "registered" in run.output() and "Traceback" not in follow.output(), follow.output()[-3000:]
    outs.append(run_command(everyday[2], view, joined))  # train --resume NAME: its newest checkpoint is its end
    for source, check in ((sources[1], "serving-api"), (sources[2], "version")):
        server = Background(source, view, env, tmp_path / "serve.log")
        try:
            wait_until(source, lambda s=server: answers("http://127.0.0.1:8000/version", s))
            if check == "serving-api":
                predicted, version = (json.loads(o.stdout) for o in run_block(block("serving-api"), view, env))
                assert len(predicted["prediction"]) == len(predicted["exit_depth"]) == 1, predicted
                assert predicted["version"] == version["version"] and version["source"].endswith("runs/fm/ck")
            else:
                version = json.loads(sh("curl -s http://127.0.0.1:8000/version", view, env).stdout)["version"]
                assert version["run"] == name and version["blocks"] == 3, version
        finally:
            assert server.stop() in (0, 143, -15), server.output()[-3000:]
        assert "Traceback" not in server.output(), server.output()[-3000:]
    model = python_block([block("tracking-models"), block("tracking-predict")], view, env, names)
    assert name in model.stdout or "m-" in model.stdout, model.stdout
    outs.append(model)
    mlflow_serve = [filled(c, names) for c in commands(block("mlflow-serve").text)]
    assert mlflow_serve[0] == everyday[8]
    for command, request in (
        (mlflow_serve[0], mlflow_serve[1]),
        (commands(block("mlflow-models-serve").text)[0], None),
    ):
        server = Background(filled(command, names), view, env, tmp_path / f"mlflow-{bool(request)}.log")
        try:
            wait_until(command, lambda s=server: answers("http://127.0.0.1:5001/ping", s))
            if request:
                assert len(json.loads(sh(request, view, env).stdout)["predictions"]) == 1
        finally:
            server.stop()
        # its scoring server (a child MLflow starts) may answer a moment longer: the next command's check is its own
        wait_until(f"{command}: port 5001 free", lambda: not answers("http://127.0.0.1:5001/ping"))
        if request:  # growpipe's (the other is MLflow's own command, whose lines are MLflow's)
            assert not library_noise(server.output()), library_noise(server.output())
    outs += run_block(block("readme-everyday"), view, joined, names,
                      skip=lambda c: c in (everyday[1], everyday[2], everyday[7], everyday[8]))  # fmt: skip
    _quiet(*outs)
