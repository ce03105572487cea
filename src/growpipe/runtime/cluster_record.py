"""Which Ray cluster a run is on: recorded when it starts there (RUNS/clusters/NAME.json, RUNS being the
run's tracking.workdir), read by `growpipe grow` so that it asks that cluster and not whichever Ray started
last on the machine."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from growpipe.fsutil import atomic_write_json


def record_file(workdir: str | Path, run_name: str) -> Path:
    """Where the cluster of run `run_name` is recorded under `workdir` (a run's tracking.workdir)."""
    return Path(workdir) / "clusters" / f"{run_name}.json"


def record_cluster(workdir: str | Path, run_name: str, address: str) -> Path | None:
    """Record that run `run_name` runs on the cluster whose GCS is at `address`, with the authentication mode
    this process uses there ("token" or "disabled"; never a token itself), atomically; None when the folder
    cannot be written: a run never fails for it, `growpipe grow` then needs --address."""
    record = {"run": run_name, "address": address, "auth": auth_mode(), "started": time.time()}
    try:
        return atomic_write_json(record_file(workdir, run_name), record)
    except OSError:
        return None


def auth_mode() -> str:
    """The Ray authentication mode of this process: "token" once RAY_AUTH_MODE says so (ray.init of a new local
    Ray sets it when it was unset), else "disabled"."""
    return "token" if os.environ.get(AUTH_MODE_VAR, "").lower() == "token" else "disabled"


AUTH_MODE_VAR = "RAY_AUTH_MODE"


def recorded_address(run_name: str, workdirs: list[Path]) -> tuple[str, Path] | None:
    """(GCS address, record file) of run `run_name` from the first of `workdirs` that records it."""
    found = read_record(run_name, workdirs)
    return (found[0]["address"], found[1]) if found else None


def read_record(run_name: str, workdirs: list[Path]) -> tuple[dict, Path] | None:
    """(the record, its file) of run `run_name` from the first of `workdirs` that records it."""
    for workdir in workdirs:
        path = record_file(workdir, run_name)
        try:
            record = json.loads(path.read_text())
            address = record.get("address")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(address, str) and address:
            return record, path
    return None


def choose_cluster(flag: str | None, env: str | None, recorded: tuple[str, Path] | None) -> tuple[str, str] | None:
    """(address to join, how it was chosen): --address, else $RAY_ADDRESS, else where the run was recorded to
    start; None when none of them says (a cluster is never guessed: the newest Ray on this machine may be
    somebody else's)."""
    if flag:
        return flag, f"--address {flag}"
    if env:
        return env, f"RAY_ADDRESS={env}"
    if recorded:
        return recorded[0], f"recorded when the run started, {recorded[1]}"
    return None


def gcs_address(address: str) -> tuple[str, int] | None:
    """(host, port) when `address` is a GCS address HOST:PORT (not auto, ray://, http://)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def gcs_unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing answers at a GCS `address` (HOST:PORT) now (None: something listens, or the address is not
    of that form: auto, ray://, http://). Checked first because ray.init waits minutes for a GCS that is
    gone."""
    if (where := gcs_address(address)) is None:
        return None
    try:
        with socket.create_connection(where, timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def auth_problem(address: str) -> str | None:
    """Why the GCS at `address` (HOST:PORT, answering) would not take this process: "no token" (token mode, and
    no token here: Ray's client would abort the process), "refused" (no token sent, or another cluster's), or
    None. Asked with one call that fails at once, unlike ray.init, which retries for about 25 s; the line Ray's
    C++ client prints for a refusal is kept out of the output."""
    # lazy: ray; growpipe.prepare and the API import this module for local runs too
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # missing from ray's _raylet.pyi
    from ray.exceptions import AuthenticationError

    if gcs_address(address) is None:
        return None
    if auth_mode() == "token" and not has_token():
        return "no token"
    try:
        with _stderr_swallowed():
            GcsClient(address=address)
    except AuthenticationError:
        return "refused"
    except Exception:  # anything else is ray.init's to report
        return None
    return None


def has_token() -> bool:
    """Whether a Ray auth token is to be had here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)."""
    # lazy: as in auth_problem (and missing from ray's _raylet.pyi)
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    return bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))


def use_token_auth() -> None:
    """Send Ray's auth token from here on (RAY_AUTH_MODE=token, for this process and its children): what a run
    recorded when it started on a cluster that uses token authentication."""
    # lazy: as in auth_problem (and missing from ray's _raylet.pyi)
    from ray._raylet import Config  # type: ignore[attr-defined]

    os.environ[AUTH_MODE_VAR] = "token"
    Config.initialize("")  # Ray caches the mode read at import; re-read it (as Ray's own ray.init does)


@contextlib.contextmanager
def _stderr_swallowed() -> Iterator[None]:
    """File descriptor 2 into a temporary file for the block: Ray's C++ logging writes there directly."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
