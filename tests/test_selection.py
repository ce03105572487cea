"""Model selection on the validation split (eval.restore_best): the run ends with the net of its best epoch,
on the reference trainer and on the Ray engines alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from growpipe.api import train
from growpipe.local import train_local
from tests.conftest import tiny_config


def _cfg(tmp_path: Path, method: str, name: str):
    # at this rate validation accuracy peaks at epoch 4 of 5 for both rules (measured on the reference)
    return tiny_config(name=name, method=method, threads=1, net={"blocks": 2, "width": 32},
                       train={"epochs": 5, "lr": 0.03}, data={"val_fraction": 0.2, "limit_train": 400},
                       checkpoint={"enabled": True, "uri": str(tmp_path), "keep": 1},
                       runtime={"timeline_epoch": 0})  # fmt: skip


def _assert_selected(result: dict, epoch: int) -> None:
    vals = [h["val_accuracy"] for h in result["history"]]
    assert result["selected_epoch"] == epoch == len(vals) - vals[::-1].index(max(vals)) < len(vals)  # latest best
    row = result["history"][epoch - 1]
    assert result["test_accuracy"] == row["test_accuracy"] and result["exit_accuracy"] == row["exit_accuracy"]


@pytest.mark.parametrize("method", ["dascpl", "bp"])
def test_the_reference_trainer_ends_with_its_best_validation_epoch(tmp_path: Path, method: str):
    lines: list[str] = []
    result = train_local(_cfg(tmp_path, method, f"sel-{method}"), progress=lines.append).summary()
    _assert_selected(result, 4)
    assert any(line.startswith("best   epoch 4 (val ") for line in lines)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("method", ["dascpl", "bp"])
def test_the_ray_engines_select_the_same_epoch_as_the_reference(tmp_path: Path, method: str):
    reference = train_local(_cfg(tmp_path / "ref", method, "ref"), progress=None).summary()
    result = train(_cfg(tmp_path / "ray", method, f"sel-ray-{method}"), progress=None, keep_net=False).result
    assert result["runtime"] == ("ray" if method == "dascpl" else "ray-gpipe")
    _assert_selected(result, reference["selected_epoch"])
    assert result["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=1e-9)
