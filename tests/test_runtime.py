"""The Ray pipeline on a real local Ray: exactness against the reference trainer, backpressure, failures."""

import threading
import time

import pytest
import ray
import torch

from growpipe.errors import PipelineError
from growpipe.local import train_local
from growpipe.runtime import NAMESPACE
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import deep_merge, tiny_config

pytestmark = pytest.mark.usefixtures("ray_session")


def _small(method: str, window: int, **extra):
    base = {
        "method": method,
        "name": f"exact-{method}-{window}",
        "threads": 1,
        "data": {"limit_train": 320, "batch_size": 32},
        "net": {"width": 32},
        "train": {"epochs": 2},
        "runtime": {"window": window},
    }
    return tiny_config(**deep_merge(base, extra))


def _assert_same_weights(net_a, net_b, atol=0.0):
    for a, b in zip(net_a.state_dict()["blocks"], net_b.state_dict()["blocks"], strict=True):
        assert a["steps"] == b["steps"]
        for k, v in a["modules"].items():
            w = b["modules"][k]
            assert torch.allclose(v, w, atol=atol, rtol=0), f"{k} differs by {(v - w).abs().max():.3g}"
        for name, opt in a["optimizers"].items():
            for pid, st in opt["state"].items():
                for key, val in st.items():
                    if torch.is_tensor(val):
                        assert torch.allclose(val, b["optimizers"][name]["state"][pid][key], atol=atol, rtol=0)


@pytest.mark.parametrize(
    ("method", "window", "read"), [("al", 4, "disk"), ("scpl", 1, "memory"), ("dascpl", 4, "disk")]
)
def test_pipeline_matches_reference_trainer(method, window, read, digits_on_disk):
    """Every rule, each window mode (one packet in flight, several) and each reader (memory, disk)."""
    disk = {"name": digits_on_disk, "image_shape": [1, 8, 8], "stream": True}
    cfg = _small(method, window, **({"data": disk} if read == "disk" else {}))
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    _assert_same_weights(reference.net, net, atol=1e-6)
    assert result["test_accuracy"] == pytest.approx(reference.summary()["test_accuracy"], abs=1e-6)
    assert result["runtime"] == "ray" and len(result["stages"]) == 2


def test_growth_step_on_ray_matches_reference_and_reports_stages():
    cfg = _small("dascpl", 2, grow={"schedule": [{"kind": "layer", "epochs": 1}]})
    reference = train_local(cfg, progress=None)
    lines: list[str] = []
    with Pipeline(cfg) as p:
        result = p.train(progress=lines.append)
        net = p.final_net()
    _assert_same_weights(reference.net, net, atol=1e-6)
    assert result["blocks"] == 3 and result["growth"][0]["kind"] == "layer"
    assert any(line.startswith("grow   +layer block 2 (mlp) -> 3 blocks, stage actor 2") for line in lines)
    stages = result["stages"]
    assert [s["stage"] for s in stages] == [0, 1, 2]
    for s in stages:
        assert 0 < s["utilisation"] <= 1 and s["busy_s"] > 0 and s["samples_per_second"] > 0
    assert result["hop_overhead_ms"] is not None and result["hop_overhead_ms"] >= 0
    events = result["timeline"]["traceEvents"]
    assert {e["tid"] for e in events} == {0, 1} and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


def test_backpressure_keeps_at_most_window_packets_in_flight():
    cfg = _small("scpl", 2)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
    assert all(1 <= s["max_inflight"] <= 2 for s in result["stages"][:-1])
    assert result["stages"][-1]["max_inflight"] == 0


def test_grouped_calls_stay_exact_and_within_the_window():
    # 11 batches: groups of 2 leave one packet that only the end-of-epoch flush sends
    cfg = _small("scpl", 3, data={"limit_train": 352}, net={"blocks": 3}, runtime={"packets_per_call": 2})
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    _assert_same_weights(reference.net, net, atol=1e-6)
    assert all(2 <= s["max_inflight"] <= 3 for s in result["stages"][:-1])
    assert [s["samples"] for s in result["stages"]] == [352 * 2] * 3


def _actor_exists(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def test_failing_block_stops_the_run_with_stage_and_error(monkeypatch):
    monkeypatch.setenv("GROWPIPE_FAULT_AT", "1:3")
    cfg = _small("al", 2, name="failing")
    start = time.perf_counter()
    needle = r"stage 1 \(block 1, ALBlock\) failed: RuntimeError: injected failure"
    with pytest.raises(PipelineError, match=needle), Pipeline(cfg) as p:
        p.train(progress=None)
    assert time.perf_counter() - start < 60
    assert not _actor_exists("failing/stage0") and not _actor_exists("failing/stage1")


def test_killed_stage_fails_the_run_within_seconds():
    cfg = _small("al", 4, name="killed", train={"epochs": 400})
    errors: list[BaseException] = []
    with Pipeline(cfg) as p:
        thread = threading.Thread(target=lambda: _train_catching(p, errors))
        thread.start()
        deadline = time.time() + 120
        while time.time() < deadline and ray.get(p.controller.status.remote())["epoch"] < 1:
            time.sleep(0.2)
        ray.kill(ray.get_actor("killed/stage1", namespace=NAMESPACE))
        killed_at = time.perf_counter()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert time.perf_counter() - killed_at < 10
    assert errors and isinstance(errors[0], PipelineError)
    assert "stage 1 died" in str(errors[0]) or "actor died" in str(errors[0])
    assert not _actor_exists("killed/stage0")


def _train_catching(p: Pipeline, errors: list[BaseException]) -> None:
    try:
        p.train(progress=None)
    except BaseException as e:  # handed to the test thread
        errors.append(e)


def test_stopping_a_run_midway_releases_its_stages_and_cpus():
    cfg = _small("al", 4, name="stopped", train={"epochs": 400})
    before = ray.available_resources().get("CPU", 0)
    errors: list[BaseException] = []
    p = Pipeline(cfg).start()
    thread = threading.Thread(target=lambda: _train_catching(p, errors))
    thread.start()
    deadline = time.time() + 120
    while time.time() < deadline and ray.get(p.controller.status.remote())["epoch"] < 1:
        time.sleep(0.2)
    p.stop()  # as the driver does on an error or Ctrl-C
    thread.join(timeout=60)
    deadline = time.time() + 20
    while time.time() < deadline and ray.available_resources().get("CPU", 0) < before:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == before
    assert not _actor_exists("stopped/stage0") and not _actor_exists("stopped")


def test_stages_go_into_the_bundles_they_are_given_and_growth_takes_the_next():
    from ray.util.placement_group import placement_group, remove_placement_group

    grow = {"schedule": [{"kind": "layer", "epochs": 1}]}
    pg = placement_group([{"CPU": 0.01}, {"CPU": 1}, {"CPU": 1}, {"CPU": 1}])  # like a Tune trial's
    ray.get(pg.ready(), timeout=60)
    try:
        free = ray.available_resources().get("CPU", 0)
        with Pipeline(_small("dascpl", 4, name="reserved", grow=grow), reserved=(pg, 1)) as p:
            result = p.train(progress=None)
        used = [(s["placement_group"], s["bundle"]) for s in result["placement"]]
        assert used == [(pg.id.hex(), b) for b in (1, 2, 3)]
        assert ray.available_resources().get("CPU", 0) == free  # nothing placed outside the reservation
    finally:
        remove_placement_group(pg)

    small = placement_group([{"CPU": 0.01}, {"CPU": 1}, {"CPU": 1}])  # no bundle for the grown block
    ray.get(small.ready(), timeout=60)
    try:
        too_few = Pipeline(_small("dascpl", 4, name="reserved-small", grow=grow), reserved=(small, 1))
        with pytest.raises(PipelineError, match="no reserved bundle left for block 2.*grow.max_blocks"), too_few:
            too_few.train(progress=None)
    finally:
        remove_placement_group(small)


def test_progress_bar_follows_the_running_epoch(monkeypatch):
    import io

    from growpipe.progress import EpochBar

    monkeypatch.setenv("GROWPIPE_STEP_DELAY_MS", "60")  # 22 batches: about 1.3 s per epoch
    stream = io.StringIO()
    bar = EpochBar(stream, active=True)
    with Pipeline(tiny_config(name="bar", threads=1, train={"epochs": 2})) as p:
        p.train(progress=bar.line, bar=bar)
    drawn = stream.getvalue()
    assert "\repoch 1/2 [" in drawn and "\repoch 2/2 [" in drawn and "/22 batches" in drawn
    assert "\r\x1b[Kepoch   1/2 | blocks 2" in drawn  # the bar is cleared before the epoch's log line
    assert drawn.endswith("\n")  # cleared at the end: the summary starts on a clean line
    assert not EpochBar(io.StringIO()).active  # not a terminal: plain lines only
