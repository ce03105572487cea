"""Ctrl-C and SIGTERM at any moment end a command as stopped: 130 / 143, one line, nothing of it left running,
its newest checkpoint resumable."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from growpipe import signals


@pytest.fixture
def forget_signals():
    yield
    signals.clear()


@pytest.mark.usefixtures("forget_signals")
def test_a_signal_is_remembered_even_when_the_handler_it_meets_swallows_it():
    """ray.init puts in its own SIGTERM handler (sys.exit), and what it raises can be caught inside: the wakeup
    fd still tells. A KeyboardInterrupt swallowed where it landed is raised again at the next check."""
    swallowed = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: swallowed.append(s))
    try:
        with signals.watching():
            signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert swallowed == [signal.SIGTERM] and signals.received() == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        signals.check()
    assert signals.exit_code() == 143 and signals.describe() == "SIGTERM"

    restore = signals.install()
    try:
        assert signals.received() is None
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signals.exit_code() == 130 and signals.describe() == "SIGINT (Ctrl-C)"
    finally:
        restore()


def test_sigterm_mid_run_on_an_embedded_ray_ends_everything_and_the_run_resumes(tmp_path: Path):
    """The whole command on its own embedded Ray: SIGTERM once it trains; exit 143 with one line, no stack dump,
    every process it started gone; its newest checkpoint goes on (here with the reference trainer)."""
    ck = tmp_path / "ck"
    sets = ["name=stopme", "train.epochs=400", "net.width=32", "al.code_dim=8", "tracking.mlflow=false",
            f"checkpoint.uri={ck}", "runtime.dashboard=false"]  # fmt: skip
    cmd = [sys.executable, "-m", "growpipe.cli", "train", *(a for kv in sets for a in ("--set", kv))]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    trains = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("epoch   2/"):
                trains.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert trains.wait(240), "".join(lines[-20:])
    started = psutil.Process(proc.pid).children(recursive=True)  # raylet, GCS, workers, stage actors...
    assert len(started) >= 4
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, "".join(lines[-20:])
    reader.join(timeout=10)
    text = "".join(lines)
    assert lines[-1].strip() == "growpipe train: stopped by SIGTERM", text[-2000:]
    for dump in ("Traceback", "Fatal Python error", "terminate called", "*** SIG"):
        assert dump not in text, text[-3000:]
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline()[:3] for p in alive]

    resume = [sys.executable, "-m", "growpipe.cli", "train", "--runtime", "local", "-q", "--resume", "stopme",
              "--set", f"checkpoint.uri={ck}", "--set", "train.epochs=3"]  # fmt: skip
    resumed = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resume {ck / 'stopme'}/ckpt-" in resumed.stdout
