"""Which Ray cluster a run is on: recorded when it starts there (RUNS/clusters/NAME.json, RUNS being the
run's tracking.workdir), read by `growpipe grow` so that it asks that cluster and not whichever Ray started
last on the machine."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from growpipe.fsutil import atomic_write_json


def record_file(workdir: str | Path, run_name: str) -> Path:
    """Where the cluster of run `run_name` is recorded under `workdir` (a run's tracking.workdir)."""
    return Path(workdir) / "clusters" / f"{run_name}.json"


def record_cluster(workdir: str | Path, run_name: str, address: str) -> Path | None:
    """Record that run `run_name` runs on the cluster whose GCS is at `address` (atomically; None when the
    folder cannot be written: a run never fails for it, `growpipe grow` then needs --address)."""
    try:
        return atomic_write_json(record_file(workdir, run_name), {"run": run_name, "address": address,
                                                                  "started": time.time()})  # fmt: skip
    except OSError:
        return None


def recorded_address(run_name: str, workdirs: list[Path]) -> tuple[str, Path] | None:
    """(GCS address, record file) of run `run_name` from the first of `workdirs` that records it."""
    for workdir in workdirs:
        path = record_file(workdir, run_name)
        try:
            address = json.loads(path.read_text()).get("address")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(address, str) and address:
            return address, path
    return None


def choose_cluster(flag: str | None, env: str | None, recorded: tuple[str, Path] | None) -> tuple[str, str]:
    """(address to join, how it was chosen): --address, else $RAY_ADDRESS, else where the run was recorded to
    start, else the newest Ray on this machine ("auto")."""
    if flag:
        return flag, f"--address {flag}"
    if env:
        return env, f"RAY_ADDRESS={env}"
    if recorded:
        return recorded[0], f"recorded when the run started, {recorded[1]}"
    return "auto", "no --address, RAY_ADDRESS or record of the run: the newest Ray started on this machine"


def gcs_unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing answers at a GCS `address` (HOST:PORT) now (None: something listens, or the address is not
    of that form: auto, ray://, http://). Checked first because ray.init waits minutes for a GCS that is
    gone."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__
