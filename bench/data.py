"""Data benchmark: stage 0's input reader per format against the block it feeds.

The same Fashion-MNIST images (the IDX files, first N training images, 1,000 test) written as an image
folder (PNG), a Hugging Face dataset (save_to_disk, Image column: memory-mapped Arrow) and parquet (a
column of pixel lists). For each format, with and without augmentation (random_crop + hflip):

  - reader samples/s: one epoch of batches as stage 0 reads them (streamed formats: decoded by
    data.read_workers background threads), alone;
  - busy: one epoch of stage 0 training the Fashion-MNIST CNN's first block (32 channels, batch 128, one
    thread as a 1-CPU stage) on those batches: the block's step time over the wall time (1.0: the reader
    never keeps the block waiting);
  - peak RSS of a process that loads the data and reads one epoch, for 10x more images than the smaller
    size (image folder in memory and streamed, HF Arrow streamed);
  - load time (`load_data`, median of 3 after a first load) of 10x more images than the smaller size,
    streamed (image folder, HF Arrow, parquet pixel lists), with the default data.stats_rows sample and with
    every row (all).

    .venv/bin/growpipe bench data --quick --json-out bench/out/data-quick.json
    .venv/bin/python bench/data.py --json-out bench/out/data.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from growpipe.config import RunConfig, build_config
from growpipe.data import iterate_batches, load_data
from growpipe.fsutil import atomic_write_json

BATCH = 128
AUGMENT = ["random_crop", "hflip"]
RSS_SCRIPT = """
import sys
from growpipe.config import build_config
from growpipe.data import iterate_batches, load_data
cfg = build_config({"data": {"name": sys.argv[1], "stream": sys.argv[2] == "stream"}})
bundle = load_data(cfg.data)
for p in iterate_batches(bundle.train, 128, shuffle=True, seed=0, epoch=1):
    pass
print(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))  # KB; reset by exec
"""


def fashion(n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The n training and 1,000 test images (uint8, 28x28) and labels that data.limit_train / limit_test pick
    from the IDX files (the same seeded subset), so every format holds the IDX run's split."""
    from growpipe.data.bundle import Split, limit
    from growpipe.data.sources import FASHION_FILES, locate, read_idx

    root = locate(build_config({}).data, "fashion-mnist", list(FASHION_FILES.values()))
    arr = {k: read_idx(root / f) for k, f in FASHION_FILES.items()}

    def pick(x: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = torch.arange(len(y))
        idx = limit(Split(rows[:, None], rows), k).y.numpy()
        return x[idx], y[idx]

    return {"train": pick(arr["train_x"], arr["train_y"], n), "test": pick(arr["test_x"], arr["test_y"], 1000)}


def write_formats(work: Path, n: int) -> dict[str, str]:
    """data.name of each format holding the same images."""
    import datasets
    import pandas as pd
    from PIL import Image

    splits = fashion(n)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    hf = {}
    for split, (x, y) in splits.items():
        for i, (img, label) in enumerate(zip(x, y, strict=True)):
            d = work / f"folder-{n}" / split / f"{label:02d}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img, mode="L").save(d / f"{i:06d}.png")
        (work / f"parquet-{n}").mkdir(exist_ok=True)
        table = pd.DataFrame({"pixels": list(x.reshape(len(x), -1)), "label": y})
        table.to_parquet(work / f"parquet-{n}" / f"{split}.parquet")
        hf[split] = datasets.Dataset.from_dict({"image": [Image.fromarray(i, mode="L") for i in x],
                                                "label": y.tolist()}, features=features)  # fmt: skip
    datasets.DatasetDict(hf).save_to_disk(str(work / f"hf-{n}"))
    return {
        "in-memory (IDX)": "fashion-mnist",
        "image folder (PNG)": f"imagefolder:{work / f'folder-{n}'}",
        "HF Arrow (Image column)": f"hf:{work / f'hf-{n}'}",
        "parquet (pixel lists)": f"parquet:{work / f'parquet-{n}'}",
    }


def data_config(name: str, n: int, augment: bool) -> RunConfig:
    extra = {"image_shape": [1, 28, 28]} if name.startswith("parquet:") else {}
    return build_config({
        "data": {"name": name, "limit_train": n, "limit_test": 1000, "batch_size": BATCH,
                 "augment": AUGMENT if augment else [], **extra},
        "net": {"backbone": "cnn", "blocks": 4, "widths": [32, 64, 128, 256]}, "method": "dascpl",
    })  # fmt: skip


def measure(name: str, n: int, augment: bool) -> dict[str, Any]:
    """Load seconds, reader samples/s alone, and stage 0's busy fraction training block 0 on the reader."""
    from growpipe.nn.methods import build_block
    from growpipe.nn.net import plan_blocks
    from growpipe.nn.specs import InputInfo

    cfg = data_config(name, n, augment)
    t0 = time.perf_counter()
    bundle = load_data(cfg.data, cfg.seed)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    samples = sum(p.batch_size for p in iterate_batches(bundle.train, BATCH, shuffle=True, epoch=1, augment=True))
    reader = samples / (time.perf_counter() - t0)
    info = InputInfo.from_bundle(bundle)
    block = build_block(cfg.rule(), plan_blocks(cfg.net, cfg.rule(), info)[0], info)
    busy = 0.0
    t0 = time.perf_counter()
    for p in iterate_batches(bundle.train, BATCH, shuffle=True, epoch=2, augment=True):
        s = time.perf_counter()
        block.train_step(p)
        busy += time.perf_counter() - s
    wall = time.perf_counter() - t0
    return {"load_s": round(load_s, 2), "reader_samples_per_second": round(reader), "block_samples_per_second":
            round(samples / busy), "busy": round(busy / wall, 3), "streamed": bundle.train.streamed}  # fmt: skip


def load_seconds(names: dict[int, str], stats_rows: int | str, repeats: int, **data: Any) -> dict[str, list[float]]:
    """Seconds of `load_data` (streamed, data.stats_rows as given) of each dataset in `names` (by training
    images): the first load (parquet/csv/json: Hugging Face's one-time conversion to Arrow, cached), then the
    median of `repeats` loads taken in turn, so that a busy spell of the machine hits every size."""
    times: dict[int, list[float]] = {n: [] for n in names}
    for _ in range(repeats + 1):
        for n, name in names.items():
            spec = build_config({"data": {"name": name, "stream": True, "stats_rows": stats_rows, **data}}).data
            t0 = time.perf_counter()
            load_data(spec, seed=0)
            times[n].append(time.perf_counter() - t0)
    return {"first_s": [round(times[n][0], 3) for n in names],
            "load_s": [round(float(np.median(times[n][1:])), 3) for n in names]}  # fmt: skip


def accuracy(name: str, n: int, epochs: int) -> dict[str, Any]:
    """Test accuracy and seconds of the reference trainer on `name`: DASCPL, the Fashion-MNIST CNN's first
    two blocks (32, 64 channels), seed 0."""
    from growpipe.local import train_local

    cfg = data_config(name, n, False)
    cfg.net = cfg.net.model_copy(update={"blocks": 2, "widths": [32, 64]})
    cfg.train.epochs, cfg.tracking.mlflow = epochs, False
    t0 = time.perf_counter()
    summary = train_local(cfg, progress=None).summary()
    return {"test_accuracy": round(summary["test_accuracy"], 4), "seconds": round(time.perf_counter() - t0, 1)}


def peak_rss_mb(name: str, how: str) -> float:
    """Peak RSS (MB) of a fresh process loading `name` (how: stream or memory) and reading an epoch."""
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, name, how], capture_output=True, text=True,
                         timeout=1800, check=True)  # fmt: skip
    return round(int(out.stdout.strip().splitlines()[-1]) / 1024, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Data benchmark: stage 0's reader per format against its block")
    ap.add_argument("--quick", action="store_true", help="1,000 training images (RSS: 500 and 5,000)")
    ap.add_argument("--images", type=int, help="training images per format (default 12,000; quick 1,000)")
    ap.add_argument("--rss-images", type=int, help="peak RSS for this many images and 10x (default 6,000; quick "
                    "500; 0: skip)")  # fmt: skip
    ap.add_argument("--load-images", type=int, help="load time (median of 3) for this many images and 10x, streamed "
                    "(default 6,000; quick 500; 0: skip)")  # fmt: skip
    ap.add_argument("--accuracy-epochs", type=int, default=0, help="also train the CNN's first two blocks this many "
                    "epochs from each format (reference trainer; 0: skip)")  # fmt: skip
    ap.add_argument("--json-out", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    n = args.images or (1000 if args.quick else 12000)
    small = args.rss_images if args.rss_images is not None else (500 if args.quick else 6000)
    rss_sizes = (small, 10 * small) if small else ()
    load = args.load_images if args.load_images is not None else (500 if args.quick else 6000)
    load_sizes = (load, 10 * load) if load else ()
    torch.set_num_threads(1)  # a 1-CPU stage
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        names = write_formats(work, n)
        print(f"wrote {n} images in 4 formats in {time.perf_counter() - t0:.1f} s", flush=True)
        for fmt, name in names.items():
            for augment in (False, True):
                row = {"format": fmt, "augment": augment, **measure(name, n, augment)}
                rows.append(row)
                print(f"{fmt:<26} augment {'yes' if augment else 'no ':<3}  load {row['load_s']:>6.2f} s  reader "
                      f"{row['reader_samples_per_second']:>7} samples/s  block {row['block_samples_per_second']:>5} "
                      f"samples/s  busy {row['busy']:.2f}", flush=True)  # fmt: skip
        trained = {}
        for fmt, name in list(names.items())[: 3 if args.accuracy_epochs else 0]:  # IDX, folder, HF
            trained[fmt] = accuracy(name, n, args.accuracy_epochs)
            print(f"{fmt:<26} {args.accuracy_epochs} epochs: test accuracy {trained[fmt]['test_accuracy']:.4f} in "
                  f"{trained[fmt]['seconds']} s", flush=True)  # fmt: skip
        written = {k: write_formats(work, k) for k in {*rss_sizes, *load_sizes} if k != n} | {n: names}
        loads = []
        streamed = {"image folder (PNG)": {}, "HF Arrow (Image column)": {}, "parquet (pixel lists)": {
            "image_shape": [1, 28, 28]}}  # fmt: skip
        for fmt, extra in streamed.items() if load_sizes else ():
            for stats_rows in (build_config({}).data.stats_rows, "all"):
                got = load_seconds({k: written[k][fmt] for k in load_sizes}, stats_rows, 3, **extra)
                sizes, ratio = got["load_s"], round(got["load_s"][1] / got["load_s"][0], 3)
                loads.append({"format": fmt, "stats_rows": stats_rows, "images": list(load_sizes), **got,
                              "ratio": ratio})  # fmt: skip
                print(f"load {fmt} streamed, stats_rows {stats_rows}: {load_sizes[0]} images {sizes[0]} s, "
                      f"{load_sizes[1]} images {sizes[1]} s (x{ratio}; first loads {got['first_s']} s)",
                      flush=True)  # fmt: skip
        rss = []
        folder, arrow = "image folder (PNG)", "HF Arrow (Image column)"
        cases = [(folder, "memory"), (folder, "stream"), (arrow, "stream")] if rss_sizes else []
        for fmt, how in cases:
            sizes = [peak_rss_mb(written[k][fmt], how) for k in rss_sizes]
            ratio = round(sizes[1] / sizes[0], 3)
            rss.append({"format": fmt, "read": how, "images": list(rss_sizes), "peak_rss_mb": sizes, "ratio": ratio})
            print(f"peak RSS {fmt} {how}: {rss_sizes[0]} images {sizes[0]} MB, {rss_sizes[1]} images {sizes[1]} MB "
                  f"(x{ratio})", flush=True)  # fmt: skip
    out = {"images": n, "batch": BATCH, "rows": rows, "load": loads, "rss": rss, "accuracy": trained,
           "cpus": os.cpu_count(), "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    saved = f"; JSON: {atomic_write_json(args.json_out, out)}" if args.json_out else ""
    print(f"done in {out['seconds']} s{saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
