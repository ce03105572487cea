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
