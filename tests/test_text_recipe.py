"""data.adapt: the text recipe's data-dependent choices (word pairs, word dropout) from the training split's
median document length: the pure choice, the tokenised bundle it shapes, block 0's spec, and the refusal."""

from __future__ import annotations

import pandas as pd
import pytest

from growpipe.config import DataSpec, load_config
from growpipe.data.frames import frames_to_bundle
from growpipe.nn.backbones import plan_encoders
from growpipe.nn.specs import InputInfo
from growpipe.text_recipe import SHORT_TEXT_WORDS, choose
from tests.conftest import tiny_config


def test_short_text_reads_word_pairs_and_keeps_every_word_long_text_keeps_the_config():
    short = choose(SHORT_TEXT_WORDS, ngrams=1)
    assert (short.ngrams, short.word_dropout) == (2, 0.0)
    assert short.describe() == ("recipe (data.adapt): median 32 words a training document, short text: "
                                "data.ngrams 2, net.word_dropout 0")  # fmt: skip
    long = choose(SHORT_TEXT_WORDS + 0.5, ngrams=1)
    assert (long.ngrams, long.word_dropout) == (1, None)
    assert long.describe().endswith("long text: data.ngrams 1, net.word_dropout as configured")


def _frames(words: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    docs = [" ".join(f"w{(i * 7 + j) % 40}" for j in range(words)) for i in range(20)]
    train = pd.DataFrame({"text": docs, "label": [i % 2 for i in range(20)]})
    return train, train.head(6)


@pytest.mark.parametrize("words, ngrams, word_dropout", [(5, 2, 0.0), (60, 1, 0.5)])
def test_the_bundle_and_block_0_follow_the_choice(words: int, ngrams: int, word_dropout: float):
    spec = DataSpec(name="parquet:x", adapt=True, max_len=1000)
    bundle = frames_to_bundle("x", *_frames(words), spec)
    assert bundle.vocab is not None and bundle.vocab.ngrams == ngrams
    assert bundle.input_shape == ((2 * words - 1,) if ngrams == 2 else (words,))
    assert f"data.ngrams {ngrams}" in bundle.summary()
    net = tiny_config(net={"backbone": "embedding", "word_dropout": 0.5}).net
    info = InputInfo.from_bundle(bundle)
    assert InputInfo.from_dict(info.to_dict()).word_dropout == info.word_dropout  # as a checkpoint keeps it
    assert plan_encoders(net, info)[0].params.get("word_dropout", 0.0) == word_dropout


def test_without_adapt_nothing_changes():
    bundle = frames_to_bundle("x", *_frames(5), DataSpec(name="parquet:x", max_len=1000))
    assert bundle.vocab is not None and bundle.vocab.ngrams == 1 and "recipe" not in bundle.summary()
    assert "word_dropout" not in InputInfo.from_bundle(bundle).to_dict()  # old checkpoints' inputs still match


def test_adapt_needs_the_bag_of_words_backbone():
    with pytest.raises(ValueError, match="data.adapt: .* net.backbone embedding reads .this net is lstm.; set "
                                         "data.adapt: false"):  # fmt: skip
        load_config(None, ["net.backbone=lstm", "data.adapt=true", "data.name=20newsgroups"])
