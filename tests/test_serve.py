"""growpipe serve on a real local Ray: HTTP and handle answers with real early exit, bad requests answered 400
with the server unharmed, and a running run followed through Serve's reconfigure with no failed request."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from growpipe.checkpoint import CheckpointStore, save_net
from growpipe.data.sources import DIGITS_SPLIT, digits_rows
from growpipe.local import train_local
from growpipe.serve.deploy import APP, ServeOptions, follow, replica_status, serve_config
from growpipe.serve.predictor import Predictor
from growpipe.serve.server import start
from growpipe.serve.source import resolve
from tests.conftest import tiny_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def served(ray_session, tmp_path_factory):
    """Serve on the session's Ray for this module; torn down after it."""
    from ray import serve

    yield ServeOptions(port=free_port(), cpus_per_replica=0.5)
    serve.shutdown()


@pytest.fixture(scope="module")
def raw_rows() -> np.ndarray:
    pixels, _ = digits_rows()
    return pixels[np.load(DIGITS_SPLIT)["test"].astype(np.int64)][:40] / 16.0


def test_http_and_handle_answer_with_the_nets_early_exit_and_bad_requests_get_400(served, raw_rows, tmp_path):
    from ray import serve

    cfg = tiny_config(method="dascpl", name="one", net={"blocks": 3})
    run = train_local(cfg, progress=None)
    ck = save_net(tmp_path / "ck", run.net, cfg, run.result)
    source = resolve(None, str(ck), None, str(tmp_path), None)
    status = start(source, served)
    assert status["version"]["blocks"] == 3
    url = f"http://127.0.0.1:{served.port}/predict"
    local = Predictor.load(ck)
    threshold = float(np.median(local.predict(raw_rows, 0.0)["confidence"]))  # about half leave at exit 1
    code, answer = post(url, json.dumps({"inputs": raw_rows.tolist(), "threshold": threshold}).encode())
    assert code == 200
    assert answer == json.loads(json.dumps(local.predict(raw_rows, threshold))), "the replica answers as the net does"
    assert min(answer["exit_depth"]) < 3, "confident samples left before the last block"
    handle = serve.get_app_handle(APP)
    full = handle.predict.remote({"inputs": raw_rows[:5].tolist()}).result(timeout_s=60)
    assert full["exit_depth"] == [3] * 5 and full["version"] == {"run": "one", "checkpoint": "ck", "epoch": 1,
                                                                 "blocks": 3}  # fmt: skip
    big = np.tile(raw_rows, (30, 1))  # 1,200 rows: more than one batch holds, answered as a batch of its own
    assert handle.predict.remote({"inputs": big.tolist()}).result(timeout_s=60)["exit_depth"] == [3] * len(big)
    for body, field in [(b"{oops", "body"), (b'{"inputs": [[1, 2]]}', "inputs"),
                        (b'{"inputs": [[0]], "threshold": -0.1}', "threshold"),
                        (b'{"inputs": [[0]], "confidence": "vibes"}', "confidence")]:  # fmt: skip
        code, err = post(url, body)
        assert code == 400 and err["error"].startswith(f"{field}:"), (body, err)
    assert post(url, json.dumps({"inputs": raw_rows[:2].tolist()}).encode())[0] == 200, "the server is unharmed"


def test_following_a_growing_run_serves_every_checkpoint_in_place_with_no_failed_request(served, raw_rows, tmp_path):
    """A real run (reference trainer, the default checkpointing: every epoch, keep 2; two growths) is followed
    while four clients send requests without pause. Serving starts at the run's first checkpoint, held by a
    claim, while the run goes on unhindered past two more checkpoints (which prune everything older but what
    is claimed): the first replica still loads it. From then on the run holds at each checkpoint until answers
    carry it (a gate, not a bet on speed); a damaged checkpoint is skipped and the version before it keeps
    answering; the claims are withdrawn at the end."""
    from dataclasses import replace

    from growpipe.serve.deploy import Claims

    ck_uri = tmp_path / "checkpoints"
    cfg = tiny_config(method="dascpl", name="growing", train={"epochs": 2},
                      checkpoint={"enabled": True, "uri": str(ck_uri), "every_epochs": 1},
                      grow={"schedule": [{"kind": "layer", "epochs": 1}, {"kind": "layer", "epochs": 1}]})  # fmt: skip
    assert cfg.checkpoint.keep == 2
    store = CheckpointStore(str(ck_uri), "growing")
    claims = Claims(store)
    stop, lines, answers, failures, started, written = threading.Event(), [], [], [], [], []
    url = f"http://127.0.0.1:{served.port}/predict"
    body = json.dumps({"inputs": raw_rows[:8].tolist()}).encode()
    threads: list[threading.Thread] = []

    def client() -> None:
        while not stop.is_set():
            try:
                code, answer = post(url, body)
            except OSError as e:  # a refused or dropped connection is a failed request too
                failures.append(repr(e))
                continue
            (answers if code == 200 else failures).append(answer)

    clients = [threading.Thread(target=client) for _ in range(4)]

    def serve_and_follow(source) -> None:
        """What serve --run --follow does once Ray is up: deploy the held checkpoint, then follow the run."""
        try:
            started.append(start(source, served, claims=claims, say=lines.append))
        except Exception as e:  # said to the gate below, which fails the test with it
            started.append(e)
            return
        for t in clients:
            t.start()
        while not answers and not failures and not stop.is_set():  # answers of the first version, then follow
            time.sleep(0.01)
        follow(replace(source, ref=started[0]["source"]), served, lines.append, 0.1, stop.is_set, claims=claims)

    def served_now(ckpt: str, deadline_s: float = 180.0) -> None:
        """The gate: hold the run until answers carry checkpoint `ckpt` (fails after a generous deadline)."""
        end = time.monotonic() + deadline_s
        while not any(a["version"]["checkpoint"] == ckpt for a in answers[-8:]):
            assert not (started and isinstance(started[0], Exception)), started
            assert time.monotonic() < end, f"{ckpt} not served; follower said {lines}"
            time.sleep(0.05)

    def on_line(line: str) -> None:
        if not line.startswith("ckpt   ckpt-"):
            return
        written.append(line.split()[1])
        if len(written) == 1:  # the run's first checkpoint: hold it, serve it, follow the run; the run goes on
            source = resolve("growing", None, None, str(ck_uri), None)
            assert claims.hold(source.ref)
            threads.append(threading.Thread(target=serve_and_follow, args=(source,)))
            threads[0].start()
        elif len(written) > cfg.checkpoint.keep:  # the first one is past `keep`: from here the run waits for each
            served_now(written[-1])

    try:
        train_local(cfg, progress=on_line)
        assert started[0]["version"]["checkpoint"] == written[0], "the first replica loaded what was held"
        newest = store.latest()
        assert newest is not None
        # a damaged checkpoint after the newest: skipped with a line; the newest keeps answering
        bad = Path(store.dir_for(newest.epoch + 1, 0, newest.seq + 1))
        bad.mkdir()
        manifest = json.loads((Path(newest.path) / "manifest.json").read_text())
        for shard in manifest["shards"]:
            (bad / shard["file"]).write_bytes(b"not a shard")
        (bad / "manifest.json").write_text(json.dumps({**manifest, "epoch": newest.epoch + 1}))
        end = time.monotonic() + 60
        while not any(line.startswith("skip") for line in lines):
            assert time.monotonic() < end, lines
            time.sleep(0.05)
        served_now(Path(newest.path).name)
    finally:
        stop.set()
        for t in threads + [c for c in clients if c.ident]:  # the clients that started
            t.join(timeout=120)
        claims.close()
    assert failures == [], failures[:3]
    assert {a["version"]["blocks"] for a in answers} == {2, 3, 4}, "answered before and after each growth"
    for a in answers:
        assert max(a["exit_depth"]) == a["version"]["blocks"], "each answer wholly from the version it names"
    assert replica_status()["source"] == newest.path
    assert [line for line in lines if line.startswith("skip")] == [next(li for li in lines if bad.name in li)], lines
    assert list(ck_uri.rglob(".claim-*")) == [], "no claim outlives the server"


@pytest.mark.parametrize("method", ["dascpl", "al"])
def test_block_groups_answer_as_the_whole_net_does_each_holding_its_own_blocks(served, raw_rows, tmp_path, method):
    """--stages 2 on a 3-block net: groups of blocks {0, 1} and {2}, chained by handles; the answers equal the
    whole net's at a threshold where some rows leave in the first group and some go on (AL: group 1 decodes
    its exit through block 0's and 1's decoders)."""
    from dataclasses import replace

    from growpipe.serve.groups import BlockGroupNet, group_blocks

    assert [list(group_blocks(3, 2, i)) for i in range(2)] == [[0, 1], [2]]
    assert [list(group_blocks(1, 3, i)) for i in range(3)] == [[0], [], []]
    cfg = tiny_config(method=method, name=f"groups-{method}", net={"blocks": 3})
    run = train_local(cfg, progress=None)
    ck = save_net(tmp_path / "ck", run.net, cfg, run.result)
    local = Predictor.load(ck)
    threshold = float(np.median(local.predict(raw_rows, 0.0)["confidence"]))
    expected = local.predict(raw_rows, threshold)
    assert 1 in expected["exit_depth"] and 3 in expected["exit_depth"]
    group = BlockGroupNet.load(ck, 2, 1)
    assert [b.index for b in group.blocks] == [2] and len(group.below) == (2 if method == "al" else 0)
    start(resolve(None, str(ck), None, str(tmp_path), None), replace(served, stages=2))
    code, answer = post(f"http://127.0.0.1:{served.port}/predict",
                        json.dumps({"inputs": raw_rows.tolist(), "threshold": threshold}).encode())  # fmt: skip
    assert code == 200
    assert answer["prediction"] == expected["prediction"] and answer["exit_depth"] == expected["exit_depth"]
    assert np.allclose(answer["confidence"], expected["confidence"], atol=1e-5)


def test_a_registered_mlflow_model_is_served_by_its_version_as_its_checkpoint_is(served, raw_rows, tmp_path):
    """--model models:/NAME/1: the replica downloads the run's LoggedModel and answers from the checkpoint in it,
    as the same net loaded here does."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "workdir": str(tmp_path), "register_model": True}
    cfg = tiny_config(method="dascpl", name="registered", tracking=tracking)
    run = train_local(cfg, progress=None)
    source = resolve(None, None, "models:/registered/1", str(tmp_path), uri)
    status = start(source, served)
    assert status["version"]["run"] == "registered" and status["source"] == "models:/registered/1"
    expected = Predictor.load(save_net(tmp_path / "ck", run.net, cfg, run.result)).predict(raw_rows)
    code, answer = post(f"http://127.0.0.1:{served.port}/predict", json.dumps({"inputs": raw_rows.tolist()}).encode())
    assert code == 200
    assert (answer["prediction"], answer["exit_depth"]) == (expected["prediction"], expected["exit_depth"])


def test_replicas_that_cannot_be_placed_are_one_line_naming_what_to_compare(served, tmp_path, monkeypatch):
    from dataclasses import replace

    from growpipe.errors import PipelineError
    from growpipe.serve import server

    def no_drain(source, options) -> dict:
        """The application as deployed but for how long Serve waits for a replica it stops to drain: Serve asks
        even a replica that never started to shut down gracefully and kills it only after that wait (20 s by
        default), which the module's serve.shutdown() would sit through for nothing."""
        config = serve_config(source, options)
        for deployment in config["applications"][0]["deployments"]:
            deployment["graceful_shutdown_timeout_s"] = 0.5
        return config

    monkeypatch.setattr(server, "serve_config", no_drain)
    cfg = tiny_config(method="dascpl", name="unplaced")
    run = train_local(cfg, progress=None)
    ck = save_net(tmp_path / "ck", run.net, cfg, run.result)
    too_big = replace(served, cpus_per_replica=64.0)  # more than the session's Ray has: it never starts
    with pytest.raises(PipelineError, match=r"no replica served .* within 3 s .* compare --cpus x --replicas"):
        start(resolve(None, str(ck), None, str(tmp_path), None), too_big, timeout_s=3)
