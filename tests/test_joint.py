"""grow.joint: a short phase at the end of a growing run where every block learns again (the frozen ones too)
at a lower learning rate. Pure decisions, a block's thaw, the reference trainer, and the Ray pipeline against
it (the prefix cache dropped: every stage trains again)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from growpipe.checkpoint import CheckpointStore
from growpipe.growth import GrowthPlan
from growpipe.local import LocalEngine, train_local
from growpipe.loop.engine import EpochPart, Pause
from growpipe.loop.loop import RunLoop
from growpipe.loop.states import Growing, Restoring, Training
from growpipe.nn.lr_schedule import BASE_LR
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import assert_same_weights, tiny_config

JOINT = {"epochs": 1, "lr_factor": 0.5}


def test_the_joint_phase_comes_last_and_nothing_grows_in_it():
    cfg = tiny_config(train={"epochs": 4}, grow={"every_epochs": 1, "max_blocks": 8, "joint": {"epochs": 2}})
    plan = GrowthPlan(cfg)
    assert cfg.total_epochs() == 6 and plan.growing_until == 4
    assert len(plan.due(3, [], 3)) == 1 and plan.due(4, [], 3) == [] and plan.due(5, [], 3) == []
    assert [plan.in_joint(e) for e in range(6)] == [False, False, False, False, True, True]
    assert not GrowthPlan(tiny_config(train={"epochs": 4})).in_joint(5)  # no joint phase: never


def test_a_thawed_block_learns_again_at_the_lower_rate_and_a_fixed_parameter_stays_fixed():
    net = train_local(tiny_config(data={"limit_train": 128}), progress=None).net
    block = net.blocks[0]
    fixed, *learning = list(block.modules.parameters())
    fixed.requires_grad_(False)  # as net.freeze_embeddings keeps a text net's embedding
    block.freeze()
    assert block.frozen and not any(p.requires_grad for p in block.modules.parameters())
    assert all(not opt.state for opt in block.optimizers.values())  # the moments go with the freeze
    block.thaw(0.5)
    assert not block.frozen and not fixed.requires_grad and all(p.requires_grad for p in learning)
    block.set_scheduled_lr()
    for opt in block.optimizers.values():
        assert all(g["lr"] == pytest.approx(g[BASE_LR] * 0.5) for g in opt.param_groups)
    state = block.state_dict()
    assert state["lr_scale"] == 0.5 and state["frozen"] is False
    net.blocks[1].load_state_dict(state | {"modules": net.blocks[1].modules.state_dict()})
    assert net.blocks[1].lr_scale == 0.5


def test_the_reference_trainer_thaws_every_block_for_the_last_epoch():
    base = {"name": "joint-ref", "method": "dascpl", "data": {"limit_train": 256},
            "grow": {"schedule": [{"kind": "layer", "epochs": 1}]}}  # fmt: skip
    lines: list[str] = []
    joint = train_local(tiny_config(**{**base, "grow": {**base["grow"], "joint": JOINT}}), progress=lines.append)
    plain = train_local(tiny_config(**base), progress=None)
    summary = joint.summary()
    assert [(h["epoch"], h["blocks"], h["training"]) for h in joint.history] == [(1, 2, 2), (2, 3, 1), (3, 3, 3)]
    assert summary["joint"] == {"epoch": 2, "lr_factor": 0.5, "thawed": [0, 1], "frozen_unchanged": True}
    assert summary["frozen_unchanged"] is True  # until the joint phase thawed them
    assert "joint  from epoch 3: every block learns at 0.5x its learning rate (blocks 0, 1 thawed)" in lines
    # the frozen blocks learned in the joint epoch: they left the weights they were frozen with
    frozen = plain.net.blocks[0].checksum()
    assert joint.net.blocks[0].checksum() != frozen and joint.net.blocks[0].steps > plain.net.blocks[0].steps


def test_a_resume_inside_the_joint_phase_may_not_move_it(tmp_path):
    from growpipe.api import train
    from growpipe.errors import CheckpointError
    from growpipe.resume import plan_resume

    ckpt = {"enabled": True, "uri": str(tmp_path)}
    train(tiny_config(name="joint-resume", grow={"joint": JOINT}, checkpoint=ckpt), runtime="local", progress=None)
    sets = ["checkpoint.enabled=true", f"checkpoint.uri={tmp_path}"]
    cfg, ref = plan_resume(None, sets, "joint-resume")  # its own epochs: fine
    assert ref is not None and cfg.total_epochs() == 2
    with pytest.raises(CheckpointError, match="is in its joint phase .* train.epochs cannot change now"):
        plan_resume(None, [*sets, "train.epochs=3"], "joint-resume")


def test_a_grow_request_in_the_joint_phase_is_refused_and_changes_nothing():
    cfg = tiny_config(name="jointly", grow={"max_blocks": 4, "joint": JOINT})
    loop = RunLoop(cfg, LocalEngine(cfg))
    loop.step()  # STARTING -> epoch 1
    loop.step()  # epoch 1 -> its boundary: the joint phase begins
    assert isinstance(loop.state, Training) and loop.state.epoch == 2 and loop.rec.joint is not None
    answer = loop.grow({"kind": "layer"})
    assert answer == {"error": "run 'jointly' is in its joint phase (grow.joint, epochs after 1): every block "
                               "trains, the net does not grow"}  # fmt: skip
    assert len(loop.specs) == 2 and loop.requests.pending == 0
    loop.shutdown("done")


@pytest.mark.usefixtures("ray_session")
def test_the_pipeline_drops_its_prefix_cache_and_thaws_like_the_reference():
    """AL grown by a layer (the earlier blocks frozen, the new one trained from the prefix cache), then one
    joint epoch: every stage trains again from the data, with the reference trainer's weights."""
    cfg = tiny_config(name="joint-al", method="al", threads=1, data={"limit_train": 256},
                      grow={"schedule": [{"kind": "layer", "epochs": 1}], "joint": JOINT})  # fmt: skip
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-5)
    assert [c["block"] for c in result["prefix_caches"]] == [2] and result["joint"]["thawed"] == [0, 1]
    samples = {s["stage"]: s["samples"] for s in result["stages"]}
    # every stage trains epoch 1 (block 2 in its place: from the cache, the pass not counted) and the joint one
    assert samples == {0: 2 * 256, 1: 2 * 256, 2: 2 * 256}
    assert [h["training"] for h in result["history"]] == [2, 1, 3] and result["frozen_unchanged"] is True


class _LateLocalEngine(LocalEngine):
    """The reference trainer as an engine that places a request's block while an epoch trains and cannot pause
    for it (as 1F1B): an epoch waits until the block placed in it is ready, then trains to its end."""

    places_while_training = True

    def run_epoch(self, epoch: int, start_batch: int, stop_at: int | None, pause: Pause) -> EpochPart:
        deadline = time.monotonic() + 60
        while not pause.requested:  # the placing thread sets it once the block is ready
            assert time.monotonic() < deadline, "the request's block was never placed"
            time.sleep(0.01)
        return super().run_epoch(epoch, start_batch, stop_at, Pause())


def test_a_block_placed_in_the_last_epoch_before_the_joint_phase_is_refused_at_its_boundary():
    cfg = tiny_config(name="joint-late", data={"limit_train": 128}, grow={"max_blocks": 4, "joint": JOINT})
    loop = RunLoop(cfg, _LateLocalEngine(cfg))
    loop.step()  # STARTING -> epoch 1, the last one the net may grow in
    answers: list[dict[str, Any]] = []
    asking = threading.Thread(target=lambda: answers.append(loop.grow({"kind": "layer"})))
    asking.start()
    while loop.requests.orders.empty():  # the request waits for the epoch that places it
        assert asking.is_alive()
        time.sleep(0.01)
    loop.step()  # epoch 1 trains; its request's block is placed meanwhile and waits for the boundary
    assert isinstance(loop.state, Growing) and loop.state.order is not None and loop.state.resume is None
    loop.step()  # the boundary: grow.joint's phase follows, where the block would train alone
    asking.join(60)
    assert answers == [{"error": "run 'joint-late' is in its joint phase (grow.joint, epochs after 1): every block "
                                 "trains, the net does not grow"}]  # fmt: skip
    assert len(loop.specs) == 2 and loop.requests.pending == 0 and loop.rec.growth == []
    loop.shutdown("done")


def test_a_run_restored_to_before_its_joint_phase_takes_grow_requests_again(tmp_path):
    ckpt = {"enabled": True, "uri": str(tmp_path)}
    cfg = tiny_config(name="joint-back", data={"limit_train": 128}, train={"epochs": 2},
                      grow={"max_blocks": 4, "joint": JOINT}, checkpoint=ckpt)  # fmt: skip
    store = CheckpointStore(str(tmp_path), "joint-back")
    loop = RunLoop(cfg, LocalEngine(cfg), run_name="joint-back", store=store)
    while loop.rec.joint is None:
        loop.step()
    assert loop.grow({"kind": "layer"})["error"].startswith("run 'joint-back' is in its joint phase")
    loop.checkpoints.settle()
    back = next(ref for ref in store.complete() if ref.epoch == 1)
    loop.state = Restoring(back.path, "a test's restore")
    loop.step()  # back to epoch 1's boundary: epoch 2 trains next, the net may grow in it
    assert isinstance(loop.state, Training) and loop.state.epoch == 2 and loop.rec.joint is None
    assert loop.requests.closed is None
    loop.shutdown("done")
