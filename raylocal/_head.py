"""The processes of the Ray head raylocal/up starts: which they are, whether the process listening on the job
agent's port is one of them, and ending exactly them. raylocal/up and raylocal/down run this file; nothing here
finds a process by its name or command line (a command line only confirms a recorded pid), so other Rays on the
machine are never touched.

    python raylocal/_head.py start AGENT_PORT -- ray start --head ...  # prints RAYLOCAL_PIDS=... for the state file
    python raylocal/_head.py running STATE        # exit 0 when a process recorded in STATE still runs
    python raylocal/_head.py stop STATE WHERE     # ends the recorded processes (and their children); exit 1
                                                  # when a recorded pid runs that it cannot confirm as the head's

`start` makes itself a child subreaper (Linux) before it runs `ray start`: the daemons `ray start` leaves behind
(GCS, raylet, dashboard, Ray client server, log monitor, autoscaler monitor) become its children instead of init's,
so the head is exactly its descendants: those and what they started (the dashboard and runtime-env agents, the
dashboard's modules, workers).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

AGENT_WAIT_S = 60.0
STOP_GRACE_S = 10.0  # what has not ended this long after SIGTERM is killed
# psutil derives a process's start time from the boot time, which moves when the wall clock steps (NTP, suspend)
START_SLACK_S = 2.0
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its address and its process (None: another user's, whose pid is hidden)."""

    address: str
    pid: int | None


def family(parent_of: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """`roots` and every process descended from them, given each running process's parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True)
class Seen:
    """A process as up recorded it or as it runs now: its start time and `signature` of its command line
    ("" when unknown)."""

    started: float
    signature: str = ""


def signature(cmdline: list[str]) -> str:
    """A short fingerprint of a command line, to recognise a recorded process whose start time moved."""
    return hashlib.sha1("\0".join(cmdline).encode()).hexdigest()[:8] if cmdline else ""


def match(recorded: Mapping[int, Seen], running: Mapping[int, Seen]) -> tuple[set[int], set[int]]:
    """The recorded pids that still run, as (ours, unsure). Ours: it started when recorded (within
    START_SLACK_S) or runs the recorded command line. Unsure: neither, so it is another process the system gave
    the pid to, or the head's own after a clock step that also changed its title; it is not ours to end."""
    ours, unsure = set(), set()
    for pid, rec in recorded.items():
        now = running.get(pid)
        if now is None:
            continue
        same = abs(now.started - rec.started) <= START_SLACK_S or "" != rec.signature == now.signature
        (ours if same else unsure).add(pid)
    return ours, unsure


def agent_verdict(listeners: Iterable[Listener], head: set[int]) -> tuple[str, Listener | None]:
    """Who answers on the job agent's port: ("ours", None) when only the head's processes listen there,
    ("foreign", that listener) when any other process does (`ray job submit` could reach it instead of this
    head's agent), ("waiting", None) while nothing listens yet."""
    listeners = list(listeners)
    foreign = next((x for x in listeners if x.pid not in head), None)
    if foreign is not None:
        return "foreign", foreign
    return ("ours", None) if listeners else ("waiting", None)


def stop_order(started: Mapping[int, float]) -> list[list[int]]:
    """The order to end the head's processes (pid -> start time) in: all but the first-started, then that one.
    The first is the GCS (`ray start --head` starts it before anything else); the others' SIGTERM handlers talk to
    it and hang, until they are killed, when it ends first (`ray stop` also ends the GCS last)."""
    pids = sorted(started, key=lambda pid: (started[pid], pid))
    return [stage for stage in (pids[1:], pids[:1]) if stage]


def encode(recorded: Mapping[int, Seen]) -> str:
    return ",".join(f"{pid}@{s.started:.2f}@{s.signature}" for pid, s in sorted(recorded.items()))


def decode(text: str) -> dict[int, Seen]:
    """The inverse of `encode`; also reads pid@time (a state file written before signatures)."""
    fields = (item.split("@") for item in text.split(",") if item)
    return {int(pid): Seen(float(t), *rest[:1]) for pid, t, *rest in fields}


def label(cmdline: list[str], name: str) -> str:
    """A short name for a process in reports: the script or module a python runs, else the program's title."""
    if not cmdline:
        return name
    first = os.path.basename(cmdline[0].split(" ")[0])
    if first.startswith("python"):
        args = cmdline[1:]
        for i, arg in enumerate(args):
            if arg == "-m" and i + 1 < len(args):
                return args[i + 1]
            if arg == "-c":
                return f"{first} -c"
            if not arg.startswith("-"):
                return os.path.basename(arg)
    return first


def listeners(port: int) -> list[Listener]:
    """The TCP sockets listening on `port`, on any address."""
    return [
        Listener(c.laddr.ip, c.pid)
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    ]


def _running() -> dict[int, psutil.Process]:
    procs = {}
    for p in psutil.process_iter(["ppid", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE:
            procs[p.pid] = p
    return procs


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(p: psutil.Process) -> str:
    try:
        return f"{label(p.cmdline(), p.name())} {p.pid}"
    except psutil.Error:
        return str(p.pid)


def _describe_pid(pid: int) -> str:
    try:
        return f"pid {pid} ({_describe(psutil.Process(pid)).rsplit(' ', 1)[0]})"
    except psutil.Error:
        return f"pid {pid}"


def _seen(procs: Mapping[int, psutil.Process]) -> dict[int, Seen]:
    seen = {}
    for pid, p in procs.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            try:
                cmdline = p.cmdline()
            except psutil.AccessDenied:
                cmdline = []
            seen[pid] = Seen(p.create_time(), signature(cmdline))
    return seen


def descendants(roots: Iterable[int]) -> dict[int, psutil.Process]:
    """The running processes among `roots` and their descendants."""
    procs = _running()
    pids = family({pid: p.info["ppid"] for pid, p in procs.items()}, roots)
    return {pid: procs[pid] for pid in pids if pid in procs}


def _wait(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Wait up to `seconds` for `procs` to end; returns those still running."""
    deadline = time.monotonic() + seconds
    left = [p for p in procs if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    return left


def _signal(procs: Iterable[psutil.Process], kill: bool) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            (p.kill if kill else p.terminate)()


@dataclass
class Stopped:
    """What `stop` did: every process it signalled ("name pid" by pid), those it had to SIGKILL, those still
    running after that."""

    names: dict[int, str]
    killed: list[int]
    left: list[int]

    def say(self, pids: Iterable[int]) -> str:
        return ", ".join(self.names[pid] for pid in pids)


def stop(procs: Iterable[psutil.Process], grace_s: float = STOP_GRACE_S) -> Stopped:
    """End `procs` in `stop_order`: SIGTERM, up to `grace_s` to end, then SIGKILL. psutil refuses to signal a
    pid the system has since given to another process."""
    procs = {p.pid: p for p in procs if _alive(p)}
    started = {pid: seen.started for pid, seen in _seen(procs).items()}
    names = {pid: _describe(procs[pid]) for pid in sorted(started)}
    killed: list[psutil.Process] = []
    for stage in stop_order(started):
        group = [procs[pid] for pid in stage]
        _signal(group, kill=False)
        left = _wait(group, grace_s)
        _signal(left, kill=True)
        killed += left
    left = _wait(killed, 5.0)
    return Stopped(names, [p.pid for p in killed], [p.pid for p in left])


class _Terminated(Exception):
    pass


def _interrupt(signum: int, frame: object) -> None:
    raise _Terminated


def _make_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def start(agent_port: int, command: list[str], wait_s: float = AGENT_WAIT_S) -> int:
    """Run `command` (ray start), wait until the head's own job agent listens on `agent_port`, print the head's
    processes as RAYLOCAL_PIDS=...; on any failure stop every process the command started and say why in one line."""
    try:
        _make_subreaper()
    except (OSError, AttributeError) as e:
        print(f"raylocal/up: needs Linux to keep track of the head's processes ({e})", file=sys.stderr)
        return 1
    me = os.getpid()
    signal.signal(signal.SIGTERM, _interrupt)

    def head() -> dict[int, psutil.Process]:
        return {pid: p for pid, p in descendants([me]).items() if pid != me}

    def fail(message: str, code: int = 1) -> int:
        # a process orphaned while its parent was being stopped comes back to this subreaper: stop until none is
        # left (or only ones SIGKILL did not end)
        stopped = Stopped({}, [], [])
        for _ in range(5):
            procs = [p for pid, p in head().items() if pid not in stopped.left]
            if not procs:
                break
            result = stop(procs)
            stopped.names.update(result.names)
            stopped.left += result.left
        still = f"; still running: {stopped.say(stopped.left)}" if stopped.left else ""
        count = len(stopped.names)
        print(f"raylocal/up: {message}; stopped the {count} processes it had started{still}", file=sys.stderr)
        return code

    try:
        # ray start's own output is shown only when it fails (a file, not a pipe: the daemons inherit it)
        with tempfile.TemporaryFile("w+") as output:
            code = subprocess.call(command, stdout=output, stderr=output)
            if code != 0:
                output.seek(0)
                sys.stderr.write(output.read())
                return fail(f"`ray start` failed (exit {code})", code)
        deadline = time.monotonic() + wait_s
        while True:
            found = listeners(agent_port)  # before the process table: a listener's process is then in it
            procs = head()
            verdict, other = agent_verdict(found, set(procs))
            if verdict == "ours":
                break
            if verdict == "foreign":
                who = _describe_pid(other.pid) if other.pid else "a process of another user"
                return fail(
                    f"port {agent_port} (RAY_AGENT_PORT) is answered by {who} on {other.address}, not by this "
                    "head's job agent; set RAY_AGENT_PORT to a free port"
                )
            if time.monotonic() > deadline:
                return fail(
                    f"the head's job agent did not come up on 127.0.0.1:{agent_port} within {wait_s:.0f} s "
                    "(RAY_AGENT_PORT)"
                )
            time.sleep(0.5)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except _Terminated:
        return fail("terminated", 143)
    print("RAYLOCAL_PIDS=" + encode(_seen(procs)))
    return 0


def recorded(state: Path) -> dict[int, Seen]:
    """The head's processes as raylocal/up recorded them in the state file (none when there is no file)."""
    if not state.is_file():
        return {}
    for line in state.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "RAYLOCAL_PIDS":
            return decode(value)
    return {}


def _recorded_running(state: Path) -> tuple[dict[int, psutil.Process], set[int]]:
    """The head's processes still running (the recorded ones `match` confirms and their descendants) and the
    recorded pids that run but `match` cannot confirm."""
    rec = recorded(state)
    procs = _running()
    ours, unsure = match(rec, _seen({pid: procs[pid] for pid in rec.keys() & procs.keys()}))
    head = descendants(ours)
    return head, unsure - head.keys()


def _unsure_line(unsure: set[int], state: Path) -> str:
    who = ", ".join(_describe_pid(pid) for pid in sorted(unsure))
    runs = "still runs" if len(unsure) == 1 else "still run"
    return (
        f"{who} recorded in {state} {runs}, but neither start time nor command line match the record, so it may "
        "not be the head's"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) >= 4 and argv[2] == "--":
        return start(int(argv[1]), argv[3:])
    if argv[:1] == ["running"] and len(argv) == 2:
        state = Path(argv[1])
        procs, unsure = _recorded_running(state)
        if unsure:
            print(f"raylocal/up: {_unsure_line(unsure, state)}", file=sys.stderr)
        return 0 if procs or unsure else 1
    if argv[:1] == ["stop"] and len(argv) == 3:
        state, where = Path(argv[1]), argv[2]
        if not recorded(state):
            print(f"no raylocal head recorded ({state} is missing or lists no processes); nothing to stop")
            return 0
        procs, unsure = _recorded_running(state)
        problems = []
        if procs:
            result = stop(procs.values())
            print(f"ray head on {where} stopped: {len(result.names)} processes: {result.say(result.names)}")
            if result.killed:
                print(f"  killed after {STOP_GRACE_S:.0f} s without ending on SIGTERM: {result.say(result.killed)}")
            if result.left:
                problems.append(f"still running after SIGKILL: {result.say(result.left)}")
        elif not unsure:
            print(f"no process of the raylocal head on {where} runs any more; nothing to stop")
        if unsure:
            problems.append(f"{_unsure_line(unsure, state)}: left alone (end it yourself if it is the head's)")
        if problems:
            print(f"raylocal/down: {'; '.join(problems)}; kept {state} (delete it once none of its pids is the "
                  "head's)", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
