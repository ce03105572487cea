"""Where the text recipe falls short of the bar (issue 28): a linear model on exactly the net's own input, and
the recipe's first block (the TF-IDF-weighted bag of word embeddings, its dropout and word dropout) with a linear
classifier on it, trained with Adam and with SGD, on the same rows.

    .venv/bin/python bench/text_ceiling.py --data bench/out/text-sets/news-pair --json-out bench/out/ceiling.json
    .venv/bin/python bench/text_ceiling.py --data bench/out/text-sets/news-pair --quick

The net's input is the run's own: configs/text.yaml's vocabulary, lengths and validation hold-out, read by
growpipe's loader. The linear model is scikit-learn's logistic regression on the bag's TF-IDF weights (sublinear
term frequency times the run's IDF, L2-normalised), so it sees what block 1 sees. The bag is growpipe's own
encoder (net.pooling tfidf, net.dropout, net.word_dropout or data.adapt's choice) with a linear classifier,
trained end to end for --epochs with batch data.batch_size; per optimizer and seed it reports the last epoch's
test accuracy and the best epoch's (picked on the test set: a ceiling, not a result). Prints a Markdown table and
writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import load_config  # noqa: E402
from growpipe.data import load_data  # noqa: E402
from growpipe.errors import GrowpipeError  # noqa: E402
from growpipe.fsutil import atomic_write_json  # noqa: E402
from growpipe.nn.backbones import EmbeddingEncoder, tfidf_weights  # noqa: E402
from growpipe.text_recipe import word_dropout_of  # noqa: E402

OPTIMIZERS = {"adam": 1e-3, "sgd": 0.05}  # the recipe's Adam; SGD (momentum 0.9) at the rate that suited it
C_VALUES = (1.0, 10.0, 100.0)
QUICK = ("data.limit_train=300", "data.limit_test=200")


def tfidf_rows(ids: torch.Tensor, idf: torch.Tensor, chunk: int = 512) -> Any:
    """The bag's weights per document (growpipe.nn.backbones.tfidf_weights, what EmbeddingEncoder's tfidf
    pooling weights its embeddings by) as a scipy CSR matrix, `chunk` documents at a time."""
    import scipy.sparse as sp

    parts = [sp.csr_matrix(tfidf_weights(part, idf)[0].numpy()) for part in ids.split(chunk)]
    return sp.vstack(parts, format="csr")


def linear_ceiling(xtr: Any, ytr: np.ndarray, xte: Any, yte: np.ndarray, c: float) -> float:
    """Test accuracy of logistic regression (C=c) fitted on the bag's own TF-IDF rows."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, solver="saga", tol=1e-3, max_iter=500, random_state=0).fit(xtr, ytr)
    return float(np.mean(model.predict(xte) == yte))


def train_bag(bundle: Any, cfg: Any, optimizer: str, seed: int, epochs: int) -> list[float]:
    """growpipe's TF-IDF bag (the config's vocabulary, width, dropout and word dropout) with a linear classifier,
    trained end to end with `optimizer`: the test accuracy after each epoch."""
    torch.manual_seed(seed)
    vocab = len(bundle.vocab)
    bag = EmbeddingEncoder(vocab, cfg.net.embed_dim, 0, cfg.net.dropout, pooling="tfidf",
                           word_dropout=word_dropout_of(bundle.text_choice, cfg.net.word_dropout))  # fmt: skip
    bag.idf.copy_(bundle.vocab.idf()[:vocab])
    model = nn.ModuleDict({"bag": bag, "cls": nn.Linear(cfg.net.embed_dim, bundle.num_classes)})
    lr = OPTIMIZERS[optimizer]
    opt = (torch.optim.Adam(model.parameters(), lr=lr) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))  # fmt: skip
    order = torch.Generator().manual_seed(seed)
    xtr, ytr, xte, yte = bundle.train.x, bundle.train.y, bundle.test.x, bundle.test.y
    accuracies = []
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(ytr), generator=order).split(cfg.data.batch_size):
            opt.zero_grad(set_to_none=True)
            logits = model["cls"](model["bag"](xtr[idx])[0])
            nn.functional.cross_entropy(logits, ytr[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            accuracies.append(float((model["cls"](model["bag"](xte)[0]).argmax(1) == yte).float().mean()))
    return accuracies


def positive(text: str) -> int:
    """argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench" / "out" / "text-sets" / "news-pair"),
                    help="20newsgroups or a directory with train.parquet and test.parquet (the default: news-pair, "
                         "written by bench/text_sets.py)")  # fmt: skip
    ap.add_argument("--config", default=str(REPO / "configs" / "text.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override (as growpipe train --set)")  # fmt: skip
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of the bag's runs")
    ap.add_argument("--epochs", type=positive, default=16)
    ap.add_argument("--threads", type=positive, default=1, help="torch threads")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {' '.join(QUICK)}, 2 epochs, one seed")
    ap.add_argument("--json-out", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.data if args.data == "20newsgroups" else f"parquet:{Path(args.data).resolve()}"
    overrides = [f"data.name={data}", *(QUICK if args.quick else ()), *args.overrides]
    try:
        seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: {args.seeds!r} is not comma-separated integers; give e.g. 0,1,2")
    epochs = 2 if args.quick else args.epochs
    try:
        cfg = load_config(args.config, overrides)
        if cfg.net.backbone != "embedding" or cfg.net.pooling != "tfidf":
            raise GrowpipeError("the config's block 1 is not a TF-IDF bag; give net.backbone=embedding "
                                "net.pooling=tfidf (configs/text.yaml)")  # fmt: skip
        bundle = load_data(cfg.data, cfg.seed)
    except GrowpipeError as e:
        print(f"text_ceiling.py: {e}", file=sys.stderr)
        return 2
    ytr, yte = bundle.train.y.numpy(), bundle.test.y.numpy()
    xtr, xte = (tfidf_rows(s.x, bundle.vocab.idf()) for s in (bundle.train, bundle.test))
    rows: list[dict[str, Any]] = []
    print(f"{args.data}: {len(ytr)} training rows, {len(yte)} test rows, {len(bundle.vocab)} terms\n")
    print("| model | test acc (last epoch) | best epoch's | seconds |\n| --- | --- | --- | --- |")
    for c in C_VALUES:
        start = time.perf_counter()
        acc = linear_ceiling(xtr, ytr, xte, yte, c)
        rows.append({"model": f"logreg C={c:g} on the bag's inputs", "test_accuracy": round(acc, 4)})
        print(f"| {rows[-1]['model']} | {acc:.4f} |  | {time.perf_counter() - start:.1f} |", flush=True)
    for name, lr in OPTIMIZERS.items():
        start = time.perf_counter()
        curves = [train_bag(bundle, cfg, name, seed, epochs) for seed in seeds]
        last = statistics.mean(c[-1] for c in curves)
        best = statistics.mean(max(c) for c in curves)
        model = f"bag + linear, {name} lr {lr:g}, {epochs} epochs, mean of {len(seeds)} seeds"
        rows.append({"model": model, "optimizer": name, "lr": lr, "seeds": seeds, "epochs": epochs,
                     "test_accuracy": round(last, 4), "best_epoch_accuracy": round(best, 4),
                     "curves": [[round(a, 4) for a in c] for c in curves]})  # fmt: skip
        print(f"| {model} | {last:.4f} | {best:.4f} | {time.perf_counter() - start:.1f} |", flush=True)
    if args.json_out:
        settings = {
            "config": str(args.config),
            "overrides": overrides,
            "word_dropout": word_dropout_of(bundle.text_choice, cfg.net.word_dropout),
            "ngrams": bundle.text_choice.ngrams if bundle.text_choice else cfg.data.ngrams,
            "dropout": cfg.net.dropout,
            "embed_dim": cfg.net.embed_dim,
            "batch_size": cfg.data.batch_size,
        }
        atomic_write_json(args.json_out, {"set": args.data, "settings": settings, "rows": rows})
        print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
