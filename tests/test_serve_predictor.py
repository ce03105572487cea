"""The inference every server replica, block group and the MLflow model share: raw rows in, early-exit
answers out; each bad request one line naming its field. No Ray here."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from growpipe.checkpoint import save_net
from growpipe.data.sources import DIGITS_SPLIT, digits_rows
from growpipe.errors import InputError
from growpipe.local import train_local
from growpipe.serve.predictor import Predictor
from growpipe.serve.request import parse_body
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = tiny_config(method="dascpl", name="served", net={"blocks": 3})
    run = train_local(cfg, progress=None)
    path = save_net(tmp_path_factory.mktemp("net") / "ck", run.net, cfg, run.result)
    pixels, _ = digits_rows()
    test_rows = np.load(DIGITS_SPLIT)["test"].astype(np.int64)
    return run, path, pixels[test_rows] / 16.0  # the test split as a user has it, before standardising


def test_answers_match_the_nets_own_early_exit_on_raw_rows(trained):
    run, path, raw = trained
    predictor = Predictor.load(path)
    x = raw[:50]
    full = predictor.predict(x.tolist())
    assert full["version"] == {"run": "served", "checkpoint": "ck", "epoch": 1, "blocks": 3}
    assert set(full["exit_depth"]) == {3}, "threshold 1.0 is the full path"
    logits = run.net.predict(run.bundle.test.x[:50])
    assert full["prediction"] == logits.argmax(1).tolist(), "standardised as in training, then the full path"
    early = predictor.predict(x, threshold=0.0)
    assert set(early["exit_depth"]) == {1}, "at threshold 0 every sample leaves at the first exit"
    some = predictor.predict(x, threshold=0.9, confidence="entropy")
    assert len(some["prediction"]) == 50 and all(0 <= c <= 1 for c in some["confidence"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[1, 2]", "body"),
        (b'{"input": [[0]]}', "input"),
        (b'{"inputs": []}', "inputs"),
        (b'{"inputs": [[0]], "threshold": 1.5}', "threshold"),
        (b'{"inputs": [[0]], "threshold": "high"}', "threshold"),
        (b'{"inputs": [[0]], "confidence": "margin"}', "confidence"),
    ],
)
def test_a_malformed_request_names_its_field(body, field):
    with pytest.raises(InputError) as e:
        parse_body(body)
    assert str(e.value).startswith(f"{field}:") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([[0.0] * 63], r"shape \[1, 63\]"),
        ([[0.0] * 64, [0.0] * 3], "unequal length"),
        ([["a"] * 64], "not numbers"),
        ([[float("nan")] * 64], "NaN"),
    ],
)
def test_inputs_of_the_wrong_shape_or_dtype_are_refused_by_field(trained, rows, says):
    predictor = Predictor.load(trained[1])
    with pytest.raises(InputError, match=f"^inputs: .*{says}"):
        predictor.predict(parse_body(json.dumps({"inputs": rows})).inputs)
    assert predictor.predict(np.zeros((2, 8, 8), dtype=np.float32))["exit_depth"] == [3, 3], "its own shape works"
    assert torch.is_grad_enabled(), "inference leaves autograd as it found it"


def test_rows_may_come_as_a_base64_npy_array_and_answer_the_same(trained):
    from growpipe.serve.request import encode_npy

    _, path, raw = trained
    predictor = Predictor.load(path)
    rows = raw[:20].astype(np.float32)
    request = parse_body(json.dumps({"inputs": encode_npy(rows), "threshold": 0.5}))
    assert predictor.predict(request.inputs, request.threshold) == predictor.predict(rows.tolist(), 0.5)
    for inputs, says in [({"npy_base64": "%%%"}, "inputs.npy_base64: not a base64 .npy array"),
                         ({"rows": []}, 'inputs: an object must be {"npy_base64"')]:  # fmt: skip
        with pytest.raises(InputError, match=f"^{re.escape(says)}"):
            parse_body(json.dumps({"inputs": inputs}))


def test_values_beyond_the_inputs_bound_are_refused_and_values_within_it_answer_finite(trained):
    from growpipe.serve.predictor import MAX_INPUT

    predictor = Predictor.load(trained[1])
    normalize = predictor.info.normalize
    mean, std = normalize["mean"][0], normalize["std"][0]
    for huge in (1e30, 1e308, -1e39, 10.0**20):  # 1e308 is finite in JSON and inf in float32
        body = json.dumps({"inputs": [[0.5] * 64, [0.5] * 10 + [huge] + [0.5] * 53]})
        with pytest.raises(InputError) as e:
            predictor.predict(parse_body(body).inputs)
        assert str(e.value).startswith(f"inputs: row 1 holds {huge:.6g}, ") and "\n" not in str(e.value)
        assert "training standard deviations from its mean; the net takes values within 1e+06" in str(e.value)
    edge = mean + 0.99 * MAX_INPUT * std  # just within the bound: every exit's confidence stays finite
    for kind in ("max_prob", "entropy"):
        answer = predictor.predict([[edge] * 64, [-edge] * 64], threshold=0.5, confidence=kind)
        json.dumps(answer, allow_nan=False)  # what the server sends: no NaN or Infinity in it
        assert all(0 <= c <= 1 for c in answer["confidence"])


def test_booleans_are_not_numbers_and_deep_nesting_is_a_400_not_a_500(trained):
    predictor = Predictor.load(trained[1])
    for rows, says in (([[True] * 64], "inputs[0][0]: a boolean"), ([[0.5] * 64, [0.5] * 63 + [False]],
                       "inputs[1][63]: a boolean"), (np.ones((2, 64), dtype=bool), "inputs: booleans")):  # fmt: skip
        with pytest.raises(InputError, match=re.escape(says)):
            predictor.predict(rows)
    with pytest.raises(InputError, match=r"^threshold: True is not a number"):
        parse_body(json.dumps({"inputs": [[0.5] * 64], "threshold": True}))
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # json.loads: RecursionError
    with pytest.raises(InputError, match=r"^body: lists or objects nested too deep to read"):
        parse_body(deep)
    nested = json.loads("[" * 60 + "0.5" + "]" * 60)  # readable, but no batch of rows of 64 numbers
    with pytest.raises(InputError, match=r"^inputs: lists nested more than 4 deep; give a list of rows, each \["):
        predictor.predict(nested)
    assert predictor.predict([[0.5] * 64])["exit_depth"] == [3], "a plain row still answers"
