"""A run's live figures as Ray metrics (`ray.util.metrics`): each node's metrics agent serves them to
Prometheus beside Ray's own, named `ray_` + the name here (a counter with `_total` after it), for the Ray
dashboard's Grafana or any Prometheus. Set after every epoch from the per-stage rows and the epoch row,
counted at every growth; recorded by the run's controller, so on Ray only. docs/tracking.md has a query
for each."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from growpipe.loop.callbacks import RunCallback

Point = tuple[str, dict[str, str], float]
"""One value to record: metric name, tags, value (a gauge's value, or what a counter goes up by)."""


@dataclass(frozen=True)
class MetricSpec:
    """A metric as growpipe names it (Prometheus: `ray_` + name), its kind, tags and help text."""

    name: str
    kind: str  # gauge | counter
    tags: tuple[str, ...]
    help: str


STAGE = ("run", "stage")
METRICS = (
    MetricSpec("growpipe_stage_samples_per_second", "gauge", STAGE,
               "Samples the stage trained per second it was busy, in the last epoch"),
    MetricSpec("growpipe_stage_utilisation", "gauge", STAGE,
               "Share of the last epoch's wall time the stage was busy training (0-1)"),
    MetricSpec("growpipe_stage_inflight_packets", "gauge", STAGE,
               "Most packets the stage had handed on and the next stage had not finished, in the last epoch"),
    MetricSpec("growpipe_stage_hop_ms", "gauge", STAGE,
               "Median time from the previous stage handing a packet on to this stage starting it, last epoch"),
    MetricSpec("growpipe_exit_accuracy", "gauge", ("run", "exit"),
               "Test accuracy of the exit at this depth after the last epoch"),
    MetricSpec("growpipe_growth_events", "counter", ("run", "kind", "source"),
               "Blocks appended to the net (source: schedule, every_epochs, on_plateau or request)"),
)  # fmt: skip


def stage_points(run: str, stages: list[dict[str, Any]]) -> list[Point]:
    """An epoch's per-stage rows (StageStats.row()) as points; a stage that took no hop has no hop point."""
    points: list[Point] = []
    for s in stages:
        tags = {"run": run, "stage": str(s["stage"])}
        points += [
            ("growpipe_stage_samples_per_second", tags, float(s["samples_per_second"])),
            ("growpipe_stage_utilisation", tags, float(s["utilisation"])),
            ("growpipe_stage_inflight_packets", tags, float(s["max_inflight"])),
        ]
        if s["hop_ms_median"] is not None:
            points.append(("growpipe_stage_hop_ms", tags, float(s["hop_ms_median"])))
    return points


def exit_points(run: str, row: dict[str, Any]) -> list[Point]:
    """An epoch row's accuracy of every exit."""
    return [
        ("growpipe_exit_accuracy", {"run": run, "exit": str(depth)}, float(acc))
        for depth, acc in zip(row["exit_depths"], row["exit_accuracy"], strict=True)
    ]


def growth_points(run: str, event: dict[str, Any]) -> list[Point]:
    """A growth event: one more block of its kind from its source."""
    return [("growpipe_growth_events", {"run": run, "kind": event["kind"], "source": event["source"]}, 1.0)]


REFRESH_S = 1.0
"""How often the controller sets its gauges again: Ray's metrics agent drops a gauge series that no one set for
two report intervals (Ray floors the interval at 1 s; 10 s by default), and an epoch may take much longer."""


class RayMetrics(RunCallback):
    """Records the points above in the controller's process; Ray exports them (every few seconds, Ray's
    metrics_report_interval_ms). Gauges keep their newest values for as long as the controller lives."""

    def __init__(self, run: str):
        from ray.util.metrics import Counter, Gauge  # lazy: ray; growpipe.prepare imports this module for local runs

        self.run = run
        self.gauges = {m.name: Gauge(m.name, m.help, m.tags) for m in METRICS if m.kind == "gauge"}
        self.counters = {m.name: Counter(m.name, m.help, m.tags) for m in METRICS if m.kind == "counter"}
        self.latest: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()
        self._refresher: threading.Thread | None = None

    def after_epoch_stages(self, epoch: int, stages: list[dict[str, Any]]) -> None:
        self._record(stage_points(self.run, stages))

    def after_epoch(self, row: dict[str, Any]) -> None:
        self._record(exit_points(self.run, row))

    def on_growth(self, event: dict[str, Any]) -> None:
        self._record(growth_points(self.run, event))

    def _record(self, points: list[Point]) -> None:
        with self._lock:
            for name, tags, value in points:
                if name in self.gauges:
                    self.latest[(name, tuple(sorted(tags.items())))] = value
                else:
                    self.counters[name].inc(value, tags=tags)
        self._set_gauges()
        if self._refresher is None and self.latest:
            # a daemon thread: it ends with the controller's process, and the series some seconds after it
            self._refresher = threading.Thread(target=self._refresh, name="growpipe-metrics", daemon=True)
            self._refresher.start()

    def _set_gauges(self) -> None:
        """Every gauge set again with its newest value (a stage frozen below a prefix cache sets none itself)."""
        with self._lock:
            for (name, tag_items), value in self.latest.items():
                self.gauges[name].set(value, tags=dict(tag_items))

    def _refresh(self) -> None:
        while True:
            time.sleep(REFRESH_S)
            self._set_gauges()
