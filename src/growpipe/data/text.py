"""Word-level tokenisation and a vocabulary built from the training split."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
PAD, UNK = 0, 1


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens (letters and digits, with inner apostrophes)."""
    return _TOKEN.findall(text.lower())


def terms(words: Sequence[str], ngrams: int = 1) -> list[str]:
    """A document's terms: its `words`, then (ngrams 2) each adjacent pair of them joined by a space."""
    if ngrams < 2:
        return list(words)
    return [*words, *(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))]


def kept_length(lengths: Sequence[int], cap: int, percentile: float | None) -> int:
    """Tokens to keep per document: `cap`, or the `percentile` of the documents' `lengths` in tokens (at most
    `cap`), and never more than the longest document (padding past it would hold no token): at least 4."""
    if not lengths:
        return cap
    ordered = sorted(lengths)
    at = ordered[-1]
    if percentile is not None:
        at = ordered[min(len(ordered) - 1, max(0, math.ceil(percentile / 100 * len(ordered)) - 1))]
    return max(4, min(cap, at))


class Vocab:
    """Maps words to ids: 0 is <pad>, 1 is <unk>, then the most frequent training words."""

    def __init__(self, words: Sequence[str], doc_freq: Sequence[int] | None = None, num_docs: int = 0,
                 ngrams: int = 1):  # fmt: skip
        self.ngrams = ngrams
        self.itos = ["<pad>", "<unk>", *words]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.doc_freq = list(doc_freq) if doc_freq is not None else [0] * len(words)
        self.num_docs = num_docs

    @classmethod
    def build(cls, texts: Iterable[str], size: int, min_count: int = 1, lengths: list[int] | None = None,
              ngrams: int = 1) -> Vocab:  # fmt: skip
        """The `size - 2` most frequent terms (words, and with `ngrams` 2 word pairs) of `texts` seen at least
        `min_count` times (ties broken by first appearance); each text's length in words is appended to
        `lengths` when given."""
        counts: Counter[str] = Counter()
        docs: Counter[str] = Counter()
        lengths = [] if lengths is None else lengths
        for t in texts:
            words = tokenize(t)
            toks = terms(words, ngrams)
            counts.update(toks)
            docs.update(set(toks))
            lengths.append(len(words))
        kept = [w for w, c in counts.most_common(max(size - 2, 0)) if c >= min_count]
        return cls(kept, [docs[w] for w in kept], len(lengths), ngrams)

    def idf(self) -> torch.Tensor:
        """Smoothed inverse document frequency per id, log((1 + N) / (1 + df)) + 1; 0 for <pad>, 1 for <unk>."""
        df = torch.tensor(self.doc_freq, dtype=torch.float32)
        words = torch.log((1.0 + self.num_docs) / (1.0 + df)) + 1.0
        return torch.cat([torch.tensor([0.0, 1.0]), words])

    def __len__(self) -> int:
        return len(self.itos)

    def width(self, max_len: int) -> int:
        """Term ids per document when `max_len` words are kept: the words, and with ngrams 2 their pairs."""
        return max_len if self.ngrams < 2 else 2 * max_len - 1

    def encode(self, texts: Sequence[str], max_len: int) -> torch.Tensor:
        """Term ids of the first `max_len` words of each text (words, then their pairs with ngrams 2),
        right-padded with 0: a (N, width(max_len)) long tensor."""
        out = torch.zeros(len(texts), self.width(max_len), dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [self.stoi.get(w, UNK) for w in terms(tokenize(text)[:max_len], self.ngrams)]
            if ids:
                out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out
