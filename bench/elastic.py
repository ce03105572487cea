"""Elastic benchmark: a run on a Ray cluster of three raylets on this machine (a head with no CPU, two
1-CPU workers, ray.cluster_utils.Cluster) loses the node of its second stage with no replacement, shrinks,
then spreads out again when a node joins. Reported:

  - seconds from the node loss to training again (shrunk), and from the join to spread again;
  - samples/s of the epochs spread (undisturbed run) against the epochs shrunk (one actor for both blocks);
  - test accuracy of the disturbed run against the undisturbed one (the maths is the same: equal).

    .venv/bin/growpipe bench elastic --quick --json-out bench/out/elastic-quick.json
    .venv/bin/python bench/elastic.py --repeats 3 --json-out bench/out/elastic.json
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import ray

from growpipe.config import RunConfig, build_config
from growpipe.fsutil import atomic_write_json


def bench_config(name: str, quick: bool, epochs: int, timeout_s: float, ckpt: str) -> RunConfig:
    """DASCPL, 2 MLP blocks on Fashion-MNIST (a smaller cut with --quick), one stage per node. Epochs must last
    longer than a raylet takes to join (a few seconds), or the run ends before it can spread out again."""
    limits = (4000, 1000) if quick else (12000, 2000)
    data = {"name": "fashion-mnist", "limit_train": limits[0], "limit_test": limits[1]}
    return build_config({
        "name": name, "method": "dascpl", "seed": 0, "threads": 1, "data": {**data, "batch_size": 64},
        "net": {"backbone": "mlp", "blocks": 2, "width": 256 if quick else 512}, "train": {"epochs": epochs},
        "tracking": {"mlflow": False}, "checkpoint": {"enabled": True, "uri": ckpt, "every_epochs": 1},
        "runtime": {"placement": "STRICT_SPREAD", "placement_timeout_s": timeout_s, "timeline_epoch": 0,
                    "dashboard": False},
    })  # fmt: skip


def _rate(rows: list[dict[str, Any]]) -> float | None:
    return statistics.median(r["samples_per_second"] for r in rows) if rows else None


def disturbed(cluster: Any, cfg: RunConfig, lose_after: int, join_after: int, keep_net: bool = False
              ) -> dict[str, Any]:  # fmt: skip
    """Train `cfg`; after epoch `lose_after` remove the node of stage 1 (no replacement); `join_after` epochs
    after the shrink add a node. Returns the result and the seconds loss -> shrunk, join -> spread (and, with
    `keep_net`, the trained net)."""
    from growpipe.runtime.pipeline import Pipeline

    lines: list[str] = []
    out: dict[str, Any] = {}
    with Pipeline(cfg) as p:
        thread = threading.Thread(target=lambda: out.setdefault("result", p.train(progress=lines.append)))
        thread.start()

        def wait(predicate: Any, what: str, timeout: float = 600) -> float:
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError(f"bench elastic: no {what} ({lines[-3:]})")
                time.sleep(0.05)
            return time.monotonic()

        status = lambda: ray.get(p.controller.status.remote())  # noqa: E731
        wait(lambda: status()["epoch"] > lose_after, f"epoch {lose_after + 1}")
        node = next(n for n in cluster.worker_nodes if n.node_id == status()["nodes"][1])
        lost = time.monotonic()  # before: remove_node returns once the node's processes exited, the run already waiting
        cluster.remove_node(node)
        shrunk = wait(lambda: any(x.startswith("topo   shrink") for x in lines), "shrink")
        shrunk_epoch = status()["epoch"]
        wait(lambda: status()["epoch"] > shrunk_epoch + join_after, "shrunk epochs")
        cluster.add_node(num_cpus=1)
        joined = time.monotonic()
        spread = wait(lambda: any(x.startswith("topo   expand") for x in lines), "expand")
        thread.join()
        if keep_net:
            out["net"] = p.final_net()
    result = out["result"]
    changes = result["topology_changes"]
    shrunk_rows = [h for h in result["history"] if changes[0]["epoch"] < h["epoch"] <= changes[1]["epoch"]]
    return {"result": result, "loss_to_training_s": shrunk - lost, "join_to_spread_s": spread - joined,
            "shrunk_samples_per_second": _rate(shrunk_rows), "net": out.get("net")}  # fmt: skip


def measure(cluster: Any, calm_cfg: RunConfig, disturbed_cfg: RunConfig, keep_net: bool = False) -> dict[str, Any]:
    """The undisturbed run of `calm_cfg` and the disturbed run of `disturbed_cfg` (the same run under another
    name) on `cluster`, its two workers up. With `keep_net` the row's "net" is the disturbed run's net."""
    from growpipe.runtime.pipeline import Pipeline

    with Pipeline(calm_cfg) as p:
        calm = p.train(progress=None)
    d = disturbed(cluster, disturbed_cfg, 1, 1, keep_net)
    spread_rate = _rate(calm["history"][1:])
    shrunk_rate = d["shrunk_samples_per_second"]
    row = {
        "loss_to_training_s": round(d["loss_to_training_s"], 2),
        "placement_timeout_s": disturbed_cfg.runtime.placement_timeout_s,
        "join_to_spread_s": round(d["join_to_spread_s"], 2),
        "spread_samples_per_second": round(spread_rate or 0, 1),
        "shrunk_samples_per_second": round(shrunk_rate or 0, 1),
        "shrunk_vs_spread": round((shrunk_rate or 0) / spread_rate, 3) if spread_rate else None,
        "test_accuracy_undisturbed": calm["test_accuracy"],
        "test_accuracy_disturbed": d["result"]["test_accuracy"],
        "topology_changes": d["result"]["topology_changes"],
        "restarts": d["result"]["restarts"],
    }
    return {**row, "net": d["net"]} if keep_net else row


FIGURES = ("loss_to_training_s", "join_to_spread_s", "spread_samples_per_second", "shrunk_samples_per_second",
           "shrunk_vs_spread", "test_accuracy_undisturbed", "test_accuracy_disturbed")  # fmt: skip


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (the first run's other fields)."""
    return {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in FIGURES}}


def _figures(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {row[k]:.4g}" for k in FIGURES)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from growpipe.runtime.raylets import raylet_cluster

    ap = argparse.ArgumentParser(description="Elastic benchmark: node lost (shrink), node joined (expand)")
    ap.add_argument("--quick", action="store_true", help="4,000 images, a 256-wide MLP (about a minute)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs of each run (8)")
    ap.add_argument("--timeout", type=float, default=5.0, help="runtime.placement_timeout_s (5)")
    ap.add_argument("--repeats", type=int, default=1, help="measure this many times; report each figure's median")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be 1 or more")
    t0 = time.perf_counter()
    runs = []
    with raylet_cluster() as cluster:
        for i in range(args.repeats):
            with tempfile.TemporaryDirectory() as ckpt:
                config = lambda name: bench_config(name, args.quick, args.epochs, args.timeout, ckpt)  # noqa: E731
                runs.append(measure(cluster, config("elastic-calm"), config("elastic-disturbed")))
            print(f"run {i + 1}/{args.repeats}: {_figures(runs[-1])}")
    row = {**median_row(runs), "runs": runs, "seconds": round(time.perf_counter() - t0, 1)}
    print(f"node lost -> training again (shrunk): {row['loss_to_training_s']} s "
          f"(placement_timeout_s {row['placement_timeout_s']:g})")  # fmt: skip
    print(f"node joined -> spread again: {row['join_to_spread_s']} s")
    print(f"samples/s spread {row['spread_samples_per_second']}, shrunk {row['shrunk_samples_per_second']} "
          f"(x{row['shrunk_vs_spread']})")  # fmt: skip
    print(f"test accuracy undisturbed {row['test_accuracy_undisturbed']:.4f}, disturbed "
          f"{row['test_accuracy_disturbed']:.4f}; done in {row['seconds']} s")  # fmt: skip
    if args.json_out:
        print(f"JSON: {atomic_write_json(args.json_out, row)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
