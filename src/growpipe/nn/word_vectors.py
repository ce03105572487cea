"""Pretrained word vectors (GloVe / word2vec text format, .txt or .txt.gz) for the embedding block."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import torch

from growpipe.data.text import Vocab
from growpipe.errors import DataError, DataNotFoundError


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        fh: IO[str]
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:  # type: ignore[operator]
            yield from enumerate(fh, start=1)
    except (OSError, EOFError) as e:
        raise DataError(f"net.word_vectors: cannot read {path} ({e}); re-download or point at a text file") from None


def read_word_vectors(path: str | Path, vocab: Vocab, dim: int) -> tuple[torch.Tensor, int]:
    """An embedding matrix (len(vocab), dim): the file's vector for each vocabulary word found in it, the
    others drawn from N(0, std of the vectors found); <pad> is zero. Returns it and the number of words found.
    A word2vec header line ("count dim") is skipped. DataError naming the file, the line and the fix for a
    missing or empty file, a malformed line, or a dimension other than `dim` (net.embed_dim)."""
    p = Path(path).expanduser()
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
            matrix[i] = torch.tensor([float(v) for v in parts[1:]])
        except ValueError:
            raise DataError(f"net.word_vectors: {p} line {number} holds a value that is not a number; fix or "
                            "remove the line") from None  # fmt: skip
        found[i] = True
    if not seen_any:
        raise DataError(f"net.word_vectors: {p} holds no vectors; give a GloVe/word2vec text file")
    std = float(matrix[found].std()) if int(found.sum()) > 1 else 1.0
    rest = ~found
    rest[0] = False
    matrix[rest] = torch.randn(int(rest.sum()), dim, generator=torch.Generator().manual_seed(0)) * std
    return matrix, int(found.sum())
