"""What a checkpoint at every epoch costs the Ray pipeline outside training, with checkpoint.asynchronous on, off
(each checkpoint written before the run goes on) and with checkpoints off.

The probe of issue 40: DASCPL, a 2-block MLP of width 4096 (one layer per block, a stage actor each) on 3,000
Fashion-MNIST training images and 100 (--test-rows) test images, a checkpoint every epoch (keep 1). For every
epoch after the first, from its row: `seconds` (training), `eval_seconds`, `checkpoint_seconds` (the time the
run waited for its checkpoint); the cost outside training is eval + checkpoint over the epoch's training time.
As a check on what the rows leave out, the same from the wall clock: the time between two epochs' lines (the
driver's clock) minus the later epoch's training. Medians over the epochs after the first, and over the runs;
the arms are interleaved (each repeat starts one arm later), the machine's load average is noted before and after.

    .venv/bin/python bench/checkpoint_cost.py --json-out bench/out/checkpoint_cost.json
    .venv/bin/python bench/checkpoint_cost.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.api import train  # noqa: E402
from growpipe.config import RunConfig, build_config  # noqa: E402

ARMS = ("async", "sync", "off")
"""checkpoint.asynchronous true, false, and checkpoint.enabled false."""


def run_config(arm: str, ck: str, width: int, train_rows: int, test_rows: int, epochs: int, data: str) -> RunConfig:
    """The probe's run for `arm`: checkpoints into `ck`, every epoch, keep 1."""
    return build_config({
        "method": "dascpl", "seed": 0, "threads": 1,
        "data": {"name": data, "batch_size": 64, "limit_train": train_rows, "limit_test": test_rows},
        "net": {"backbone": "mlp", "blocks": 2, "width": width, "layers_per_block": 1},
        "scpl": {"projector": "linear", "proj_dim": 64},
        "train": {"epochs": epochs},
        "tracking": {"mlflow": False},
        "checkpoint": {"enabled": arm != "off", "uri": ck, "every_epochs": 1, "keep": 1, "overwrite": True,
                       "asynchronous": arm == "async"},
        "runtime": {"cpus_per_stage": 1, "timeline_epoch": 0, "dashboard": False, "stage_timeout_s": 1800},
    })  # fmt: skip


def one_run(cfg: RunConfig) -> dict[str, Any]:
    """Train `cfg` on Ray; per epoch after the first its row's times and the wall clock between epoch lines."""
    seen: dict[int, float] = {}

    def progress(line: str) -> None:
        if line.startswith("epoch "):
            seen[int(line.split()[1].split("/")[0])] = time.perf_counter()

    t0 = time.perf_counter()
    result = train(cfg, runtime="ray", progress=progress, keep_net=False).result
    wall = time.perf_counter() - t0
    epochs = []
    for row in result["history"][1:]:
        e, train_s = row["epoch"], row["seconds"]
        outside = row["eval_seconds"] + row["checkpoint_seconds"]
        gap = seen[e] - seen[e - 1] - train_s if e in seen and e - 1 in seen else None
        epochs.append({
            "epoch": e, "train_seconds": round(train_s, 3), "eval_seconds": row["eval_seconds"],
            "checkpoint_seconds": row["checkpoint_seconds"], "outside_share": round(outside / train_s, 4),
            "wall_outside_share": None if gap is None else round(gap / train_s, 4),
        })  # fmt: skip
    return {"epochs": epochs, "wall_seconds": round(wall, 1), "test_accuracy": result["test_accuracy"],
            **{k: _median(epochs, k) for k in FIGURES}}  # fmt: skip


FIGURES = ("train_seconds", "eval_seconds", "checkpoint_seconds", "outside_share", "wall_outside_share")


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def load() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (others run tests on it too)."""
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="digits, width 64, 3 epochs (a check of the bench)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each arm, interleaved (default 1)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs per run (the first is left out of the medians)")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--train-rows", type=int, default=3000)
    ap.add_argument("--test-rows", type=int, default=100)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := [a for a in arms if a not in ARMS]:
        ap.error(f"--arms: {bad[0]!r} is not one of {', '.join(ARMS)}")
    if args.repeats < 1 or args.epochs < 2:
        ap.error("--repeats must be at least 1 and --epochs at least 2 (the first epoch is left out)")
    data, width, epochs = ("digits", 64, 3) if args.quick else ("fashion-mnist", args.width, args.epochs)
    train_rows, test_rows = (512, 100) if args.quick else (args.train_rows, args.test_rows)
    out: dict[str, Any] = {"width": width, "train_rows": train_rows, "test_rows": test_rows, "epochs": epochs,
                           "data": data, "cores": os.cpu_count(), "load_before": load(),
                           "runs": {a: [] for a in arms}}  # fmt: skip
    print(f"load average before: {out['load_before']} on {out['cores']} cores")
    with tempfile.TemporaryDirectory(prefix="growpipe-ckpt-cost-") as tmp:
        for r in range(args.repeats):
            for i in range(len(arms)):
                arm = arms[(i + r) % len(arms)]
                run = one_run(run_config(arm, tmp, width, train_rows, test_rows, epochs, data))
                out["runs"][arm].append(run)
                print(f"repeat {r + 1} {arm:>5}: train {run['train_seconds']:.2f}s, eval {run['eval_seconds']:.3f}s, "
                      f"ckpt {run['checkpoint_seconds']:.3f}s -> outside {run['outside_share']:.3f} of training "
                      f"(wall clock {run['wall_outside_share']}), load {load()}", flush=True)  # fmt: skip
    out["load_after"] = load()
    out["arms"] = {a: {k: _median(rs, k) for k in FIGURES} for a, rs in out["runs"].items()}
    print(f"medians over {args.repeats} run(s), epochs 2-{epochs}; load average after: {out['load_after']}")
    for arm, m in out["arms"].items():
        print(f"  {arm:>5}: outside training {m['outside_share']} of the training time (wall clock "
              f"{m['wall_outside_share']}); train {m['train_seconds']}s, eval {m['eval_seconds']}s, "
              f"checkpoint {m['checkpoint_seconds']}s")  # fmt: skip
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
