"""Running the documentation's commands as written: a checkout-like folder to run them in, the environment
they get (tiny data and epochs through GROWPIPE_SET, nothing else changed), a run held open for the commands
that need a running job, and the check that their output has no library lines a user cannot act on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.doc_blocks import REPO, Block, commands

TINY = "train.epochs=2; data.limit_train=256; data.limit_test=128"
"""GROWPIPE_SET of most documented runs here: the run as written, on a few rows for two epochs (the digits
sweep's ASHA grace period)."""


def checkout_view(root: Path) -> Path:
    """A folder that looks like this checkout (every top-level entry linked) but has its own runs/: the
    documented commands write their relative outputs there, never into the checkout."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.name not in ("runs", ".git", ".pytest_cache") and not (root / entry.name).exists():
            (root / entry.name).symlink_to(entry)
    return root


def environment(
    extra: dict[str, str] | None = None, growpipe_set: str | None = TINY, ray_address: str | None = None
) -> dict[str, str]:
    """This process's environment as a user's shell would have it (no test-session settings: results go to
    the folder the command runs in), GROWPIPE_SET, and `extra`. No cluster address unless `ray_address`: then
    RAY_ADDRESS, as a user who started a cluster once and exported its address has it (the command joins that
    Ray instead of starting its own, which costs 7-11 s here)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GROWPIPE_WORKDIR", "RAY_ADDRESS", "GROWPIPE_SET", "PYTEST_CURRENT_TEST")}  # fmt: skip
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    if growpipe_set:
        env["GROWPIPE_SET"] = growpipe_set
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return {**env, **(extra or {})}


def sh(command: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """One documented command through bash in `cwd`; fails the test with its output when it fails."""
    out = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{command!r} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


RAN: dict[tuple[Path, str], subprocess.CompletedProcess] = {}
"""Commands that ran (and passed) in a folder: a block that repeats one (the README and a doc page showing
the same command) takes the earlier run's result instead of running it again."""


def filled(command: str, names: dict[str, str] | None) -> str:
    for placeholder, value in (names or {}).items():
        command = command.replace(placeholder, value)
    return command


def run_command(command: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    if (cwd, command) not in RAN:
        RAN[(cwd, command)] = sh(command, cwd, env, timeout)
    return RAN[(cwd, command)]


def run_block(
    b: Block,
    cwd: Path,
    env: dict[str, str],
    names: dict[str, str] | None = None,
    skip: Callable[[str], bool] = lambda _c: False,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess]:
    """Every command of block `b`, in order, with its placeholders (NAME, DIR, ...) replaced by `names`, but
    those `skip` says another part of the test runs."""
    return [run_command(c, cwd, env, timeout) for c in (filled(c, names) for c in commands(b.text)) if not skip(c)]


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def wait_until(what: str, ready: Callable[[], bool], timeout: float = 240) -> None:
    """Poll `ready` (which fails the test itself when what it waits on died) until true."""
    deadline = time.time() + timeout
    while not ready():
        assert time.time() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.2)


class Background:
    """A long-running documented command (a training run held open, a server): started in its own session,
    its output in a file, stopped with SIGTERM (as `ray job stop` or Ctrl-C would)."""

    def __init__(self, command: str | list[str], cwd: Path, env: dict[str, str], log: Path):
        self.log = log
        with log.open("w") as out:
            args = ["bash", "-c", command] if isinstance(command, str) else command
            self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip

    def output(self) -> str:
        return self.log.read_text()

    def says(self, needle: str) -> bool:
        assert self.proc.poll() is None or needle in self.output(), f"ended early:\n{self.output()[-4000:]}"
        return needle in self.output()

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(30)

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout)


@contextlib.contextmanager
def held_run(cwd: Path, name: str, gate: Path, extra_sets: tuple[str, ...] = (), env: dict[str, str] | None = None,
             config: str = "configs/demo.yaml") -> Iterator[Background]:  # fmt: skip
    """A plain `growpipe train` of run `name` on its embedded Ray (as a user starts one), held before batch 2
    of its first epoch until `gate` exists or a grow request pauses it (GROWPIPE_HOLD_AT), so that commands
    that need a running job find it running; yielded once it wrote its first checkpoint (its stages are up),
    stopped at the end if it still runs."""
    sets = " ".join(f"--set '{s}'" for s in (f"name={name}", *extra_sets))
    run = Background(f".venv/bin/growpipe train --config {config} {sets}", cwd,
                     {**(env or environment()), "GROWPIPE_HOLD_AT": f"1:2:{gate}"},
                     cwd / f"{name}.log")  # fmt: skip
    try:
        wait_until(f"run {name}'s first checkpoint", lambda: run.says("ckpt   ckpt-"))
        yield run
    finally:
        gate.touch()
        run.stop()


def python_block(b: Block | list[Block], cwd: Path, env: dict[str, str], names: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:  # fmt: skip
    """A ```python block (or consecutive blocks of one page, as one session) as a script of its own, run by the
    checkout's Python in `cwd`."""
    parts = b if isinstance(b, list) else [b]
    text = filled("\n\n".join(p.text for p in parts), names)
    script = cwd / f"block_{parts[0].doc.replace('/', '_')}_{parts[0].line}.py"
    script.write_text(text + "\n")
    return sh(f"{REPO / '.venv' / 'bin' / 'python'} {script}", cwd, env, timeout)


def answers(url: str, server: Background | None = None) -> bool:
    """Whether `url` answers 200 now (failing the test when `server`, which should answer it, has ended)."""
    import urllib.request

    if server is not None:
        assert server.proc.poll() is None, f"the server ended:\n{server.output()[-4000:]}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False
