"""growpipe serve under a bounded load (issue 26): a server that follows a training job growing twice while
client threads send a fixed number of requests, then the latency and throughput of real early exit at
several thresholds on a trained Fashion-MNIST DASCPL net.

    .venv/bin/growpipe bench serve --json-out bench/out/serve.json
    .venv/bin/growpipe bench serve --quick

1. Follow: a `growpipe train` job in its own process on the same Ray (DASCPL MLP on stage actors, a
   checkpoint every epoch, two growth steps; it holds before its first batch until the load starts) is
   followed by `growpipe serve`'s follower (every new whole checkpoint deployed as the deployment's
   user_config); CLIENTS threads on 127.0.0.1 each send REQUESTS requests of ROWS raw test rows
   (keep-alive HTTP), stopping by themselves. Reported: p50 / p99 latency, requests/s, failed requests, per
   new checkpoint the seconds from its manifest being written to the first answer carrying it, the versions
   (blocks) that answered, and the mix of exit depths.
2. Thresholds: the shipped Fashion-MNIST DASCPL CNN (configs/fashion-mnist-dascpl.yaml, 4 epochs on 20k rows)
   served alone; for each threshold the same fixed load, repeated: p50 / p99 latency and rows/s over HTTP with
   the rows as JSON numbers, rows/s with the rows as a base64 .npy array, rows/s through Serve's Python handle
   (arrays, no HTTP), each against the full path (1.0); accuracy of the answers; mean exit depth.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import build_config  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.serve.request import encode_npy  # noqa: E402

THRESHOLDS = (1.0, 0.999, 0.99, 0.9, 0.85, 0.8, 0.7)


def raw_test_rows(bundle: Any, info: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `n` test rows as a user has them (the standardisation undone) and their labels."""
    x = bundle.test.x[:n].numpy().astype(np.float64)
    if info.normalize:
        shape = [1, -1] + [1] * (x.ndim - 2)
        x = x * np.asarray(info.normalize["std"]).reshape(shape) + np.asarray(info.normalize["mean"]).reshape(shape)
    return x.reshape(len(x), -1).astype(np.float32), bundle.test.y[:n].numpy()


class Load:
    """CLIENTS threads, each sending REQUESTS POST /predict over one keep-alive connection, the bodies in turn."""

    def __init__(self, port: int, bodies: list[bytes], clients: int, requests: int):
        self.port, self.bodies, self.clients, self.requests = port, bodies, clients, requests
        self.latencies: list[float] = []
        self.answers: list[tuple[float, dict[str, Any]]] = []  # (time answered, answer)
        self.failed: list[str] = []
        self.lock = threading.Lock()

    def _client(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        for i in range(self.requests):
            t0 = time.perf_counter()
            try:
                body = self.bodies[i % len(self.bodies)]
                conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200
            except OSError as e:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                ok, data = False, repr(e).encode()
            dt = time.perf_counter() - t0
            with self.lock:
                if ok:
                    self.latencies.append(dt)
                    self.answers.append((time.time(), json.loads(data)))
                else:
                    self.failed.append(data.decode(errors="replace")[:200])
        conn.close()

    def run(self) -> float:
        """Run the load to its end; its wall seconds."""
        threads = [threading.Thread(target=self._client) for _ in range(self.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    def summary(self, wall: float, rows: int) -> dict[str, Any]:
        lat = sorted(self.latencies)
        p50, p99 = (lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))]) if lat else (0.0, 0.0)
        depths = [d for _, a in self.answers for d in a["exit_depth"]]
        return {"requests": len(self.latencies) + len(self.failed), "failed": len(self.failed),
                "p50_ms": round(1000 * p50, 2), "p99_ms": round(1000 * p99, 2),
                "p99_over_p50": round(p99 / p50, 2) if p50 else None,
                "requests_per_s": round(len(self.latencies) / wall, 1), "rows_per_s": round(len(lat) * rows / wall, 1),
                "exit_depths": {str(d): depths.count(d) for d in sorted(set(depths))}}  # fmt: skip


def follow_phase(quick: bool, options: Any, tmp: Path, clients: int, requests: int) -> dict[str, Any]:
    """A growing training job followed under load."""
    from growpipe.checkpoint import CheckpointStore
    from growpipe.data import load_data
    from growpipe.nn.specs import InputInfo
    from growpipe.serve.deploy import follow
    from growpipe.serve.server import start
    from growpipe.serve.source import resolve

    job = {
        "method": "dascpl", "seed": 0, "name": "followed",
        "data": {"name": "digits" if quick else "fashion-mnist", "batch_size": 128,
                 "limit_train": None if quick else 20000, "limit_test": 1000},
        "net": {"backbone": "mlp", "blocks": 2, "width": 64 if quick else 1024},
        "train": {"epochs": 2}, "grow": {"schedule": [{"kind": "layer", "epochs": 2}, {"kind": "layer", "epochs": 2}]},
        "tracking": {"mlflow": False}, "runtime": {"cpus_per_stage": 0.5, "dashboard": False},
        "checkpoint": {"enabled": True, "uri": str(tmp / "checkpoints"), "every_epochs": 1, "keep": 3},
    }  # fmt: skip
    cfg = build_config(job)
    bundle = load_data(cfg.data, cfg.seed)
    rows = 16
    x, _ = raw_test_rows(bundle, InputInfo.from_bundle(bundle), rows)
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    gate = tmp / "gate"  # the job holds before its first training batch until the load starts (GROWPIPE_HOLD_AT)
    env = {**os.environ, "GROWPIPE_WORKDIR": str(tmp), "PYTHONPATH": str(REPO / "src"),
           "GROWPIPE_HOLD_AT": f"1:0:{gate}"}  # fmt: skip
    import ray

    cmd = [sys.executable, "-c", "import sys; from growpipe.cli import main; sys.exit(main(sys.argv[1:]))", "train",
           "--config", str(tmp / "job.yaml"), "--address", ray.get_runtime_context().gcs_address]  # fmt: skip
    log = (tmp / "job.log").open("w")
    store = CheckpointStore(str(tmp / "checkpoints"), "followed")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    written: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 600
        while not store.complete():  # serving starts from the job's first checkpoint
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the training job wrote no checkpoint: {(tmp / 'job.log').read_text()[-2000:]}")
            time.sleep(0.1)
        source = resolve("followed", None, None, str(tmp / "checkpoints"), None)
        start(source, options)
        stop, lines = threading.Event(), []
        follower = threading.Thread(target=follow, args=(source, options, lines.append, 0.2, stop.is_set))
        follower.start()

        def note_written() -> None:  # each checkpoint's manifest time, read while the job runs (keep prunes)
            while not stop.is_set():
                for ref in store.complete():
                    if Path(ref.path).name not in written:
                        written[Path(ref.path).name] = json.loads((Path(ref.path) / "manifest.json").read_text())[
                            "written_at"]  # fmt: skip
                time.sleep(0.05)

        watcher = threading.Thread(target=note_written)
        watcher.start()
        load = Load(options.port, [json.dumps({"inputs": x.tolist()}).encode()], clients, requests)
        load_start = time.time()
        gate.touch()
        wall = load.run()
        job_done = proc.poll() is not None
        stop.set()
        follower.join()
        watcher.join()
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        log.close()
    first_seen: dict[str, float] = {}
    for t, a in sorted(load.answers, key=lambda ta: ta[0]):
        first_seen.setdefault(a["version"]["checkpoint"], t)
    reloads = {
        name: round(first_seen[name] - w, 2)
        for name, w in sorted(written.items())
        if name in first_seen and w >= load_start
    }  # written while loaded (the first one started the server)
    blocks = sorted({a["version"]["blocks"] for _, a in load.answers})
    out = load.summary(wall, rows)
    out.update({"rows_per_request": rows, "clients": clients, "job_finished_during_load": job_done,
                "versions_answered": len(first_seen), "blocks_answered": blocks,
                "reload_seconds": reloads, "reload_seconds_median": round(statistics.median(reloads.values()), 2)
                if reloads else None, "checkpoints_written": len(written), "follower": lines})  # fmt: skip
    return out


def handle_rows_per_s(handle: Any, x: np.ndarray, rows: int, threshold: float, clients: int, requests: int) -> float:
    """Rows answered per second through Serve's Python handle (arrays, no HTTP or JSON): `clients` threads,
    `requests` calls each of `rows` rows."""
    chunks = [x[i : i + rows] for i in range(0, len(x) - rows + 1, rows)]

    def client() -> None:
        for i in range(requests):
            handle.predict.remote({"inputs": chunks[i % len(chunks)], "threshold": threshold}).result(timeout_s=120)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round(clients * requests * rows / (time.perf_counter() - t0), 1)


def threshold_phase(quick: bool, options: Any, tmp: Path, clients: int, requests: int, repeats: int,
                    epochs: int) -> list[dict[str, Any]]:  # fmt: skip
    """Latency and throughput of real early exit per threshold on one trained DASCPL net: the medians of
    `repeats` loads per threshold (and of the rows/s ratio to the full path within each repeat)."""
    from growpipe.checkpoint import save_net
    from growpipe.config import load_config
    from growpipe.local import train_local
    from growpipe.serve.deploy import deploy, serve_config, wait_until_serving
    from growpipe.serve.source import resolve

    sets = ["data.limit_test=5000", f"train.epochs={epochs}", "tracking.mlflow=false", "checkpoint.enabled=false"]
    if quick:
        sets += ["data.name=digits", "net.widths=[8,8,8,8]"]
    cfg = load_config(REPO / "configs/fashion-mnist-dascpl.yaml", sets)  # the shipped DASCPL CNN
    run = train_local(cfg, progress=None)
    ck = save_net(tmp / "net", run.net, cfg, run.result)
    source = resolve(None, str(ck), None, str(tmp), None)
    deploy(serve_config(source, options))
    wait_until_serving(source.ref)
    rows = 64
    x, y = raw_test_rows(run.bundle, run.net.info, len(run.bundle.test.y))
    rows = min(rows, len(x) // 8)

    def bodies(th: float, npy: bool = False) -> list[bytes]:
        def inputs(part: np.ndarray) -> Any:
            return encode_npy(part) if npy else part.tolist()

        return [json.dumps({"inputs": inputs(x[i : i + rows]), "threshold": th}).encode()
                for i in range(0, len(x) - rows + 1, rows)]  # fmt: skip

    from ray import serve

    from growpipe.serve.deploy import APP

    handle = serve.get_app_handle(APP)
    runs: dict[float, list[dict[str, Any]]] = {th: [] for th in THRESHOLDS}
    by_handle: dict[float, list[float]] = {th: [] for th in THRESHOLDS}
    by_npy: dict[float, list[float]] = {th: [] for th in THRESHOLDS}
    for _ in range(repeats):  # the thresholds in turn, each repeat: drift on a shared machine hits them alike
        for th in THRESHOLDS:
            load = Load(options.port, bodies(th)[:8], clients, requests)
            runs[th].append(load.summary(load.run(), rows))
            by_handle[th].append(handle_rows_per_s(handle, x[: rows * 8], rows, th, clients, requests))
            npy = Load(options.port, bodies(th, npy=True)[:8], clients, requests)
            by_npy[th].append(npy.summary(npy.run(), rows)["rows_per_s"])
            print(f"  threshold {th}: rows/s {runs[th][-1]['rows_per_s']} over HTTP (JSON numbers), {by_npy[th][-1]} "
                  f"(npy), {by_handle[th][-1]} by handle", flush=True)  # fmt: skip
    out = []
    for th in THRESHOLDS:
        correct = 0  # accuracy of this threshold's answers over the whole test split (outside the timing)
        conn = http.client.HTTPConnection("127.0.0.1", options.port, timeout=120)
        for i, body in enumerate(bodies(th)):
            conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            correct += int((np.asarray(answer["prediction"]) == y[i * rows : (i + 1) * rows]).sum())
        conn.close()
        timed = runs[th]
        depths: dict[str, int] = {}
        for t in timed:
            for d, n in t["exit_depths"].items():
                depths[d] = depths.get(d, 0) + n
        out.append({
            "threshold": th, "accuracy": round(correct / (len(x) // rows * rows), 4), "repeats": repeats,
            "failed": sum(t["failed"] for t in timed),
            **{k: statistics.median(t[k] for t in timed) for k in ("p50_ms", "p99_ms", "rows_per_s")},
            "p99_over_p50": statistics.median(t["p99_over_p50"] for t in timed),
            "rows_per_s_vs_full": round(statistics.median(
                t["rows_per_s"] / f["rows_per_s"] for t, f in zip(timed, runs[1.0], strict=True)), 3),
            "npy_rows_per_s": statistics.median(by_npy[th]),
            "npy_rows_per_s_vs_full": round(statistics.median(
                h / f for h, f in zip(by_npy[th], by_npy[1.0], strict=True)), 3),
            "handle_rows_per_s": statistics.median(by_handle[th]),
            "handle_rows_per_s_vs_full": round(statistics.median(
                h / f for h, f in zip(by_handle[th], by_handle[1.0], strict=True)), 3),
            "mean_exit_depth": round(sum(int(d) * n for d, n in depths.items()) / sum(depths.values()), 3),
        })  # fmt: skip
    for row in out:
        row["points_vs_full"] = round(100 * (row["accuracy"] - out[0]["accuracy"]), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="digits, tiny nets, a few requests")
    ap.add_argument("--clients", type=int, default=4, help="client threads (default %(default)s)")
    ap.add_argument("--requests", type=int, default=1500,
                    help="requests per client while following the job (default %(default)s)")  # fmt: skip
    ap.add_argument("--threshold-requests", type=int, default=50,
                    help="requests per client at each threshold (default %(default)s)")  # fmt: skip
    ap.add_argument("--epochs", type=int, default=10,
                    help="epochs of the threshold phase's net (the shipped config's 10 by default)")  # fmt: skip
    ap.add_argument("--phases", default="follow,thresholds", help="which phases to run (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="loads per threshold, the median kept (default %(default)s)")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port of the server (default %(default)s)")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    import ray

    from growpipe.serve.deploy import ServeOptions, port_problem

    if problem := port_problem("127.0.0.1", args.port):
        print(f"bench serve: {problem}", file=sys.stderr)
        return 2
    requests = 10 if args.quick else args.requests
    options = ServeOptions(port=args.port, cpus_per_replica=1.0)
    owns = not ray.is_initialized()
    if owns:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # the job's stages and the replicas
    try:
        with tempfile.TemporaryDirectory(prefix="growpipe-bench-serve-") as tmp:
            followed = thresholds = None
            if "follow" in args.phases:
                followed = follow_phase(args.quick, options, Path(tmp), args.clients, requests)
                f = followed
                print(f"follow: {f['requests']} requests, {f['failed']} failed, p50 {f['p50_ms']} ms, p99 "
                      f"{f['p99_ms']} ms, {f['requests_per_s']} req/s; versions answered {f['versions_answered']} "
                      f"(blocks {f['blocks_answered']}), reload median {f['reload_seconds_median']} s, job finished "
                      f"during the load: {f['job_finished_during_load']}")  # fmt: skip
            if "thresholds" in args.phases:
                quick = args.quick
                thresholds = threshold_phase(quick, options, Path(tmp), args.clients,
                                             10 if quick else args.threshold_requests, 1 if quick else args.repeats,
                                             1 if quick else args.epochs)  # fmt: skip
            for r in thresholds or []:
                print(f"threshold {r['threshold']}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms (x{r['p99_over_p50']}),"
                      f" {r['rows_per_s']} rows/s ({r['rows_per_s_vs_full']}x the full path; npy "
                      f"{r['npy_rows_per_s_vs_full']}x, by handle {r['handle_rows_per_s_vs_full']}x), accuracy "
                      f"{r['accuracy']} ({r['points_vs_full']:+} points), depth {r['mean_exit_depth']}")  # fmt: skip
    finally:
        from ray import serve

        serve.shutdown()
        if owns:
            ray.shutdown()
    out = {"clients": args.clients, "follow": followed, "thresholds": thresholds}
    if args.json_out:
        print(f"JSON: {atomic_write_json(args.json_out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
