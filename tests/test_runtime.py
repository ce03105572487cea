"""The Ray pipeline on a real local Ray: exactness against the reference trainer, backpressure, failures."""

import time

import pytest
import ray

from growpipe.errors import InputError, PipelineError
from growpipe.local import train_local
from growpipe.runtime.names import controller_name, run_of, stage_actor_name
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import assert_same_weights, deep_merge, pipeline_matches_reference, run_actors, tiny_config
from tests.docs_run import wait_until

pytestmark = pytest.mark.usefixtures("ray_session")


def _small(method: str, window: int, **extra):
    base = {
        "method": method,
        "name": f"exact-{method}-{window}",
        "threads": 1,
        "data": {"limit_train": 320, "batch_size": 32},
        "net": {"width": 32},
        "train": {"epochs": 2},
        "pipeline": {"window": window},
    }
    return tiny_config(**deep_merge(base, extra))


@pytest.mark.parametrize(
    ("method", "window", "read", "precision", "grad_clip"),
    [("al", 4, "disk", "fp32", 0.1), ("scpl", 1, "memory", "bf16", 2.0), ("dascpl", 4, "disk", "fp32", None)],
)
def test_pipeline_matches_reference_trainer(method, window, read, precision, grad_clip, digits_on_disk, monkeypatch):
    """Every rule, each window mode (one packet in flight, several), each reader (memory, disk) and each
    precision (bf16: autocast, activations crossing the hops in bfloat16); at most `window` packets in flight
    between two stages; gradient clipping (AL's two parts apart; bf16's fp32 gradients), at norms these
    blocks' gradients pass in about half (AL) and most (SCPL) of the steps. The evaluation streams through
    the stages (no actor builds a block it was not given) and reports what the reference trainer's does,
    early exit included. DASCPL's blocks warm up and decay their rates (train.lr_schedule) on their own steps."""
    monkeypatch.setenv("GROWPIPE_OWN_BLOCKS_ONLY", "1")
    disk = {"name": digits_on_disk, "image_shape": [1, 8, 8], "stream": True}
    train = {"precision": precision, "grad_clip": grad_clip}
    if method == "dascpl":
        train["lr_schedule"] = {"warmup_steps": 4, "decay": "cosine", "decay_steps": 12, "min_factor": 0.1}
    # early exit at a threshold of the table (nets this small seldom earn the automatic choice)
    cfg = _small(
        method, window, train=train, eval={"exit_threshold": 0.7}, **({"data": disk} if read == "disk" else {})
    )
    result, ref = pipeline_matches_reference(cfg)
    assert result["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-6)
    assert result["exit_accuracy"] == pytest.approx(ref["exit_accuracy"], abs=1e-6)
    assert [r["accuracy"] for r in result["adaptive"]] == pytest.approx([r["accuracy"] for r in ref["adaptive"]])
    early, ref_early = result["early_exit"], ref["early_exit"]
    assert (early["threshold"], early["accuracy"], early["mean_depth"]) == pytest.approx(
        (ref_early["threshold"], ref_early["accuracy"], ref_early["mean_depth"]))  # fmt: skip
    assert early["seconds_per_sample"] > 0 and early["full_path_seconds_per_sample"] > 0
    row = next(r for r in result["adaptive"] if r["threshold"] == early["threshold"])  # the accounting agrees
    accounted = (row["mean_depth"], row["macs_saved_fraction"])
    assert (early["mean_depth"], early["macs_saved_fraction"]) == pytest.approx(accounted)
    assert result["runtime"] == "ray" and len(result["stages"]) == 2
    assert 1 <= result["stages"][0]["max_inflight"] <= window and result["stages"][-1]["max_inflight"] == 0


def test_grouped_calls_stay_exact_and_within_the_window():
    # 11 batches: groups of 2 leave one packet that only the end-of-epoch flush sends
    cfg = _small("scpl", 3, data={"limit_train": 352}, net={"blocks": 3}, pipeline={"packets_per_call": 2})
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    assert all(2 <= s["max_inflight"] <= 3 for s in result["stages"][:-1])
    assert [s["samples"] for s in result["stages"]] == [352 * 2] * 3


def test_failing_block_stops_the_run_with_stage_and_error(monkeypatch):
    monkeypatch.setenv("GROWPIPE_FAULT_AT", "1:3")
    cfg = _small("al", 2, name="failing")
    start = time.perf_counter()
    needle = r"stage 1 \(block 1, ALBlock\) failed: RuntimeError: injected failure"
    with pytest.raises(PipelineError, match=needle), Pipeline(cfg) as p:
        p.train(progress=None)
    assert time.perf_counter() - start < 60
    assert run_actors("failing") == []


def test_a_live_run_keeps_its_name_and_a_stopped_one_leaves_it_free_at_once():
    """A controller is named RUN@ATTEMPT: a second run of a name whose run is alive is refused; once stop()
    returned, the controller has exited on its own and nothing of the run is left that a next run of the name
    would wait for (Ray may keep an exited actor's name while a handle to it lives: a new attempt never asks
    for it)."""
    assert run_of(controller_name("r.1")) == "r.1" and controller_name("r") != controller_name("r")
    assert run_of(stage_actor_name(controller_name("r"), 0)) is None and run_of("r") is None
    first = Pipeline(_small("al", 2, name="twice")).start()
    with pytest.raises(InputError, match="a run named 'twice' is already running"):
        Pipeline(_small("al", 2, name="twice")).start()
    handle = first.controller
    first.stop()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(handle.status.remote(), timeout=30)  # close() was the driver's last call: it exited
    assert run_actors("twice") == []  # so Pipeline.start would launch twice@ANOTHER at once


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
        # nothing placed outside the reservation: Ray's resource view returns the ended stages' bundles a little
        # after they exit (a loaded CI run read 0.99 CPU of 4 right after the run), so poll it
        wait_until(
            "the CPUs outside the reservation free again", lambda: ray.available_resources().get("CPU", 0) == free, 60
        )
    finally:
        remove_placement_group(pg)

    small = placement_group([{"CPU": 0.01}, {"CPU": 1}, {"CPU": 1}])  # no bundle for the grown block
    try:
        too_few = Pipeline(_small("dascpl", 4, name="reserved-small", grow=grow), reserved=(small, 1))
        needle = r"reserved: the placement group has 2 bundle\(s\) from bundle 1 on, for a run of up to 3 blocks"
        with pytest.raises(InputError, match=needle):  # before anything starts
            too_few.train(progress=None)
        assert too_few.controller is None
    finally:  # a failed assertion must not leave CPUs held for the tests after this one
        remove_placement_group(small)
