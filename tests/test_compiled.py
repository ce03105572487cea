"""pipeline.transport compiled (runtime/compiled.py): the local-learning pipeline as a Ray Compiled Graph ends
with the reference trainer's weights and figures through a growth (which compiles the graph again), and a
failing step stops the run with the stage's error. Recovery: tests/test_recovery.py."""

import pytest

from growpipe.errors import PipelineError
from growpipe.runtime.pipeline import Pipeline
from growpipe.runtime.transport import resolve
from tests.conftest import pipeline_matches_reference, run_actors, tiny_config


def _cfg(name: str, method: str, **extra):
    return tiny_config(name=name, method=method, threads=1, data={"limit_train": 320, "batch_size": 32},
                       net={"width": 32}, pipeline={"transport": "compiled", "window": 3}, **extra)  # fmt: skip


def test_compiled_is_the_local_rules_transport_only():
    assert resolve("compiled", "dascpl", "auto", 1) == "compiled"
    assert resolve("compiled", "bp", "auto", 0) == "object_store"  # BP's engines hand gradients back


@pytest.mark.usefixtures("ray_session")
def test_compiled_pipeline_matches_the_reference_trainer_through_growth_and_early_exit():
    """DASCPL, 2 blocks grown to 3 (no prefix cache: with one, evaluation takes the object-store path):
    training and evaluation (every exit, and real early exit) go through the graph; the growth compiles it
    again over 3 actors."""
    grow = {"every_epochs": 1, "max_blocks": 3, "cache": {"enabled": False}}
    cfg = _cfg("compiled-grow", "dascpl", train={"epochs": 2}, grow=grow, eval={"exit_threshold": 0.7})
    result, ref = pipeline_matches_reference(cfg)
    assert result["blocks"] == 3
    assert result["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-6)
    assert result["exit_accuracy"] == pytest.approx(ref["exit_accuracy"], abs=1e-6)
    early, ref_early = result["early_exit"], ref["early_exit"]
    assert (early["accuracy"], early["mean_depth"]) == pytest.approx((ref_early["accuracy"], ref_early["mean_depth"]))
    t = result["transport"]
    assert t["backend"] == "compiled" and t["graphs_compiled"] == len(t["compile_s"]) == 2
    assert result["history"][0]["test_accuracy"] == pytest.approx(ref["history"][0]["test_accuracy"], abs=1e-6)
    assert result["hop_overhead_ms"] is not None  # the later stages time each hand-off, as on the push path
    assert [s["samples"] for s in result["stages"]] == [640, 640, 320]  # blocks 0-1 both epochs, block 2 one


@pytest.mark.usefixtures("ray_session")
def test_a_failing_step_in_the_graph_stops_the_run_with_the_stage_and_its_error(monkeypatch):
    monkeypatch.setenv("GROWPIPE_FAULT_AT", "1:3")
    cfg = _cfg("compiled-failing", "al", train={"epochs": 1})
    needle = r"stage 1 \(block 1, ALBlock\) failed: RuntimeError: injected failure"
    with pytest.raises(PipelineError, match=needle), Pipeline(cfg) as p:
        p.train(progress=None)
    assert run_actors("compiled-failing") == []
