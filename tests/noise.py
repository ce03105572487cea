"""A checker for library log lines in a command's output (what growpipe.quiet keeps out): apply
`library_noise` to the stdout + stderr of `make demo`, a sweep or a serve run; it returns the offending lines.

A line counts when, after ANSI colours and Ray's worker prefix (`(Controller pid=123)`) are taken off, it is a
library's log record (Python logging's formats as MLflow, Ray, Ray Serve, alembic and plain `logging` print
them, at INFO, WARNING or DEBUG), a Python warning, a torch C++ log line (`[W ...]`), a line from one of Ray's
own processes (`(raylet)`, `(gcs_server)`, ...), a download bar, or one of the known bookkeeping messages.
growpipe's own lines (`warn   ...`, tables, `epoch ...`) never count, nor do Serve's health-check warnings on a
loaded machine (EXCUSED).
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\((?P<who>[\w:.\-]+)(?: pid=\d+)?(?:, ip=[\d.]+)?\)\s?")
RAY_PROCESSES = ("raylet", "gcs_server", "monitor", "autoscaler", "dashboard", "log_monitor", "JobSupervisor")
LEVEL = r"(?:DEBUG|INFO|WARNING|WARN)"
RECORDS = [
    re.compile(rf"^\d{{4}}/\d\d/\d\d \d\d:\d\d:\d\d {LEVEL} [\w.]+: "),  # MLflow: 2026/11/27 11:53:53 INFO mlflow.x:
    re.compile(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+{LEVEL} [\w.]+:\d+ -- "),  # Ray: ... INFO worker.py:2029 --
    re.compile(rf"^{LEVEL} \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ "),  # Ray Serve: WARNING 2026-11-27 11:59:55,277 ...
    re.compile(rf"^{LEVEL}\s+\[[\w.]+\] "),  # alembic: INFO  [alembic.runtime.migration] Context impl SQLiteImpl.
    re.compile(rf"^{LEVEL}:[\w.]*:"),  # logging's default format: WARNING:root:..., INFO:mlflow.x:...
    re.compile(r"^\S+\.py:\d+: \w*Warning: "),  # a Python warning: /x/y.py:12: UserWarning: ...
    re.compile(r"^\[[WI] ?\d{4} \d\d:\d\d:\d\d"),  # torch's C++ log: [W1127 11:53:32.539862 ...]
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [IWE] \d+ \d+\]"),  # Ray's C++ log: [2026-... I 123 456] ...
]
KNOWN = (
    "Started a local Ray instance",
    "Connecting to existing Ray cluster",
    "Checkpoint successfully created at",
    "Wrote the latest version of all result files",
    "To visualize your results with TensorBoard",
    "Creating initial MLflow database tables",
    "Validating input example",
    "system metrics monitoring",
    "Context impl SQLiteImpl",
    "Will assume non-transactional DDL",
    "Downloading artifacts",
    "Successfully registered model",
    "Created version '",
)
EXCUSED = (
    # Serve's health checks on a loaded machine: a real delay it reports, not bookkeeping (the follower waits
    # for its replica either way)
    "Proxy actor readiness check for proxy on",
    "Proxy actor reported not ready on node",
    "replicas that have taken more than 30s to initialize",
    "Failed to get queue length from Replica",
)


def library_noise(output: str) -> list[str]:
    """The lines of `output` (a command's stdout and stderr) that are library log lines a user cannot act on,
    as printed (ANSI colours removed); [] when there are none."""
    found = []
    for raw in output.splitlines():
        line = ANSI.sub("", raw).strip("\r")
        if is_library_line(line):
            found.append(line)
    return found


def is_library_line(line: str) -> bool:
    """Whether one output line (ANSI colours removed) is a library's log line (see the module docstring)."""
    text = line.strip()
    if any(e in text for e in EXCUSED):
        return False
    if m := RAY_PREFIX.match(text):
        if m.group("who") in RAY_PROCESSES:
            return True
        text = text[m.end() :].strip()
    return any(p.match(text) for p in RECORDS) or any(k in text for k in KNOWN)
