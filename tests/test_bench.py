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
