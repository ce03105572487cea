"""Benchmarks are not tests: only check that each runs on a tiny case and writes its JSON."""

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_reference_benchmark_quick(tmp_path: Path):
    out = tmp_path / "ref.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "reference.py"),
            "--quick",
            "--methods",
            "bp,dascpl",
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| digits | dascpl |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["bp", "dascpl"]
    assert all(0 <= r["test_accuracy"] <= 1 and r["seconds_per_epoch"] > 0 for r in rows)


def test_pipeline_benchmark_quick_writes_every_key(tmp_path: Path):
    out = tmp_path / "pipeline.json"
    cmd = ["bench", "pipeline", "--quick", "--batches", "6", "--json-out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "growpipe.cli", *cmd],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    for key in ("speedup_vs_sequential", "ratio_vs_bp_threads", "ratio_vs_torch_gpipe", "hop_overhead_ms",
                "stage_utilisation", "settings"):  # fmt: skip
        assert key in r
    assert len(r["stage_utilisation"]) == 2 and r["settings"]["stages"] == 2
    assert all(v > 0 for v in r["cases"][0]["samples_per_second"].values())


def test_growth_benchmark_quick_writes_every_key_and_a_plot(tmp_path: Path):
    out = tmp_path / "growth.json"
    cmd = ["bench", "growth", "--quick", "--limit-train", "400", "--limit-test", "300", "--json-out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "growpipe.cli", *cmd], capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    for key in ("acc_before", "acc_after", "frozen_unchanged", "cache_epoch_ratio", "nocache_epoch_ratio",
                "adaptive", "cases", "settings"):  # fmt: skip
        assert key in r
    assert len(r["acc_before"]) == len(r["acc_after"]) == 2 and r["frozen_unchanged"] is True
    assert r["cache_epoch_ratio"] > 0 and r["nocache_epoch_ratio"] > 0
    assert {"threshold", "accuracy", "mean_depth", "macs_saved_fraction"} <= set(r["adaptive"][0])
    assert Path(r["cases"][0]["plot"]).read_bytes()[:4] == b"\x89PNG"
