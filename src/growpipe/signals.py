"""Ctrl-C and SIGTERM (`kill`, `ray job stop`, a pod ending) stop a command at any moment, as a stop.

The handler remembers the signal and raises KeyboardInterrupt. A KeyboardInterrupt can be swallowed by code
it lands in (an import that catches everything), so the places that wait (the driver following a run, the
run loop between steps) call `check()`, which raises it again; the exit code comes from the signal
remembered (130 for SIGINT, 143 for SIGTERM), whatever the command did after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []


def install(on_signal: Callable[[int], None] | None = None) -> Callable[[], None]:
    """Handle SIGINT and SIGTERM in this process (from its main thread): remember the signal, then call
    `on_signal(signum)` if given, else raise KeyboardInterrupt. Returns what puts the earlier handlers back.

    Also keeps Ray's native crash handler out (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, when Ray is not imported
    yet): it would turn a SIGTERM during ray.init into a stack dump and an abort (exit 134)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    clear()
    _keep_ray_native_handler_out()

    def handler(signum: int, _frame: Any) -> None:
        if not _received:
            _received.append(signum)
        if on_signal is not None:
            on_signal(signum)
        else:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {s: signal.signal(s, handler) for s in STOPPING}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def _keep_ray_native_handler_out() -> None:
    """Ray reads this when it is imported; its processes started from here inherit it (they stop on SIGTERM
    without a native stack dump; Python's faulthandler still reports real crashes)."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Notice a stopping signal that arrives while other code's handler is in place (ray.init puts in one
    that calls sys.exit, and what it raises may be caught inside): Python's own C handler writes every signal
    number to the wakeup fd, whichever Python handler runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        with contextlib.suppress(BlockingIOError):
            for signum in os.read(r, 1024):
                if signum in STOPPING:
                    note(signum)
        os.close(r)
        os.close(w)


def exit_at_once_on_signal() -> None:
    """From now on a stopping signal ends the process at once with 128 + its number (the console script's
    teardown, after the command's own work is done)."""
    if threading.current_thread() is threading.main_thread():
        for s in STOPPING:
            signal.signal(s, lambda signum, _frame: os._exit(128 + signum))


def note(signum: int) -> None:
    """Remember a stopping signal that reached this process another way (Ray's own handler during ray.init)."""
    if not _received:
        _received.append(signum)


def clear() -> None:
    """Forget a signal received (a test, or a command run again in the same process)."""
    _received.clear()


def received() -> int | None:
    """The first stopping signal this process received, if any."""
    return _received[0] if _received else None


def check() -> None:
    """Raise KeyboardInterrupt when a stopping signal was received (one swallowed where it first landed)."""
    if _received:
        raise KeyboardInterrupt(f"signal {signal.Signals(_received[0]).name}")


def exit_code(default: int = 130) -> int:
    """128 + the signal received (130 SIGINT, 143 SIGTERM); `default` when none was."""
    return 128 + _received[0] if _received else default


def describe() -> str:
    """'SIGTERM' / 'SIGINT (Ctrl-C)' for the signal received, for the one-line reason."""
    if not _received:
        return "Ctrl-C"
    return "SIGINT (Ctrl-C)" if _received[0] == signal.SIGINT else signal.Signals(_received[0]).name


def end_descendants(grace_s: float = 3.0) -> int:
    """Kill every process this one started that still runs after `grace_s` (an embedded Ray's workers that a
    stop left behind), by PID; how many there were."""
    try:
        import psutil  # lazy: cli imports this module before parsing, and --help stays fast
    except ImportError:
        return 0
    children = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=grace_s) if children else ([], [])
    for c in alive:
        with contextlib.suppress(psutil.Error):
            c.kill()
    return len(alive)
