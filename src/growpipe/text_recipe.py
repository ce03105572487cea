"""The text recipe's choices that follow the data (data.adapt): decided from the training split's median words per
document alone, the same for every rule. Short texts (at most SHORT_TEXT_WORDS words: sentences, snippets,
subject lines) read word pairs too and keep every word in training; longer ones keep the configured n-grams and
word dropout. Pure functions: the data layer calls them when it tokenises, the net's spec when it builds block 0."""

from __future__ import annotations

from dataclasses import dataclass

SHORT_TEXT_WORDS = 32
"""A set whose median training document has at most this many words is short text (bench/RESULTS.md, "The text
recipe adapts": chosen on the validation splits of the tuning sets)."""


@dataclass(frozen=True)
class TextChoice:
    """What data.adapt chose for one set: the n-grams to read, and the word dropout block 0 trains with (None:
    net.word_dropout as configured)."""

    median_words: float
    ngrams: int
    word_dropout: float | None

    def describe(self) -> str:
        kind = "short text" if self.median_words <= SHORT_TEXT_WORDS else "long text"
        dropout = "as configured" if self.word_dropout is None else f"{self.word_dropout:g}"
        return (f"recipe (data.adapt): median {self.median_words:g} words a training document, {kind}: "
                f"data.ngrams {self.ngrams}, net.word_dropout {dropout}")  # fmt: skip


def choose(median_words: float, ngrams: int) -> TextChoice:
    """The choice for a training split with `median_words` words per document (`ngrams`: the config's, kept for
    long text)."""
    if median_words <= SHORT_TEXT_WORDS:
        return TextChoice(median_words, 2, 0.0)
    return TextChoice(median_words, ngrams, None)


def word_dropout_of(choice: TextChoice | None, configured: float) -> float:
    """The word dropout block 0 trains with: data.adapt's `choice` where it made one, else `configured`."""
    return configured if choice is None or choice.word_dropout is None else choice.word_dropout
