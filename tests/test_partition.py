"""Balanced partitioning: the exact cut against brute force, memory limits, and a profiled cut of a real net
that trains with the partitioned config (predicted and measured stage times reported)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from growpipe.cli import main
from growpipe.config import load_config
from growpipe.errors import ConfigError
from growpipe.partition import balanced_cuts, layer_config
from tests.conftest import tiny_config


def _brute(costs: list[float], k: int, memory: list[float], budget: float | None) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), k - 1):
        bounds = [0, *cuts, len(costs)]
        stages = [(bounds[i], bounds[i + 1]) for i in range(k)]
        if budget is not None and any(sum(memory[a:b]) > budget for a, b in stages):
            continue
        best = min(best, max(sum(costs[a:b]) for a, b in stages))
    return best


def test_cut_is_optimal_against_brute_force():
    assert balanced_cuts([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [5, 2, 2]  # 15 | 13 | 17
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.uniform(0.1, 5) for _ in range(n)]
        memory = [rng.uniform(0.1, 3) for _ in range(n)]
        budget = rng.choice([None, max(memory) * 2, sum(memory)])
        want = _brute(costs, k, memory, budget)
        if want == float("inf"):
            with pytest.raises(ConfigError):
                balanced_cuts(costs, k, memory, budget)
            continue
        sizes = balanced_cuts(costs, k, memory, budget)
        assert sum(sizes) == n and len(sizes) == k and min(sizes) >= 1
        bounds = list(itertools.accumulate([0, *sizes]))
        assert max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)) == pytest.approx(want)


def test_bad_requests_are_refused_before_anything_runs():
    with pytest.raises(ConfigError, match="stages: 5 is more than the 4 layers"):
        balanced_cuts([1, 1, 1, 1], 5)
    with pytest.raises(ConfigError, match="memory: no cut into 2 stages fits 1 MB"):
        balanced_cuts([1, 1, 1], 2, [0.6, 0.6, 0.6], 1.0)
    with pytest.raises(ConfigError, match="net.backbone: cnn is not partitioned"):
        layer_config(tiny_config(net={"backbone": "cnn"}))
    with pytest.raises(ConfigError, match="layers"):
        tiny_config(net={"blocks": 2, "layers": [1, 2, 3]})


def test_measuring_data_parallel_bp_is_refused_before_profiling(capsys):
    args = ["partition", "--set", "method=bp", "--set", "runtime.engine=ddp", "--stages", "2", "--measure"]
    assert main(args) == 2
    err = capsys.readouterr()
    assert "ddp is data-parallel and has no stages to measure; use gpipe or 1f1b" in err.err
    assert "layer ms" not in err.out  # nothing was profiled


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("method", ["dascpl", "bp"])  # bp: measured on GPipe's stage actors
def test_profiled_partition_trains_and_reports_predicted_and_measured_times(tmp_path: Path, capsys, method: str):
    out, report = tmp_path / "part.yaml", tmp_path / "part.json"
    args = ["partition", "--set", "net.blocks=3", "--set", "net.layers_per_block=2", "--set", "net.width=64",
            "--set", f"method={method}", "--set", "tracking.mlflow=false", "--set", "checkpoint.enabled=false",
            "--set", "runtime.timeline_epoch=0", "--stages", "2", "--measure", "--write", str(out),
            "--json-out", str(report)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert len(data["layer_ms"]) == 6 and sum(data["layers"]) == 6 and len(data["layers"]) == 2
    assert len(data["predicted_stage_ms"]) == 2 and all(m is not None and m > 0 for m in data["measured_stage_ms"])
    # a stage: its layers' times inside a stage plus one constant (one head; no gradient for its input)
    assert all(ms > 0 for ms in data["layer_ms"]) and (data["stage_constant_ms"] == 0) == (method == "bp")
    first = data["layers"][0]
    want = data["stage_constant_ms"] + sum(data["layer_ms"][:first])
    assert data["predicted_stage_ms"][0] == pytest.approx(want, abs=0.01)
    cfg = load_config(out)
    assert cfg.net.blocks == 2 and cfg.net.layers == data["layers"]
    assert main(["train", "--config", str(out), "--runtime", "local", "--set", "train.epochs=1", "-q"]) == 0
