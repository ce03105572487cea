"""Growing a running job on a real local Ray: requests from outside, refusals, policies, the pause."""

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest
import ray

from growpipe.config import build_config
from growpipe.errors import PipelineError
from growpipe.growth import GrowthPlan
from growpipe.local import train_local
from growpipe.runtime.client import request_growth
from growpipe.runtime.cluster_record import record_cluster
from growpipe.runtime.pipeline import Pipeline
from growpipe.runtime.placement import stage_env
from growpipe.runtime.stage import Stage
from tests.conftest import assert_same_weights, tiny_config

pytestmark = pytest.mark.usefixtures("ray_session")

BATCH = 32
HOLD = 5  # the batch a held epoch waits before


def _slow_run(name: str, epochs: int):
    # no prefix cache: every stage sees every packet from the moment it joins (the cache has its own tests)
    return tiny_config(
        name=name,
        method="dascpl",
        threads=1,
        data={"batch_size": BATCH, "limit_train": 640},
        train={"epochs": epochs},
        grow={"max_blocks": 6, "cache": {"enabled": False}},
    )


class _Background:
    """p.train() in a thread, its progress lines and result (or error) kept for the test."""

    def __init__(self, p: Pipeline):
        self.lines: list[str] = []
        self.errors: list[BaseException] = []
        self.results: list[dict] = []
        self.thread = threading.Thread(target=self._run, args=(p,))
        self.thread.start()

    def _run(self, p: Pipeline) -> None:
        try:
            self.results.append(p.train(progress=self.lines.append))
        except BaseException as e:  # handed to the test thread
            self.errors.append(e)

    def result(self, timeout: float = 180) -> dict:
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive() and not self.errors, self.errors
        return self.results[0]


def _wait_for_epoch(p: Pipeline, epoch: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while ray.get(p.controller.status.remote())["epoch"] < epoch:
        assert time.time() < deadline, "the run did not reach the epoch in time"
        time.sleep(0.1)


def test_requests_grow_a_running_job_one_at_a_time_bad_ones_change_nothing_a_finished_one_refuses(
    monkeypatch, tmp_path
):
    """Two requests at once, one from Python (request_growth) and one from `growpipe grow` in another
    process, find the job by its name on the cluster; bad ones are answered at once and change nothing."""
    import re
    import subprocess
    import sys

    # stage 0 holds before batch HOLD of epoch 1 until a grow request is ready (or the gate file exists), so
    # both requests land mid-epoch however long placement takes on a loaded machine
    gate = tmp_path / "gate"
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"1:{HOLD}:{gate}")
    epochs = 2
    cfg = _slow_run("growing", epochs=epochs)
    address = ray.get_runtime_context().gcs_address
    cli = [sys.executable, "-m", "growpipe.cli", "grow", "--address", address, "--run"]
    # what growpipe.train records when a run starts on Ray: `growpipe grow` without --address asks that cluster
    record_cluster(Path(os.environ["GROWPIPE_WORKDIR"]) / "runs", "growing", address)
    # nor RAY_AUTH_MODE: the record says the cluster uses token authentication, as a plain `growpipe train` does
    unaddressed = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    with Pipeline(cfg) as p:
        run = _Background(p)
        _wait_for_epoch(p, 1)
        answers: list[dict] = []
        done: dict[str, subprocess.CompletedProcess] = {}
        askers = [
            threading.Thread(target=lambda: answers.append(request_growth("growing", {"kind": "layer", "width": 48}))),
            threading.Thread(target=lambda: done.setdefault("ok", subprocess.run(
                [*cli[:4], "--run", "growing", "--spec", "{kind: layer, width: 40, input_size: null}"],
                capture_output=True, text=True, timeout=120, env=unaddressed))),
            threading.Thread(target=lambda: done.setdefault("missing", subprocess.run(
                [*cli, "nosuch"], capture_output=True, text=True, timeout=120))),
        ]  # fmt: skip
        for t in askers:
            t.start()
        bad = [
            ({"kind": "layer", "input_size": 7}, "input_size 7 does not match block 1's output"),
            ({"kind": "feature", "group": "chunk9"}, "unknown feature group 'chunk9'"),
            ({"kind": "layr"}, "kind"),
        ]
        for request, needle in bad:  # answered at once, while the good ones are being served
            with pytest.raises(PipelineError, match=needle):
                request_growth("growing", request)
        for t in askers:
            t.join(timeout=120)
        gate.touch()  # both served: let the epoch go on
        result = run.result()
        net = p.final_net()
        with pytest.raises(PipelineError, match="run 'growing' has finished; nothing to grow"):
            request_growth("growing", {"kind": "layer"})  # its controller still answers
    ok, missing = done["ok"], done["missing"]
    assert ok.returncode == 0 and not ok.stderr.strip(), ok.stderr  # no refused tokens, no library lines
    assert f"grow   asking run growing on cluster {address} (recorded when the run started, " in ok.stdout, ok.stdout
    answered = r"run growing: \+layer block (\d) -> \d blocks, stage actor growing@[0-9a-f]{8}/stage\d"  # RUN@ATTEMPT
    cli_block = re.search(answered, ok.stdout)
    assert cli_block, ok.stdout
    assert missing.returncode == 2 and "no run named 'nosuch' on this cluster (running: growing)" in missing.stderr
    assert f"asked the Ray cluster at {address} (--address {address}): choose another with --address" in missing.stderr
    # one after the other, never both on block 1
    assert sorted([answers[0]["block"], int(cli_block.group(1))]) == [2, 3]
    cli_answer = json.loads(ok.stdout.strip().splitlines()[-1])
    first = next(a for a in [answers[0], cli_answer] if a["block"] == 2)
    # whether block 2's actor was started ahead (grow.standby) depends on the room the session's Ray had then:
    # the answer says which, the decision itself is tested without Ray (test_loop)
    assert isinstance(first["standby"], bool)
    assert [g["blocks"] for g in result["growth"]] == [3, 4] and result["blocks"] == 4
    assert all(g["source"] == "request" for g in result["growth"])
    # mid-epoch: the pipeline paused before batch HOLD, grew, resumed there and paused again for the second
    assert [(g["epoch"], g["batch"]) for g in result["growth"]] == [(0, HOLD), (0, HOLD)]
    with pytest.raises(PipelineError, match="no run named 'growing'"):
        request_growth("growing", {"kind": "layer"})
    # no packet lost: every stage saw every batch from the moment it joined, the earlier stages all of them
    per_epoch = 640
    stages = {s["stage"]: s for s in result["stages"]}
    assert stages[0]["samples"] == stages[1]["samples"] == epochs * per_epoch
    for event in result["growth"]:
        joined = event["epoch"] * per_epoch + (event["batch"] or 0) * BATCH
        assert stages[event["block"]]["samples"] == epochs * per_epoch - joined
    # the frozen blocks stopped learning when the first block was appended
    first = result["growth"][0]
    steps_before = first["epoch"] * math.ceil(per_epoch / BATCH) + (first["batch"] or 0)
    assert [b.steps for b in net.blocks[:2]] == [steps_before, steps_before]
    assert net.blocks[2].frozen and not net.blocks[3].frozen
    assert sorted(b.spec.encoder.params["width"] for b in net.blocks[2:]) == [40, 48]
    assert any(line.startswith("grow   +layer block 3") for line in run.lines)


def test_stage_zero_pauses_before_its_next_batch_and_resumes_there(tmp_path):
    cfg = tiny_config(threads=1, data={"batch_size": BATCH, "limit_train": 640})
    gate = tmp_path / "gate"
    hold = {"GROWPIPE_HOLD_AT": f"1:{HOLD}:{gate}"}  # epoch 1 waits before batch HOLD for a pause (or the gate)
    actor = ray.remote(concurrency_groups=Stage.CONCURRENCY_GROUPS)(Stage).options(
        num_cpus=1, runtime_env={"env_vars": {**stage_env(), **hold}}
    )
    stage = actor.remote(0, cfg)
    info, _ = ray.get(stage.load_data.remote())
    from growpipe.nn.net import plan_blocks

    ray.get(stage.setup.remote(plan_blocks(cfg.net, cfg.rule(), info)[0], info))
    ref = stage.run_epoch.remote(1, ())
    while ray.get(stage.position.remote(), timeout=30)[0] < HOLD:  # until it waits at the gate
        time.sleep(0.05)
    ray.get(stage.request_pause.remote(), timeout=30)  # answered while run_epoch is busy
    first, paused_at = ray.get(ref, timeout=30)
    assert paused_at == HOLD and first.batches == HOLD
    gate.touch()  # the rest of the epoch goes on past the gate
    rest, rest_paused_at = ray.get(stage.run_epoch.remote(1, (), paused_at), timeout=30)
    assert rest_paused_at is None and first.batches + rest.batches == 20
    # the engine numbers its calls: a pause for call 7 that arrives before that call starts is kept (it has a
    # concurrency group of its own); one that arrives after call 7 ended does not stop call 8
    ray.get(stage.request_pause.remote(7), timeout=30)
    early, early_paused_at = ray.get(stage.run_epoch.remote(2, (), 3, None, 7), timeout=30)
    assert early_paused_at == 3 and early.batches == 0
    ray.get(stage.request_pause.remote(7), timeout=30)
    late, late_paused_at = ray.get(stage.run_epoch.remote(2, (), 3, None, 8), timeout=30)
    assert late_paused_at is None and late.batches == 17
    ray.kill(stage)


@pytest.mark.parametrize("grow", [{"every_epochs": 1, "max_blocks": 4}])
def test_every_epochs_grows_the_same_on_ray_as_in_the_reference(grow):
    cfg = tiny_config(name="every", method="scpl", threads=1, train={"epochs": 3}, grow=grow)
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert [g["epoch"] for g in result["growth"]] == [1, 2] == [g["epoch"] for g in reference.growth]
    assert result["blocks"] == 4
    assert_same_weights(reference.net, net, atol=1e-6)


def _rows(vals: list[float]) -> list[dict]:
    return [{"epoch": i + 1, "test_accuracy": v, "val_accuracy": v} for i, v in enumerate(vals)]


def test_on_plateau_grows_after_patience_epochs_without_improvement():
    cfg = build_config(
        {
            "data": {"val_fraction": 0.1},
            "train": {"epochs": 10},
            "grow": {"on_plateau": {"patience": 2, "min_delta": 0.01}, "max_blocks": 3},
        }
    )
    plan = GrowthPlan(cfg)
    assert plan.due(2, _rows([0.5, 0.6]), 2) == []
    assert plan.due(3, _rows([0.5, 0.6, 0.605]), 2) == []  # only one epoch without improvement
    assert len(plan.due(4, _rows([0.5, 0.6, 0.605, 0.6]), 2)) == 1
    plan.grew(4)
    assert plan.due(5, _rows([0.5, 0.6, 0.605, 0.6, 0.6]), 3) == []  # at max_blocks
    assert plan.due(6, _rows([0.5, 0.6, 0.605, 0.6, 0.6, 0.6]), 2) == []  # counts from the growth again


def test_on_plateau_runs_in_the_reference_trainer_on_a_validation_split():
    cfg = tiny_config(
        data={"val_fraction": 0.2},
        train={"epochs": 8, "lr": 1e-5},  # barely learns: a plateau at once
        grow={"on_plateau": {"patience": 1, "min_delta": 0.05}, "max_blocks": 3},
    )
    result = train_local(cfg, progress=None)
    assert all(h["val_accuracy"] is not None for h in result.history)
    assert result.net.depth == 3 and [g["source"] for g in result.growth] == ["on_plateau"]


def test_prefix_cache_trains_the_new_block_like_the_reference_while_frozen_stages_idle():
    """AL (its packets carry the label codes too) grown by a layer, then by a feature group."""
    steps = [{"kind": "layer", "epochs": 2}, {"kind": "feature", "group": "band1", "epochs": 2}]
    cfg = tiny_config(name="cache-al", method="al", threads=1, train={"epochs": 1}, grow={"schedule": steps},
                      data={"feature_groups": {"scheme": "bands", "count": 2, "base": 1}})  # fmt: skip
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-5)
    assert [(c["epoch"], c["block"]) for c in result["prefix_caches"]] == [(1, 2), (3, 3)]
    assert all("in memory" in c["where"] for c in result["prefix_caches"])
    n = len(reference.bundle.train)
    samples = {s["stage"]: s["samples"] for s in result["stages"]}
    # stage 0 streams epoch 1 and the two cache passes' epochs from the data, then only the passes
    assert samples == {0: n, 1: n, 2: 2 * n, 3: 2 * n}
    assert result["frozen_unchanged"] is True and reference.summary()["frozen_unchanged"] is True


def test_prefix_cache_spills_to_disk_past_its_memory_bound(tmp_path):
    """Past grow.cache.max_memory_mb the cache goes to disk, removed with its stage (without spill it is
    refused: test_prefix_cache; a stage's error reaching the driver: test_runtime)."""
    grow = {"schedule": [{"kind": "layer", "epochs": 1}], "cache": {"max_memory_mb": 0.01, "spill_dir": str(tmp_path)}}
    cfg = tiny_config(name="spill", threads=1, grow=grow)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
    assert f"on disk in {tmp_path}" in result["prefix_caches"][0]["where"]
    assert not list(tmp_path.iterdir())  # removed with the stage


def test_growth_waits_for_capacity_then_gives_up_clearly_and_the_run_goes_on(monkeypatch, tmp_path):
    """Constrained local Ray: a placement group holds the free CPUs. A request waits up to
    runtime.placement_timeout_s for them (as for an autoscaler), is refused past it while the run goes on,
    and a later one succeeds when the CPUs come back during its wait."""
    from ray.util.placement_group import placement_group, remove_placement_group

    gate = tmp_path / "gate"  # epoch 1 stays open until the test is done asking (or a request is ready)
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"1:{HOLD}:{gate}")
    cfg = _slow_run("capacity", epochs=3).model_copy(deep=True)
    cfg.runtime.placement_timeout_s = 3.0
    cfg.grow.standby = "never"  # a standby would hold the room this test takes away
    with Pipeline(cfg) as p:
        run = _Background(p)
        _wait_for_epoch(p, 1)
        free = int(ray.available_resources().get("CPU", 0))
        hog = placement_group([{"CPU": 1}] * free)
        ray.get(hog.ready(), timeout=30)
        t0 = time.time()
        with pytest.raises(PipelineError, match=r"cannot place 1 stage\(s\).*placement_timeout_s=3s"):
            request_growth("capacity", {"kind": "layer"})
        assert time.time() - t0 >= 3.0  # it waited for capacity first
        assert ray.get(p.controller.status.remote())["state"] == "training"  # the run goes on
        threading.Timer(1.5, remove_placement_group, args=(hog,)).start()  # capacity comes while it waits
        answer = request_growth("capacity", {"kind": "layer"})
        gate.touch()
        result = run.result()
    assert answer["block"] == 2 and answer["batch"] == HOLD
    assert result["blocks"] == 3 and result["epochs"] == 3 and len(result["growth"]) == 1
    assert any("request refused: cannot place" in line for line in run.lines)


def test_without_capacity_a_new_block_is_packed_into_the_last_stage_and_trains_the_same():
    """grow.on_no_capacity: pack. No CPU is free for the grown block's stage, so after the placement wait
    the block runs in the last stage's actor, after that stage's own block; the maths is unchanged, so the
    weights still match the reference trainer."""
    from ray.util.placement_group import placement_group, remove_placement_group

    cfg = tiny_config(
        name="packed", method="dascpl", threads=1, train={"epochs": 2},
        grow={"schedule": [{"kind": "layer", "epochs": 1}, {"kind": "layer", "epochs": 1}], "on_no_capacity": "pack"},
        runtime={"placement_timeout_s": 2.0},
    )  # fmt: skip
    reference = train_local(cfg, progress=None)
    before = ray.available_resources().get("CPU", 0)
    hog = placement_group([{"CPU": 1}] * int(before - 2))  # room for the first two stages only
    ray.get(hog.ready(), timeout=30)
    lines: list[str] = []
    try:
        with Pipeline(cfg) as p:
            result = p.train(progress=lines.append)
            net = p.final_net()
    finally:
        remove_placement_group(hog)
    assert result["blocks"] == 4 and [g["blocks"] for g in result["growth"]] == [3, 4]
    assert [s["packed_into"] for s in result["placement"]] == [None, None, 1, 1]
    assert sum("grow.on_no_capacity=pack: block" in line for line in lines) == 2
    assert set(result["history"][-2]["loss"]) == {"b2.supcon", "b2.ce"}  # the packed blocks' own losses
    assert set(result["history"][-1]["loss"]) == {"b3.supcon", "b3.ce"}
    assert_same_weights(reference.net, net, atol=1e-6)
