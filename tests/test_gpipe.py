"""GPipe on the stage actors: the same weights as single-process BP on the same mini-batches."""

from __future__ import annotations

import pytest

from growpipe.errors import ConfigError
from growpipe.local import train_local
from growpipe.runtime.bp_stage import micro_slices
from growpipe.runtime.gpipe import train_gpipe
from tests.conftest import tiny_config
from tests.test_runtime import _assert_same_weights


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("micro", [3])  # 64 samples into micro-batches of 22, 21 and 21: unequal shares
def test_gpipe_matches_single_process_bp(micro):
    cfg = tiny_config(
        name=f"gpipe-{micro}", method="bp", threads=1, net={"blocks": 3, "width": 32}, train={"epochs": 2},
        data={"limit_train": 320, "batch_size": 64}, runtime={"micro_batches": micro},
    )  # fmt: skip
    reference = train_local(cfg, progress=None)
    lines: list[str] = []
    result, net = train_gpipe(cfg, progress=lines.append, keep_net=True)
    assert result["runtime"] == "ray-gpipe" and result["blocks"] == 3 and result["epochs"] == 2
    ref_losses = [r["loss"]["b2.ce"] for r in reference.history]
    assert [r["loss"]["b2.ce"] for r in result["history"]] == pytest.approx(ref_losses, abs=1e-5)
    assert result["test_accuracy"] == pytest.approx(reference.summary()["test_accuracy"], abs=1e-9)
    _assert_same_weights(reference.net, net, atol=2e-5)
    assert any(line.startswith("net    bp (GPipe)") for line in lines)


def test_micro_batches_cover_the_batch_and_bad_configs_are_refused():
    parts = micro_slices(10, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2] and sorted(i for p in parts for i in p) == list(range(10))
    assert [len(p) for p in micro_slices(2, 4)] == [1, 1]
    with pytest.raises(ConfigError, match="GPipe pipelines end-to-end BP"):
        train_gpipe(tiny_config(method="al"), progress=None)
    with pytest.raises(ConfigError, match="drop grow"):
        train_gpipe(tiny_config(method="bp", grow={"every_epochs": 1, "max_blocks": 3}), progress=None)
