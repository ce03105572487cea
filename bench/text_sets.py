"""Text sets derived offline from the 20 Newsgroups parquet files, so the text recipe (configs/text.yaml) can be
measured on more than one kind of text (issue 28):

- news-leads: every document cut to its first --lead-words words (default 16): a short-text set, 20 classes;
  documents left empty are dropped.
- news-pair: the documents of two groups (--pair A,B, default comp.sys.ibm.pc.hardware vs
  comp.sys.mac.hardware, a hard pair), labels re-indexed to 0 (A) and 1 (B).

    .venv/bin/python bench/text_sets.py --out bench/out/text-sets
    .venv/bin/python bench/text_sets.py --out bench/out/text-sets --sets news-pair --pair sci.med,sci.space

Each set is a directory OUT/SET with train.parquet and test.parquet (text, label, label_name), written whole or
not at all; train on one with --set data.name=parquet:OUT/SET. Prints per set and split the rows, classes and
median / 95th-percentile words. The source (--source, default: where growpipe finds 20newsgroups) needs the
columns text, label, label_name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from growpipe.config import DataSpec  # noqa: E402
from growpipe.data.sources import NEWSGROUPS_FILES, locate  # noqa: E402
from growpipe.errors import ConfigError, DataError, GrowpipeError  # noqa: E402
from growpipe.fsutil import atomic_write_dir  # noqa: E402

COLUMNS = ("text", "label", "label_name")
DEFAULT_PAIR = ("comp.sys.ibm.pc.hardware", "comp.sys.mac.hardware")
Frames = dict[str, pd.DataFrame]  # split name -> rows


def leads(frames: Frames, words: int) -> Frames:
    """Every document cut to its first `words` words; documents left empty dropped."""
    out = {}
    for split, f in frames.items():
        text = f["text"].map(lambda t: " ".join(str(t).split()[:words]))
        out[split] = f.assign(text=text)[text.str.len() > 0].reset_index(drop=True)
    return out


def pair(frames: Frames, a: str, b: str) -> Frames:
    """The documents of groups `a` and `b` (label_name), labelled 0 and 1."""
    known = sorted(set(frames["train"]["label_name"]))
    unknown = [g for g in (a, b) if g not in known]
    if unknown:
        raise ConfigError(f"--pair: {', '.join(unknown)} not a group of the source; choose from {', '.join(known)}")
    if a == b:
        raise ConfigError(f"--pair: give two different groups, not {a} twice")
    out = {}
    for split, f in frames.items():
        kept = f[f["label_name"].isin((a, b))]
        out[split] = kept.assign(label=(kept["label_name"] == b).astype("int64")).reset_index(drop=True)
    return out


def read_source(source: Path | None) -> Frames:
    """train and test of the 20 Newsgroups parquet files in `source` (None: where growpipe finds them)."""
    root = source if source is not None else locate(DataSpec(name="20newsgroups"), "20newsgroups", NEWSGROUPS_FILES)
    missing = [f for f in NEWSGROUPS_FILES if not (root / f).is_file()]
    if missing:
        raise DataError(f"--source: {root} lacks {', '.join(missing)}; point it at the 20newsgroups parquet directory")
    frames = {}
    for split in ("train", "test"):
        f = pd.read_parquet(root / f"{split}.parquet")
        if absent := [c for c in COLUMNS if c not in f.columns]:
            raise DataError(f"{root / f'{split}.parquet'}: no column {', '.join(absent)}; the source needs {COLUMNS}")
        frames[split] = f[list(COLUMNS)]
    return frames


def word_stats(frames: Frames) -> list[dict]:
    """Per split: rows, classes, median and 95th-percentile words per document."""
    rows = []
    for split, f in frames.items():
        words = f["text"].str.split().str.len().to_numpy()
        rows.append({"split": split, "rows": len(f), "classes": int(f["label"].nunique()),
                     "median_words": float(np.median(words)) if len(words) else 0.0,
                     "p95_words": float(np.percentile(words, 95)) if len(words) else 0.0})  # fmt: skip
    return rows


def write_set(out: Path, frames: Frames) -> Path:
    """OUT with train.parquet and test.parquet, swapped in whole (a failure leaves any earlier OUT as it was)."""

    def fill(tmp: Path) -> None:
        for split, f in frames.items():
            f.to_parquet(tmp / f"{split}.parquet", index=False)

    return atomic_write_dir(out, fill)


def write_sets(out: Path, made: dict[str, Frames]) -> None:
    """Each set as OUT/NAME (write_set), then a table of their rows, classes and words, and where each went."""
    written = [write_set(out / name, frames) for name, frames in made.items()]
    print("| set | split | rows | classes | median words | p95 words |\n| --- | --- | --- | --- | --- | --- |")
    for name, frames in made.items():
        for r in word_stats(frames):
            print(f"| {name} | {r['split']} | {r['rows']:,} | {r['classes']} | {r['median_words']:g} | "
                  f"{r['p95_words']:g} |")  # fmt: skip
    for path in written:
        print(f"wrote {path}: train on it with --set data.name=parquet:{path}")


def parse_pair(raw: str) -> tuple[str, str]:
    """--pair A,B as two group names."""
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--pair {raw!r}: give two groups as A,B, e.g. --pair {','.join(DEFAULT_PAIR)}")
    return parts[0], parts[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR", help="where the set directories go (DIR/SET)")
    ap.add_argument("--sets", default="news-leads,news-pair", help="comma-separated, of: news-leads, news-pair")
    ap.add_argument("--source", type=Path, metavar="DIR", help="20newsgroups train/test.parquet (default: found)")
    ap.add_argument("--lead-words", type=int, default=16, metavar="N", help="news-leads: words kept (default 16)")
    ap.add_argument("--pair", default=",".join(DEFAULT_PAIR), metavar="A,B", help="news-pair: the two groups")
    args = ap.parse_args(argv)
    try:
        makers: dict[str, Callable[[Frames], Frames]] = {
            "news-leads": lambda f: leads(f, args.lead_words),
            "news-pair": lambda f: pair(f, *parse_pair(args.pair)),
        }
        names = [s.strip() for s in args.sets.split(",") if s.strip()]
        unknown = [s for s in names if s not in makers]
        if unknown or not names:
            raise ConfigError(
                f"--sets: {', '.join(unknown) or 'nothing given'} not known; choose from {', '.join(makers)}"
            )
        if args.lead_words < 1:
            raise ConfigError(f"--lead-words {args.lead_words}: keep at least 1 word, e.g. --lead-words 16")
        if args.source is not None and not args.source.is_dir():
            raise DataError(f"--source: {args.source} is not a directory; give the 20newsgroups parquet directory")
        source = read_source(args.source)
        made = {name: makers[name](source) for name in names}  # every set checked before any is written
    except GrowpipeError as e:
        print(f"text_sets.py: {e}", file=sys.stderr)
        return 2
    write_sets(Path(args.out), made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
