"""Grow-request latency benchmark: how long a running job takes to answer `request_growth` (what `growpipe grow`
calls) on every Ray engine: the local-learning pipeline (DASCPL), GPipe and 1F1B (method bp on stage actors) and
Ray Train DDP (method bp, 2 workers). Per engine one run trains in a background thread (digits, 2 MLP blocks of
64, checkpoints and tracking off) while N requests for a layer block go to it one after the other, each after
the previous one was answered and a pause (--pause) that lets the run settle. Reported per engine:

  - seconds from the call to the answer, p50 and p95 (nearest rank) over the requests;
  - where the engine paused for it: before a batch of the running epoch (the answer's `batch`), or at the end of
    the epoch (`batch` null), and whether the answer says `standby` (the block's actor was started ahead);
  - the new block's first training step, not timed directly: on a mid-epoch pause the epoch goes on at that
    batch as soon as the block is attached, which is when the answer is sent (so: the answer); on an epoch-end
    pause it is estimated as the answer, plus the frozen-prefix cache built before the next epoch (local-learning
    pipeline), plus how much longer the first epoch with the new block took than the epochs no growth touched
    (for DDP: the new Ray Train worker group starting). Both from the run's progress lines;
  - the pace of the blocks already training while a request's block is placed and built (`placed_s` of the
    answer, from its acceptance; when that takes 0.5 s or more): stage 0's batches per second then, over its pace
    in the 2 s before the call, sampled from the controller's `position()` every 50 ms (p50 and the lowest).

    .venv/bin/growpipe bench grow-latency --quick --json-out bench/out/grow_latency-quick.json
    .venv/bin/python bench/grow_latency.py --json-out bench/out/grow_latency.json
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import RunConfig, apply_overrides, build_config  # noqa: E402
from growpipe.errors import ConfigError, PipelineError  # noqa: E402
from growpipe.prepare import logical_cpus_needed  # noqa: E402
from growpipe.report import end_bench  # noqa: E402
from growpipe.runtime.client import request_growth  # noqa: E402
from growpipe.runtime.pipeline import Pipeline, connect  # noqa: E402

BLOCKS = 2
EPOCHS = 100_000  # more than any measurement lasts: the run is stopped after its requests
TAIL_EPOCHS = 2  # epochs no growth touches, trained after the last epoch-end growth (the estimate's baseline)
ENGINES: dict[str, dict[str, Any]] = {
    "pipeline": {"method": "dascpl"},
    "gpipe": {"method": "bp", "runtime": {"engine": "gpipe"}, "bp_pipeline": {"micro_batches": 2}},
    "1f1b": {"method": "bp", "runtime": {"engine": "1f1b"}, "bp_pipeline": {"micro_batches": 2}},
    "ddp": {"method": "bp", "runtime": {"engine": "ddp"}, "ddp": {"workers": 2}},
}
EPOCH_LINE = re.compile(r"^epoch +(\d+)/\d+ \|.* \| ([\d.]+)s(?: \||$)")
CACHE_LINE = re.compile(r"^cache  block (\d+) trains .* computed in ([\d.]+)s\)")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def bench_config(engine: str, requests: int, ckpt: str, overrides: list[str]) -> RunConfig:
    """A tiny digits run of `engine` that can grow by `requests` blocks (ConfigError on a bad --set)."""
    raw = {
        "name": f"bench-grow-latency-{engine}", "seed": 0, "threads": 1,
        "data": {"name": "digits", "batch_size": 64}, "net": {"backbone": "mlp", "blocks": BLOCKS, "width": 64},
        "train": {"epochs": EPOCHS}, "al": {"code_dim": 16}, "scpl": {"proj_dim": 16},
        "grow": {"max_blocks": BLOCKS + requests}, "tracking": {"mlflow": False},
        "checkpoint": {"enabled": False, "uri": ckpt},  # DDP keeps Ray Train's own checkpoints there
        "runtime": {"timeline_epoch": 0, "dashboard": False},
    }  # fmt: skip
    return build_config(apply_overrides(_merge(raw, ENGINES[engine]), overrides), overrides=overrides)


def nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class Background:
    """p.train() in a thread: its progress lines, each with the time it arrived, and its error."""

    def __init__(self, p: Pipeline):
        self.lines: list[tuple[float, str]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(p,), daemon=True)
        self.thread.start()

    def _run(self, p: Pipeline) -> None:
        try:
            p.train(progress=lambda line: self.lines.append((time.monotonic(), line)), keep_net=False)
        except BaseException as e:  # a stopped run ends in PipelineError("stopped: ..."): judged by the caller
            self.error = e

    def seconds(self, pattern: re.Pattern[str]) -> dict[int, float]:
        """{epoch: its training seconds} (EPOCH_LINE) or {block: seconds its prefix cache took} (CACHE_LINE), from
        the progress lines."""
        return {int(m.group(1)): float(m.group(2)) for _, line in list(self.lines) if (m := pattern.match(line))}

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if not self.thread.is_alive() or time.monotonic() > deadline:
                tail = [line for _, line in self.lines[-3:]]
                raise RuntimeError(f"bench grow_latency: no {what} ({self.error or 'timed out'}; last lines {tail})")
            time.sleep(0.05)


class Pace:
    """The run's pace: stage 0's batches sent so far, sampled from the controller's `position()` in a thread of
    its own every `every` seconds, as (time, cumulative batches) (local-learning pipeline: what the stages
    downstream train, bounded by the window)."""

    def __init__(self, controller: Any, every: float = 0.05):
        self.samples: list[tuple[float, float]] = []
        self._controller, self._every = controller, every
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                s = ray.get(self._controller.position.remote(), timeout=5)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError:  # the run is gone
                return
            # an epoch's last position is also what stage 0 says at the next one's start: skipped, not guessed
            if s.get("position") and 0 < s["position"][0] < s["position"][1]:
                done, total = s["position"]
                count = (s["epoch"] - 1) * total + done
                last = self.samples[-1][1] if self.samples else 0.0
                self.samples.append((time.monotonic(), max(float(count), last)))  # status reads two clocks

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


def rate(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Batches per second between t0 and t1, from (time, cumulative batches) samples (linearly interpolated);
    None when the samples do not cover the window."""
    if t1 <= t0 or not samples or samples[0][0] > t0 or samples[-1][0] < t1:
        return None

    def at(t: float) -> float:
        for (ta, ca), (tb, cb) in zip(samples, samples[1:], strict=False):
            if ta <= t <= tb:
                return ca if tb == ta else ca + (cb - ca) * (t - ta) / (tb - ta)
        return samples[-1][1]

    return (at(t1) - at(t0)) / (t1 - t0)


MIN_WINDOW_S = 0.5  # ten samples: a shorter placement (a standby that was up) has no pace worth the name


def placement_pace(rows: list[dict[str, Any]], samples: list[tuple[float, float]], before_s: float) -> None:
    """Fill each row's `pace_while_placing`: the run's pace while the request's block was placed and built (from
    the call to `placed_s` later) over its pace in the `before_s` seconds before the call (None: not measurable,
    or the placement took under MIN_WINDOW_S)."""
    for r in rows:
        t0, placed = r.pop("called_at"), r.get("placed_s")
        before = rate(samples, t0 - before_s, t0)
        during = rate(samples, t0, t0 + placed) if placed and placed >= MIN_WINDOW_S else None
        r["pace_while_placing"] = round(during / before, 3) if during is not None and before else None


def ask(name: str, i: int) -> dict[str, Any]:
    """One request for a layer block: its answer's fields and the seconds from the call to the answer."""
    t0 = time.monotonic()
    answer = request_growth(name, {"kind": "layer"}, timeout_s=600)
    seconds = time.monotonic() - t0
    return {"request": i, "answer_s": round(seconds, 3), "epoch": answer["epoch"], "batch": answer["batch"],
            "block": answer["block"], "standby": answer.get("standby"), "placed_s": answer.get("placed_s"),
            "called_at": t0}  # fmt: skip


def first_steps(rows: list[dict[str, Any]], seconds: dict[int, float], caches: dict[int, float]) -> float | None:
    """Fill each row's `first_step_s` (see the module docstring; after an epoch-end growth on the local-learning
    pipeline the frozen-prefix cache, `caches`, is built before the next epoch); the median seconds of an epoch
    no growth touched (None when there was none)."""
    touched = {r["epoch"] + 1 for r in rows}  # a growth's `epoch` counts the epochs finished before it
    clean = [s for e, s in seconds.items() if e >= 2 and e not in touched]  # epoch 1 also starts the workers
    base = statistics.median(clean) if clean else None
    for r in rows:
        after = seconds.get(r["epoch"] + 1)
        if r["batch"] is not None:
            r["first_step_s"] = r["answer_s"]  # the paused epoch goes on at that batch once the block is attached
        elif base is not None and after is not None:
            r["first_step_s"] = round(r["answer_s"] + caches.get(r["block"], 0.0) + max(0.0, after - base), 3)
        else:
            r["first_step_s"] = None
    return base


def measure(engine: str, cfg: RunConfig, requests: int, pause: float) -> dict[str, Any]:
    """One run of `cfg` sent `requests` grow requests, then stopped; the engine's figures."""
    assert cfg.name is not None
    load = os.getloadavg()[0]
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    with Pipeline(cfg) as p:
        run = Background(p)
        run.wait(lambda: ray.get(p.controller.status.remote(), timeout=30)["epoch"] >= 1, "training")
        pace, before_s = Pace(p.controller), min(pause, 2.0) or 1.0
        time.sleep(before_s + 0.2)  # a pace to compare the first request's with
        for i in range(1, requests + 1):
            rows.append(ask(cfg.name, i))
            r = rows[-1]
            where = f"batch {r['batch']} of epoch {r['epoch'] + 1}" if r["batch"] is not None else "the epoch's end"
            print(f"{engine}: request {i}/{requests} answered in {r['answer_s']:.2f} s (block {r['block']}, at "
                  f"{where}, standby {r['standby']})", flush=True)  # fmt: skip
            if i < requests:
                time.sleep(pause)  # the next standby starts meanwhile (3-4 s here: a shorter pause waits for it)
        if any(r["batch"] is None for r in rows):
            last = max(r["epoch"] for r in rows) + 1 + TAIL_EPOCHS
            run.wait(lambda: last in run.seconds(EPOCH_LINE), f"epoch {last}")
        pace.stop()
        p.stop("bench grow_latency: requests done")
        run.thread.join(timeout=120)
    if run.thread.is_alive() or not (isinstance(run.error, PipelineError) and "stopped" in str(run.error)):
        raise RuntimeError(f"bench grow_latency: the {engine} run did not end as stopped ({run.error})")
    seconds = run.seconds(EPOCH_LINE)
    placement_pace(rows, pace.samples, before_s)
    base = first_steps(rows, seconds, run.seconds(CACHE_LINE))
    return summary(engine, cfg, rows, base, {"seconds": round(time.monotonic() - start, 1), "load_1min":
                   [round(load, 2), round(os.getloadavg()[0], 2)], "epoch_seconds": seconds})  # fmt: skip


def summary(engine: str, cfg: RunConfig, rows: list[dict[str, Any]], epoch_s: float | None,
            extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    answers = [r["answer_s"] for r in rows]
    firsts = [r["first_step_s"] for r in rows if r["first_step_s"] is not None]
    places = {"mid-epoch" if r["batch"] is not None else "epoch end" for r in rows}
    standby = [r["standby"] for r in rows if r["standby"] is not None]
    paces = [r["pace_while_placing"] for r in rows if r.get("pace_while_placing") is not None]
    return {
        "engine": engine, "method": cfg.method, "requests": len(rows),
        "answer_p50_s": nearest_rank(answers, 0.5), "answer_p95_s": nearest_rank(answers, 0.95),
        "first_step_p50_s": nearest_rank(firsts, 0.5) if firsts else None,
        "first_step_p95_s": nearest_rank(firsts, 0.95) if firsts else None,
        "pauses_at": " and ".join(sorted(places)), "standby": f"{sum(standby)}/{len(standby)}" if standby else "n/a",
        "epoch_s": round(epoch_s, 2) if epoch_s is not None else None,
        "pace_while_placing_p50": nearest_rank(paces, 0.5) if paces else None,
        "pace_while_placing_min": min(paces) if paces else None, "rows": rows, **extra,
    }  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    def s(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    lines = ["| engine | requests | call -> answer p50 / p95 (s) | pauses at | call -> new block's first step "
             "p50 / p95 (s) | standby | epoch (s) | pace while placing p50 / min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in results:
        lines.append(f"| {r['engine']} ({r['method']}) | {r['requests']} | {s(r['answer_p50_s'])} / "
                     f"{s(r['answer_p95_s'])} | {r['pauses_at']} | {s(r['first_step_p50_s'])} / "
                     f"{s(r['first_step_p95_s'])} | {r['standby']} | {s(r['epoch_s'])} | "
                     f"{s(r['pace_while_placing_p50'])} / {s(r['pace_while_placing_min'])} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Grow-request latency per engine: call -> answer, p50 / p95")
    ap.add_argument("--quick", action="store_true", help="3 requests per engine instead of 10")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (%(default)s)")
    ap.add_argument("--requests", type=int, help="requests per engine (default 10, --quick 3)")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds from an answer to the next request (2)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of every engine's config, e.g. grow.standby=never")  # fmt: skip
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    if unknown := [e for e in engines if e not in ENGINES]:
        ap.error(f"--engines: unknown {unknown}; choose from {', '.join(ENGINES)}")
    requests = args.requests if args.requests is not None else (3 if args.quick else 10)
    if requests < 1 or args.pause < 0:
        ap.error("--requests must be 1 or more and --pause 0 or more")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as ckpt:
        try:
            configs = {e: bench_config(e, requests, ckpt, args.overrides) for e in engines}
        except ConfigError as e:
            ap.error(str(e))
        owns = False
        if not ray.is_initialized():  # one local Ray for every engine, room for the largest run and a standby
            cpus = max(logical_cpus_needed(c) for c in configs.values()) + 1
            owns, _ = connect(next(iter(configs.values())), cpus=cpus)
        try:
            results = [measure(e, configs[e], requests, args.pause) for e in engines]
        finally:
            if owns:
                ray.shutdown()
    print(table(results))
    out = {
        "engines": results,
        "settings": {"requests": requests, "pause_s": args.pause, "quantiles": "nearest rank", "overrides":
                     args.overrides, "data": "digits", "blocks": BLOCKS, "cpus": os.cpu_count()},
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    return end_bench(out, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
