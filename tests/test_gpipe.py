"""GPipe on the stage actors: the same weights as single-process BP on the same mini-batches."""

from __future__ import annotations

import pytest

from growpipe.api import train
from growpipe.data.batches import micro_slices
from growpipe.errors import ConfigError
from growpipe.local import train_local
from growpipe.runtime.gpipe import check_bp
from tests.conftest import assert_same_weights, tiny_config


def test_micro_batches_cover_the_batch_and_bad_configs_are_refused():
    parts = micro_slices(10, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2] and sorted(i for p in parts for i in p) == list(range(10))
    assert [len(p) for p in micro_slices(2, 4)] == [1, 1]
    with pytest.raises(ConfigError, match="pipelined BP trains method bp end to end"):
        check_bp(tiny_config(method="al"))


@pytest.mark.usefixtures("ray_session")
@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_gpipe_grows_checkpoints_and_resumes_like_single_process_bp(tmp_path):
    """Method bp on the stage actors goes through the same run loop: a planned growth (the earlier stages
    frozen), a joint epoch (every stage learning again, at half the rate: grow.joint), restore points, MLflow, and
    a resume from the one written at the growth end, each with the reference's losses and weights. 64 samples go
    into micro-batches of 22, 21 and 21: unequal shares. Each stage clips its block's gradients (train.grad_clip;
    some steps' norms pass 0.2) and warms its rate up on its block's own steps (train.lr_schedule) as the
    reference does."""
    from mlflow.tracking import MlflowClient

    from growpipe.checkpoint import CheckpointStore

    base = {"name": "gpipe-grow", "method": "bp", "threads": 1, "net": {"blocks": 2, "width": 32},
            "train": {"epochs": 1, "grad_clip": 0.2, "lr_schedule": {"warmup_steps": 3}},
            "data": {"limit_train": 256, "batch_size": 64},
            "bp_pipeline": {"micro_batches": 3},
            "grow": {"schedule": [{"kind": "layer", "epochs": 1}],
                     "joint": {"epochs": 1, "lr_factor": 0.5}}}  # fmt: skip
    reference = train_local(tiny_config(**base), progress=None)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"mlflow": True, "uri": uri, "experiment": "tests", "workdir": str(tmp_path), "log_model": False,
                "system_metrics": False}  # fmt: skip
    cfg = tiny_config(**base, checkpoint={"enabled": True, "uri": str(tmp_path), "keep": 5}, tracking=tracking)
    lines: list[str] = []
    grown = train(cfg, progress=lines.append, keep_net=True)
    assert grown.result["runtime"] == "ray-gpipe"
    assert any(line.startswith("net    bp (GPipe) on mlp: 2 stage actors") for line in lines), lines
    assert [s["stage"] for s in grown.result["stages"]] == [0, 1, 2] and all(
        s["busy_s"] > 0 for s in grown.result["stages"]
    )
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["final.test_accuracy"] == grown.result["test_accuracy"]
    assert grown.result["blocks"] == 3 and grown.result["growth"][0]["blocks"] == 3
    assert grown.result["frozen_unchanged"] is True and grown.result["joint"]["thawed"] == [0, 1]
    for ours, theirs in zip(grown.result["history"], reference.history, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
    assert grown.result["test_accuracy"] == pytest.approx(reference.summary()["test_accuracy"], abs=1e-9)
    assert_same_weights(reference.net, grown.net, atol=2e-5)
    at_growth = next(c for c in CheckpointStore(str(tmp_path), "gpipe-grow").complete() if c.seq == 2)
    assert (at_growth.epoch, at_growth.batch) == (1, 0)
    lines.clear()
    untracked = tiny_config(**base, checkpoint={"enabled": True, "uri": str(tmp_path), "keep": 5})
    resumed = train(untracked, progress=lines.append, keep_net=True, resume=at_growth.path)
    assert any(line.startswith(f"resume {at_growth.path}: epoch 1, batch 0, 3 blocks") for line in lines)
    assert [h["epoch"] for h in resumed.result["history"]] == [1, 2, 3] and len(resumed.result["growth"]) == 1
    assert_same_weights(reference.net, resumed.net, atol=2e-5)
