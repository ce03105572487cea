"""Pretrained word vectors (GloVe / word2vec text format, .txt or .txt.gz) for the embedding block."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import torch

from growpipe.data.text import Vocab
from growpipe.errors import DataError, DataNotFoundError

CONVERT = (
    "convert it to the text format, e.g. with gensim: KeyedVectors.load_word2vec_format(path, binary=True)"
    ".save_word2vec_format(out, binary=False)"
)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as raw:
            _refuse_binary(path, raw.read(1 << 16))
        fh: IO[str]
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            yield from enumerate(fh, start=1)
    except (OSError, EOFError) as e:
        raise DataError(f"net.word_vectors: cannot read {path} ({e}); re-download or point at a text file") from None


def _refuse_binary(path: Path, head: bytes) -> None:
    """DataError when the file starts as binary data (a NUL byte: binary word2vec's raw floats have them; text
    in any encoding has none, and stray non-UTF-8 bytes are read as replacement characters)."""
    if b"\0" in head:
        first = head.split(b"\n", 1)[0].split()
        w2v = len(first) == 2 and all(x.isdigit() for x in first)
        what = "binary word2vec" if w2v else "binary data"
        raise DataError(f"net.word_vectors: {path} is {what}, not a text vectors file; growpipe reads GloVe/word2vec "
                        f"text (.txt or .txt.gz): {CONVERT}")  # fmt: skip


def read_word_vectors(path: str | Path, vocab: Vocab, dim: int) -> tuple[torch.Tensor, int]:
    """An embedding matrix (len(vocab), dim): the file's vector for each vocabulary word found in it, the
    others drawn from N(0, std of the vectors found); <pad> is zero. Returns it and the number of words found.
    A word2vec header line ("count dim") is skipped. DataError naming the file, the line and the fix for a
    missing or empty file, a directory, a binary file, a malformed line, a dimension other than `dim`
    (net.embed_dim), or a non-finite value in a vector the vocabulary uses."""
    p = Path(path).expanduser()
    if p.is_dir():
        inside = sorted(p.glob("*.txt")) + sorted(p.glob("*.txt.gz"))
        hint = f", e.g. {inside[0]}" if inside else ""
        raise DataError(f"net.word_vectors: {p} is a directory; give the GloVe/word2vec text file (.txt or .txt.gz) "
                        f"itself{hint}")  # fmt: skip
    if not p.is_file():
        raise DataNotFoundError(f"net.word_vectors: {p} does not exist; give a GloVe/word2vec .txt or .txt.gz file")
    matrix = torch.zeros(len(vocab), dim)
    found = torch.zeros(len(vocab), dtype=torch.bool)
    seen_any = False
    for number, line in _lines(p):
        parts = line.rstrip("\n").rstrip().split(" ")
        if not parts or parts == [""]:
            continue
        if number == 1 and len(parts) == 2 and all(x.isdigit() for x in parts):
            continue  # word2vec's "count dim" header
        seen_any = True
        if len(parts) - 1 != dim:
            what = "is malformed" if len(parts) < 3 else f"has {len(parts) - 1} values"
            raise DataError(f"net.word_vectors: {p} line {number} {what} but net.embed_dim is {dim}; set "
                            f"net.embed_dim to the file's dimension or use a {dim}-d file")  # fmt: skip
        i = vocab.stoi.get(parts[0])
        if i is None or i < 2 or found[i]:  # not in the vocabulary, <pad>/<unk>, or a repeated word
            continue
        try:
            vector = torch.tensor([float(v) for v in parts[1:]])
        except ValueError:
            raise DataError(f"net.word_vectors: {p} line {number} holds a value that is not a number; fix or "
                            "remove the line") from None  # fmt: skip
        if not bool(torch.isfinite(vector).all()):
            bad = parts[1 + int(torch.nonzero(~torch.isfinite(vector))[0])]
            raise DataError(f"net.word_vectors: {p} line {number}: the vector of {parts[0]!r} holds {bad}; every "
                            "value must be a finite number: fix or remove the line")  # fmt: skip
        matrix[i] = vector
        found[i] = True
    if not seen_any:
        raise DataError(f"net.word_vectors: {p} holds no vectors; give a GloVe/word2vec text file")
    std = float(matrix[found].std()) if int(found.sum()) > 1 else 1.0
    rest = ~found
    rest[0] = False
    matrix[rest] = torch.randn(int(rest.sum()), dim, generator=torch.Generator().manual_seed(0)) * std
    return matrix, int(found.sum())
