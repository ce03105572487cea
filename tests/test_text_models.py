"""Sequence models: pretrained word vectors and the seeds' text-model settings."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from growpipe.data.text import Vocab
from growpipe.errors import DataError
from growpipe.nn.packet import Packet
from growpipe.nn.word_vectors import read_word_vectors
from tests.conftest import assert_same_weights, tiny_config

VOCAB = Vocab(["ball", "goal", "cpu", "church"])


def _vectors(path: Path, lines: list[str]) -> Path:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def test_word_vectors_fill_the_vocabulary_words_they_hold_and_bad_files_are_named(tmp_path: Path):
    lines = ["ball 1 2 3", "cpu -1 0.5 0", "zebra 9 9 9", "ball 7 7 7"]
    for name, header in (("glove.txt", []), ("w2v.txt.gz", ["3 3"])):
        matrix, found = read_word_vectors(_vectors(tmp_path / name, header + lines), VOCAB, 3)
        assert found == 2 and matrix.shape == (len(VOCAB), 3)
        assert matrix[VOCAB.stoi["ball"]].tolist() == [1, 2, 3]  # the first vector of a repeated word
        assert matrix[VOCAB.stoi["cpu"]].tolist() == [-1, 0.5, 0]
        assert matrix[0].abs().sum() == 0 and matrix[VOCAB.stoi["goal"]].abs().sum() > 0  # <pad>; random rest

    with pytest.raises(DataError, match=r"wrong.txt line 2 has 2 values but net.embed_dim is 3; set net.embed_dim"):
        read_word_vectors(_vectors(tmp_path / "wrong.txt", ["ball 1 2 3", "cpu 1 2"]), VOCAB, 3)
    with pytest.raises(DataError, match=r"bad.txt line 1 holds a value that is not a number"):
        read_word_vectors(_vectors(tmp_path / "bad.txt", ["ball 1 x 3"]), VOCAB, 3)
    with pytest.raises(DataError, match=r"empty.txt holds no vectors"):
        read_word_vectors(_vectors(tmp_path / "empty.txt", []), VOCAB, 3)
    with pytest.raises(DataError, match=r"nowhere.txt does not exist; give a GloVe/word2vec"):
        read_word_vectors(tmp_path / "nowhere.txt", VOCAB, 3)
    with pytest.raises(Exception, match="word_vectors is for text backbones"):
        tiny_config(net={"word_vectors": str(tmp_path / "glove.txt")})


def test_word_vectors_that_would_train_on_garbage_or_are_not_a_text_file_are_refused(tmp_path: Path):
    for value in ("nan", "inf", "-inf", "NaN"):  # NaN losses before, exit 0
        path = _vectors(tmp_path / "holes.txt.gz", ["ball 1 2 3", f"cpu 1 {value} 3"])
        with pytest.raises(DataError) as e:
            read_word_vectors(path, VOCAB, 3)
        assert str(e.value) == (f"net.word_vectors: {path} line 2: the vector of 'cpu' holds {value}; every value "
                                "must be a finite number: fix or remove the line")  # fmt: skip
    _vectors(tmp_path / "glove.6B.3d.txt", ["ball 1 2 3"])
    with pytest.raises(DataError) as e:  # "does not exist" before
        read_word_vectors(tmp_path, VOCAB, 3)
    assert str(e.value) == (f"net.word_vectors: {tmp_path} is a directory; give the GloVe/word2vec text file (.txt "
                            f"or .txt.gz) itself, e.g. {tmp_path / 'glove.6B.3d.txt'}")  # fmt: skip
    floats = torch.arange(6, dtype=torch.float32).numpy().tobytes()
    binary = tmp_path / "w2v.bin"  # word2vec's binary layout: a text header, then each word and its raw floats
    binary.write_bytes(b"2 3\nball " + floats[:12] + b"\ncpu " + floats[12:] + b"\n")
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(range(256)) * 4)
    for path, what in ((binary, "binary word2vec"), (noise, "binary data")):  # "set net.embed_dim" before
        with pytest.raises(DataError) as e:
            read_word_vectors(path, VOCAB, 3)
        assert str(e.value).startswith(f"net.word_vectors: {path} is {what}, not a text vectors file; growpipe reads "
                                       "GloVe/word2vec text (.txt or .txt.gz): convert it")  # fmt: skip
    latin1 = tmp_path / "latin1.txt"  # text with a stray non-UTF-8 byte is still text
    latin1.write_bytes(b"caf\xe9 1 2 3\nball 1 2 3\n")
    assert read_word_vectors(latin1, VOCAB, 3)[1] == 1


def test_frozen_pretrained_embeddings_stay_as_loaded_while_the_net_trains(tmp_path: Path, text_dir: Path):
    from growpipe.local import train_local

    words = ["ball", "goal", "team", "cpu", "disk", "god", "church"]
    path = _vectors(tmp_path / "v.txt", [f"{w} " + " ".join(str(i + j / 10) for j in range(8)) for i, w in
                                         enumerate(words)])  # fmt: skip
    net = {"backbone": "transformer", "width": 16, "heads": 2, "embed_dim": 8, "word_vectors": str(path),
           "freeze_embeddings": True, "positions": "none", "final_norm": True, "ff_width": 16}  # fmt: skip
    cfg = tiny_config(method="scpl", data={"name": f"parquet:{text_dir}", "max_len": 16, "batch_size": 20}, net=net)
    trainer = train_local(cfg, progress=None)
    embed = trainer.net.blocks[0].modules["f"].embed
    vocab = trainer.bundle.vocab
    for i, w in enumerate(words):
        assert embed.weight[vocab.stoi[w]].tolist() == pytest.approx([i + j / 10 for j in range(8)])
    assert not embed.weight.requires_grad and trainer.net.blocks[1].steps > 0
    assert any("word vectors for 7 of" in n and "v.txt" in n for n in trainer.bundle.notes)
    layer = trainer.net.blocks[1].modules["f"]
    assert isinstance(layer.norm, torch.nn.LayerNorm) and layer.layers[0].linear1.out_features == 16


SEED_SETUPS = {  # config -> (text column, split names, extra columns) as the Hub datasets have them
    "agnews": ("text", ("train", "test"), {}),
    "dbpedia": ("content", ("train", "test"), {"title": "a title"}),
    "imdb": ("text", ("train", "test", "unsupervised"), {}),
    "sst2": ("sentence", ("train", "validation", "test"), {"idx": 0}),
}


@pytest.mark.parametrize("setup", sorted(SEED_SETUPS))
def test_the_seeds_text_setups_train_from_data_in_the_hub_layout(setup: str, tmp_path: Path):
    import datasets

    from growpipe.config import load_config
    from growpipe.local import train_local
    from tests.conftest import REPO, text_frames

    column, splits, extra = SEED_SETUPS[setup]
    train, test = text_frames(36, 12)
    parts = {}
    for split in splits:
        frame = train if split == "train" else test
        labels = [-1] * len(frame) if setup == "sst2" and split == "test" else frame["label"].tolist()  # hidden
        parts[split] = datasets.Dataset.from_dict({column: frame["text"].tolist(), "label": labels,
                                                   **{k: [v] * len(frame) for k, v in extra.items()}})  # fmt: skip
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / setup))
    small = ["net.width=12", "net.heads=2", "net.embed_dim=12", "net.ff_width=12", "net.blocks=2",
             "scpl.classifier_hidden=8", "train.epochs=1", "tracking.mlflow=false",
             "checkpoint.enabled=false"]  # fmt: skip
    cfg = load_config(REPO / "configs" / f"{setup}-scpl.yaml", [f"data.name=hf:{tmp_path / setup}", *small])
    summary = train_local(cfg, progress=None).summary()
    assert summary["blocks"] == 2 and 0.0 <= summary["test_accuracy"] <= 1.0
    if setup == "sst2":  # the hidden test labels would be refused; a split that is not there is named
        from growpipe.data import load_data

        with pytest.raises(DataError, match=r"data.test_split: .* has no split 'dev' \(it has train, validation"):
            load_data(load_config(REPO / "configs" / "sst2-scpl.yaml",
                                  [f"data.name=hf:{tmp_path / setup}", "data.test_split=dev"]).data)  # fmt: skip


def test_lstm_last_pooling_is_the_final_hidden_state_of_both_directions():
    from torch.nn.utils.rnn import pack_padded_sequence

    from growpipe.nn.backbones import LSTMEncoder

    torch.manual_seed(0)
    enc = LSTMEncoder(5, 4, 1, 0.0, pooling="last", packed=True)
    x = torch.randn(3, 6, 5)
    mask = torch.arange(6).unsqueeze(0) < torch.tensor([[6], [2], [4]])
    s, _ = enc(x, mask)
    _, (h, _) = enc.lstm(pack_padded_sequence(x, mask.sum(1), batch_first=True, enforce_sorted=False))
    assert torch.allclose(enc.pool(s, mask), (h[-2] + h[-1]) / 2, atol=1e-6)
    assert LSTMEncoder(5, 4, 1, 0.0).pool(s, mask).shape == (3, 8)  # mean: both directions side by side


def _lstm_config(text_dir: Path, **net):
    data = {"name": f"parquet:{text_dir}", "max_len": 16, "batch_size": 20}
    return tiny_config(method="dascpl", threads=1, data=data, train={"epochs": 2},
                       net={"backbone": "lstm", "blocks": 3, "width": 8, "embed_dim": 8, **net})  # fmt: skip


def test_lstm_blocks_hand_their_final_state_on_when_asked(text_dir: Path):
    from growpipe.local import train_local

    trained = train_local(_lstm_config(text_dir, lstm_state=True, lstm_pooling="last"), progress=None).net
    b1, b2 = trained.blocks[1], trained.blocks[2]
    x = torch.randint(2, trained.blocks[0].modules["f"].embed.num_embeddings, (4, 16))
    out0 = trained.blocks[0].forward(Packet(x=x))
    out1 = b1.forward(out0)
    assert set(out1.side) == {"lstm.h", "lstm.c"} and out1.side["lstm.h"].shape == (4, 2, 8)
    assert "lstm.h" not in out0.side  # the input packet's side is left as it was
    with_state = b2.forward(out1).x
    without = b2.forward(Packet(x=out1.x, mask=out1.mask)).x
    assert not torch.allclose(with_state, without)  # block 2 starts from block 1's final (h, c)
    plain = train_local(_lstm_config(text_dir), progress=None).net
    assert plain.blocks[1].forward(out0).side == {}


@pytest.mark.usefixtures("ray_session")
def test_lstm_with_state_and_last_pooling_on_ray_matches_the_reference(text_dir: Path):
    from growpipe.local import train_local
    from growpipe.runtime.pipeline import Pipeline

    cfg = _lstm_config(text_dir, lstm_state=True, lstm_pooling="last")
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)


def test_a_sequence_feature_block_appends_its_tokens_after_the_real_ones():
    from growpipe.nn.backbones import SequenceFeatureEncoder, TransformerEncoder

    torch.manual_seed(0)
    enc = SequenceFeatureEncoder(4, "chunk2", 10, 4, 0.02, TransformerEncoder(4, 4, 2, 1, 0.0))
    x = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    g = torch.tensor([[5, 0], [6, 7]])
    s, joined = enc(x, mask, {"chunk2": g})
    assert joined.tolist() == [[True, True, True, False, False], [True, True, True, False, False]]
    assert s.shape == (2, 5, 4)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("join", ["sequence"])  # pooled: the feature block test_growing runs on Ray (images)
def test_text_feature_growth_on_ray_matches_the_reference(join: str, text_dir: Path):
    from growpipe.local import train_local
    from growpipe.runtime.pipeline import Pipeline

    cfg = tiny_config(
        method="scpl",
        threads=1,  # the actors' thread count: the same float reductions as the stages
        data={"name": f"parquet:{text_dir}", "max_len": 16, "batch_size": 20,
              "feature_groups": {"scheme": "chunks", "count": 2, "base": 1}},
        net={"backbone": "transformer", "blocks": 2, "width": 8, "heads": 2, "embed_dim": 8, "feature_join": join},
        train={"epochs": 1},
        grow={"schedule": [{"kind": "feature", "group": "chunk1", "epochs": 1}], "cache": {"enabled": False}},
    )  # fmt: skip
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    family = net.blocks[2].spec.encoder.family
    assert result["blocks"] == 3 and family == ("seqfeature" if join == "sequence" else "feature")


def test_a_residual_dense_block_adds_its_input_when_the_sizes_match():
    from growpipe.config import NetSpec
    from growpipe.nn.backbones import build_encoder, plan_encoders
    from growpipe.nn.specs import InputInfo

    info = InputInfo(shape=(12,), dtype="long", num_classes=3, vocab_size=50)
    plain, residual = (plan_encoders(NetSpec(backbone="embedding", blocks=3, width=8, embed_dim=8, residual=r), info)
                       for r in (False, True))  # fmt: skip
    assert "residual" not in plain[1].params and residual[1].params["residual"] is True  # old specs stay as saved
    enc = build_encoder(residual[1]).eval()
    x = torch.randn(4, 8)
    assert torch.allclose(enc(x)[0], x + enc.body(x))
    wider = build_encoder(plan_encoders(NetSpec(backbone="mlp", blocks=2, width=16, residual=True),
                                        InputInfo(shape=(5,), dtype="float", num_classes=3))[0])  # fmt: skip
    assert not wider.residual  # 5 inputs, 16 units: nothing to add


def test_word_dropout_drops_tokens_in_training_only_from_the_blocks_seeded_stream():
    from growpipe.config import NetSpec
    from growpipe.nn.backbones import build_encoder, plan_encoders
    from growpipe.nn.block import block_seed, seeded
    from growpipe.nn.specs import InputInfo

    info = InputInfo(shape=(40,), dtype="long", num_classes=3, vocab_size=30)
    plain, dropped = (plan_encoders(NetSpec(backbone="embedding", blocks=2, width=8, embed_dim=8, pooling="tfidf",
                                            word_dropout=p), info)[0] for p in (0.0, 0.5))  # fmt: skip
    assert "word_dropout" not in plain.params and dropped.params["word_dropout"] == 0.5  # old specs stay as saved
    torch.manual_seed(0)
    enc = build_encoder(dropped)
    ref = build_encoder(plain)
    ref.load_state_dict(enc.state_dict())
    x = torch.randint(1, 30, (16, 40))
    enc.eval(), ref.eval()
    assert torch.equal(enc(x)[0], ref(x)[0])  # never at evaluation
    enc.train(), ref.train()
    ref.drop = enc.drop = torch.nn.Identity()  # the feature dropout aside: only the words differ
    with seeded(block_seed(0, 0, 3)):
        first = enc(x)[0]
    with seeded(block_seed(0, 0, 3)):
        again = enc(x)[0]
    assert torch.equal(first, again) and not torch.allclose(first, ref(x)[0])
    # what was dropped is what a document without those words gives
    with seeded(block_seed(0, 0, 3)):
        kept = x.masked_fill(torch.rand(x.shape) < 0.5, 0)
    assert torch.allclose(first, ref(kept)[0], atol=1e-6)


def test_word_dropout_outside_the_bag_is_refused_in_one_line():
    from growpipe.config import load_config
    from growpipe.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, ["net.backbone=transformer", "net.word_dropout=0.3"])
    msg = str(e.value)
    assert "net.word_dropout: supported for the embedding backbone's bag only" in msg and "transformer" in msg
    assert msg.rstrip().endswith("set net.word_dropout: 0") and msg.count("\n") <= 1


def test_transformer_blocks_start_with_a_layernorm_and_old_specs_build_without_one():
    """net.input_norm (default on): a transformer block reads its input at unit scale, so the block's output is
    the same for the input scaled 100x; a spec saved before the field existed builds the block as it was."""
    from growpipe.config import NetSpec
    from growpipe.nn.backbones import EncoderSpec, build_encoder, transformer_params

    params = transformer_params(NetSpec(backbone="transformer", width=8, heads=2), 8, 1)
    assert params["input_norm"] is True
    assert "input_norm" not in transformer_params(NetSpec(backbone="transformer", width=8, heads=2,
                                                          input_norm=False), 8, 1)  # fmt: skip
    torch.manual_seed(0)
    enc = build_encoder(EncoderSpec("transformer", (6, 8), "float", params), None).eval()
    x, mask = torch.randn(3, 6, 8), torch.ones(3, 6, dtype=torch.bool)
    assert torch.allclose(enc(x, mask)[0], enc(100 * x, mask)[0], atol=1e-4)
    old = {k: v for k, v in params.items() if k != "input_norm"}
    assert isinstance(build_encoder(EncoderSpec("transformer", (6, 8), "float", old), None).in_norm,
                      torch.nn.Identity)  # fmt: skip
