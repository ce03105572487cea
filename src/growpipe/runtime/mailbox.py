"""Mailbox: one order at a time from an engine to the workers of a Ray Train run, and each order's report
back, without polling.

The engine posts an order and waits for its report; the workers' rank 0 hands in the report of the order it
finished and waits for the next (through the run's controller actor, `Controller.rendezvous`). A worker
group that Ray Train restarted after a failure hands in the report kept in the checkpoint it starts from
(None when there is none) and gets the order after it: the one in flight, run again from that checkpoint
(exact: every order that changes the weights reports a checkpoint), or the next one.
"""

from __future__ import annotations

import threading
from typing import Any


class TrainerEnded(RuntimeError):
    """The trainer ended (or failed) while an order waited for its report."""


class Mailbox:
    """Orders (dicts with an "op") numbered from 1; reports keyed by the number of the order they answer."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seq = 0
        self._order: dict[str, Any] | None = None
        self._reports: dict[int, dict[str, Any]] = {}
        self._taken = 0  # the newest order whose report was taken by the engine
        self._ended: str | None = None

    def post(self, order: dict[str, Any]) -> int:
        """Make `order` the one in flight; its number."""
        with self._cond:
            self._seq += 1
            self._order = {**order, "seq": self._seq}
            self._cond.notify_all()
            return self._seq

    def wait_report(self, seq: int) -> dict[str, Any]:
        """The report of order `seq`; TrainerEnded when the trainer ends first."""
        with self._cond:
            self._cond.wait_for(lambda: seq in self._reports or self._ended is not None)
            if seq not in self._reports:
                raise TrainerEnded(self._ended or "the trainer ended")
            self._taken = max(self._taken, seq)
            return self._reports.pop(seq)

    def serve(self, report: dict[str, Any] | None) -> dict[str, Any]:
        """From the workers: record `report` (None: a worker group that starts from scratch; a report the
        engine took already is dropped) and wait for the order after it."""
        with self._cond:
            if report is not None and report["seq"] > self._taken:
                self._reports[report["seq"]] = report
                self._cond.notify_all()
            done = report["seq"] if report is not None else 0
            self._cond.wait_for(lambda: self._order is not None and self._order["seq"] > done)
            assert self._order is not None
            return self._order

    def ended(self, why: str) -> None:
        """The trainer is gone (`why`): wake whoever waits for a report."""
        with self._cond:
            self._ended = why
            self._cond.notify_all()

    def reopen(self) -> None:
        """A new trainer starts (its first order is the next one posted)."""
        with self._cond:
            self._ended = None
            self._order = None
            self._reports.clear()
