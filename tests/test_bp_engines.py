"""Method bp on 1F1B and on Ray Train DDP goes through the same run loop as GPipe: a planned growth (the earlier
blocks frozen), a joint epoch (every block thawed: grow.joint), restore points (one written at the growth), a
resume at the joint epoch's boundary, and (DDP) a worker process lost mid-epoch that Ray Train replaces from its
own checkpoint; each run ends with the weights of an undisturbed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from growpipe.api import train
from growpipe.checkpoint import CheckpointStore
from tests.conftest import assert_same_weights, tiny_config


def _base(name: str, schedule: str) -> dict:
    return {
        "name": name,
        "method": "bp",
        "threads": 1,
        "net": {"blocks": 2, "width": 32},
        "data": {"limit_train": 256, "batch_size": 64},
        "runtime": {"engine": schedule, "timeline_epoch": 0},
        **({"ddp": {"workers": 2}} if schedule == "ddp" else {"bp_pipeline": {"micro_batches": 2}}),
        "grow": {"schedule": [{"kind": "layer", "epochs": 1}], "joint": {"epochs": 1, "lr_factor": 0.5}},
        # each block warms up and decays on its own steps: restored with them after a loss and a resume
        "train": {"epochs": 1, "lr_schedule": {"warmup_steps": 2, "decay": "linear", "decay_steps": 4}},
    }


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("schedule", ["1f1b", "ddp"])
def test_bp_engine_grows_recovers_and_resumes_to_the_same_weights(tmp_path: Path, monkeypatch, schedule: str):
    name = f"bp-{schedule}"
    ckpt = {"enabled": True, "uri": str(tmp_path), "keep": 5}
    died = tmp_path / "died"  # worker 1 (a DDP rank, a 1F1B stage) ends its process at its 2nd step, in epoch 1
    monkeypatch.setenv("GROWPIPE_DIE_AT", f"1:2:{died}")
    lines: list[str] = []
    grown = train(tiny_config(**_base(name, schedule), checkpoint=ckpt), progress=lines.append, keep_net=True)
    r = grown.result
    assert died.exists() and r["blocks"] == 3 and r["growth"][0]["blocks"] == 3 and r["frozen_unchanged"] is True
    assert [h["epoch"] for h in r["history"]] == [1, 2, 3] and r["joint"]["thawed"] == [0, 1]
    if schedule == "ddp":  # Ray Train replaced the worker from its own checkpoint: the loop saw nothing (a
        # trainer for the first blocks, one for the grown net, one for the joint epoch)
        assert r["runtime"] == "ray-train-ddp" and r["restarts"] == 0 and r["trainers"] == 3, "\n".join(lines)
        assert Path(r["ray_train_storage"]).is_dir()  # Ray Train's own checkpoints, beside the run's
    else:  # the loop replaced the stage and went on from its newest checkpoint
        assert r["restarts"] == 1 and any(line.startswith("recover ") for line in lines), "\n".join(lines)
    done = CheckpointStore(str(tmp_path), name).complete()
    at_growth = next(c for c in done if c.seq == 2)
    assert (at_growth.epoch, at_growth.batch) == (1, 0)
    # the resume starts at the joint phase's boundary: the grown net in a new trainer (DDP) or new stages (1F1B),
    # every block thawed; the switch from the grown phase to the joint one is the first run's
    before_joint = [c for c in done if (c.epoch, c.batch) == (2, 0)][-1]
    monkeypatch.delenv("GROWPIPE_DIE_AT", raising=False)
    lines.clear()
    resumed = train(tiny_config(**_base(name, schedule), checkpoint=ckpt), progress=lines.append, keep_net=True,
                    resume=before_joint.path)  # fmt: skip
    assert any(line.startswith(f"resume {before_joint.path}: epoch 2, batch 0, 3 blocks") for line in lines), lines
    assert [h["epoch"] for h in resumed.result["history"]] == [1, 2, 3] and resumed.result["joint"]["thawed"] == [0, 1]
    assert resumed.result["history"][2]["loss"] == pytest.approx(r["history"][2]["loss"], abs=1e-6)
    assert_same_weights(grown.net, resumed.net, atol=1e-6)
