"""Comparing time.time() between stage actors. A machine has one clock (one running kernel: its boot id), so
a hop between two actors on the same machine needs no correction; between machines the clocks differ by
whatever NTP left, so the sender stamps a packet in the receiver's clock, the offset estimated once by round
trips when the stages are wired (Cristian's algorithm)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import ray

ROUND_TRIPS = 5


def _boot_id() -> str:
    """This machine's running kernel (Linux), else its host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


BOOT_ID = _boot_id()


def offset_from_round_trips(trips: list[tuple[float, float, float]]) -> float:
    """How far another clock is ahead of this one, from round trips (asked at, its reading, answered at; this
    clock, that one, this one): the shortest round trip's reading taken at its midpoint (the error is at most
    half that round trip)."""
    asked, there, answered = min(trips, key=lambda t: t[2] - t[0])
    return there - (asked + answered) / 2


def clock_offset(handle: Any, timeout_s: float) -> float:
    """How far the clock of the stage actor behind `handle` (its `clock()`) is ahead of this process's: 0 on
    the same machine."""
    trips = []
    for _ in range(ROUND_TRIPS):
        asked = time.time()
        boot, there = ray.get(handle.clock.remote(), timeout=timeout_s)
        answered = time.time()
        if boot == BOOT_ID:
            return 0.0
        trips.append((asked, there, answered))
    return offset_from_round_trips(trips)
