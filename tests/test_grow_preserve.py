"""grow.init: preserve: a grown block starts where the net stands (its encoder gated to the identity, its exit
the block below's), so the accuracy does not drop at the moment of growth; the accuracy just before and just
after each growth in the growth history, the same on Ray as in the reference trainer; plans that cannot
preserve refused at the start (the other bad input of growth: test_grow_policy.py)."""

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from growpipe.cli import main
from growpipe.config import GrowStep, config_and_problems
from growpipe.data import iterate_batches, load_data
from growpipe.errors import ConfigError
from growpipe.growth import preserve_config_problem, preserve_plan_problem
from growpipe.local import train_local
from growpipe.nn.backbones import GatedEncoder
from growpipe.nn.methods import build_block
from growpipe.nn.net import GrowableNet, plan_blocks
from growpipe.nn.specs import InputInfo
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import assert_same_weights, tiny_config

HOLD = 5  # the batch a held epoch waits before
TWO_STEPS = [{"kind": "layer", "epochs": 1}, {"kind": "layer", "epochs": 1}]


def _trained(cfg, batches: int = 5):
    """A net of `cfg` trained on a few digits batches, its data and its input description."""
    bundle = load_data(cfg.data, cfg.seed)
    info = InputInfo.from_bundle(bundle, cfg.net)
    net = GrowableNet.build(cfg.rule(), cfg.net, info)
    for p in list(iterate_batches(bundle.train, 64, shuffle=True, seed=0, epoch=0))[:batches]:
        net.train_step(p)
    return net, bundle, info


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
def test_a_preserved_block_gives_the_prediction_of_the_net_before_it(method):
    cfg = tiny_config(method=method)
    net, bundle, _ = _trained(cfg)
    test = next(iter(iterate_batches(bundle.test, 200, shuffle=False)))
    before = net.exit_logits(test)[net.depth]
    net.freeze()
    net.grow(cfg.net, GrowStep(kind="layer"), preserve=True)
    after = net.exit_logits(test)
    assert torch.equal(after[net.depth], before)  # bit for bit: the gate at 0 adds 0, AL's new decoder is I
    assert torch.equal(after[net.depth - 1], before)  # the block below is as it was


def test_the_gated_branch_learns_from_the_first_steps():
    """The gate starts at 0 and moves; then the branch behind it learns (a zero last layer before a ReLU would
    get no gradient at all). Its body starts as the fresh block of the same seed would."""
    cfg = tiny_config(method="scpl")
    net, bundle, info = _trained(cfg)
    net.freeze()
    new = net.grow(cfg.net, GrowStep(kind="layer"), preserve=True)
    enc = new.modules["f"]
    assert isinstance(enc, GatedEncoder) and float(enc.gate.detach()) == 0.0
    params = {k: v for k, v in new.spec.encoder.params.items() if k != "gate"}
    fresh = build_block(cfg.rule(), replace(new.spec, encoder=replace(new.spec.encoder, params=params)), info)
    body = [p.clone() for p in enc.inner.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(body, fresh.modules["f"].parameters(), strict=True))
    for p in list(iterate_batches(bundle.train, 64, shuffle=True, seed=0, epoch=1))[:4]:
        net.train_step(p)
    assert float(enc.gate.detach()) != 0.0
    assert any(not torch.equal(a, b) for a, b in zip(body, enc.inner.parameters(), strict=True))


def test_a_transformer_block_on_text_starts_as_the_identity(text_dir: Path):
    cfg = tiny_config(method="dascpl", data={"name": f"parquet:{text_dir}", "batch_size": 16},
                      net={"backbone": "transformer", "width": 16, "heads": 2, "embed_dim": 16})  # fmt: skip
    net, bundle, _ = _trained(cfg, batches=2)
    test = next(iter(iterate_batches(bundle.test, 30, shuffle=False)))
    before = net.exit_logits(test)[net.depth]
    net.grow(cfg.net, GrowStep(kind="layer"), preserve=True)
    assert net.blocks[-1].spec.encoder.family == "transformer"
    assert torch.equal(net.exit_logits(test)[net.depth], before)


def test_plans_that_cannot_preserve_are_refused_in_one_line_naming_the_fix(capsys):
    for raw, needle in [
        ({"method": "bp", "runtime": {"engine": "ddp"}}, "runtime.engine ddp builds a grown block in its next trainer"),
        ({"al": {"decoder_activation": True}}, "set al.decoder_activation: false, or grow.init: fresh"),
    ]:
        cfg, problems = config_and_problems({**raw, "grow": {"init": "preserve"}})
        assert len(problems) == 1 and needle in problems[0], problems
    # the blocks' shapes: before the run starts for a named data set (a conv block that pools, a narrower block)
    cnn = tiny_config(net={"backbone": "cnn", "widths": [8, 16]}, grow={"init": "preserve", "schedule": TWO_STEPS})
    why = preserve_config_problem(cnn)
    assert why is not None and why.startswith("grow.schedule[0]: grow.init: preserve: block 2 (conv) turns block 1's "
                                              "output (16, 2, 2) into (16, 1, 1)") and "1x1" in why  # fmt: skip
    narrow = tiny_config(grow={"init": "preserve", "schedule": [{"kind": "layer", "width": 32}]})
    assert "give the step width 64, or set grow.init: fresh" in (preserve_config_problem(narrow) or "")
    assert preserve_config_problem(tiny_config(grow={"init": "preserve", "schedule": TWO_STEPS})) is None
    # on the data itself when the run starts (RunLoop): every planned step, here grow.step up to max_blocks
    every = tiny_config(grow={"init": "preserve", "every_epochs": 1, "max_blocks": 4, "step": {"width": 8}})
    _, _, info = _trained(every, batches=0)
    why = preserve_plan_problem(every, info, plan_blocks(every.net, every.rule(), info))
    assert why is not None and why.startswith("grow.step: grow.init: preserve: block 2 (mlp)")
    with pytest.raises(ConfigError, match=r"grow.step: grow.init: preserve: .*give the step width 64"):
        train_local(every, progress=None)
    # the command: one line, exit 2, nothing started
    code = main(["train", "--runtime", "local", "--set", "net.backbone=cnn", "--set", "grow.init=preserve",
                 "--set", "grow.schedule=[{kind: layer}]", "--set", "tracking.mlflow=false"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2 and "grow.schedule[0]: grow.init: preserve: block 2 (conv)" in err[1], err


def test_the_accuracy_just_before_and_after_each_growth_is_recorded_and_preserve_keeps_it():
    """Digits MLP, DASCPL, two growth steps: the growth history holds the accuracy at the moment of growth;
    with preserve it does not drop (at most 0.2 point; here exactly not at all), on the validation split either."""
    rows = {}
    for init in ("fresh", "preserve"):
        grow = {"init": init, "schedule": TWO_STEPS, "eval_at_growth": True}
        data = {"val_fraction": 0.2} if init == "preserve" else {}
        cfg = tiny_config(method="dascpl", threads=1, train={"epochs": 2}, grow=grow, data=data)
        lines: list[str] = []
        r = train_local(cfg, progress=lines.append)
        history = {h["epoch"]: h for h in r.history}
        said = [line for line in lines if line.startswith("grow   +layer")]
        assert [line.split(", test accuracy ")[1] for line in said] == [
            f"{g['acc_just_before']:.4f} -> {g['acc_just_after']:.4f}" for g in r.growth
        ]
        for g in r.growth:  # at an epoch's end, before is that epoch's evaluation: no second pass
            assert g["acc_just_before"] == history[g["epoch"]]["test_accuracy"] == g["acc_before"]
            assert 0 <= g["acc_just_after"] <= 1 and g["eval_seconds"] > 0
            assert g["val_just_before"] == history[g["epoch"]]["val_accuracy"]  # None without a validation split
        rows[init] = r.growth
    assert [g["epoch"] for g in rows["preserve"]] == [2, 3]
    assert all(g["acc_just_before"] - g["acc_just_after"] <= 0.002 for g in rows["preserve"])
    assert all(g["acc_just_after"] == g["acc_just_before"] for g in rows["preserve"])
    assert all(g["val_just_after"] == g["val_just_before"] is not None for g in rows["preserve"])
    off = tiny_config(method="dascpl", grow={"schedule": TWO_STEPS[:1]})  # grow.eval_at_growth off: the default
    (g,) = train_local(off, progress=None).growth
    assert g["acc_just_before"] is None and g["acc_just_after"] is None and "eval_seconds" not in g


def test_a_preserved_net_resumes_with_grow_init_fresh_and_its_new_blocks_start_fresh(tmp_path: Path):
    """grow.init and grow.eval_at_growth may change on a resume: the gate of a preserved block is in the
    checkpoint's topology and state (restored as it was trained), the setting only decides the blocks to come."""
    from growpipe.local import LocalEngine
    from growpipe.loop.loop import RunLoop
    from growpipe.prepare import checkpoint_store
    from growpipe.report import format_report
    from growpipe.resume import plan_resume

    ck = str(tmp_path / "ck")
    first = train_local(tiny_config(name="kept", method="dascpl", threads=1, checkpoint={"enabled": True, "uri": ck},
                                    grow={"init": "preserve", "schedule": TWO_STEPS[:1], "max_blocks": 4}),
                        progress=None)  # fmt: skip
    gate = first.net.blocks[2].modules["f"].gate.detach().clone()
    assert float(gate) != 0.0  # trained an epoch
    sets = [f"checkpoint.uri={ck}", "grow.init=fresh", "grow.eval_at_growth=true", "train.epochs=2"]  # 1 more
    cfg, ref = plan_resume(None, sets, "kept")
    assert ref is not None and cfg.grow.init == "fresh" and cfg.grow.eval_at_growth
    loop = RunLoop(cfg, LocalEngine(cfg), store=checkpoint_store(cfg), resume=ref.path)
    loop.step()  # STARTING: the checkpoint's net restored, epoch 3 to train
    restored = loop.engine.net.blocks[2].modules["f"]
    assert isinstance(restored, GatedEncoder) and torch.equal(restored.gate.detach(), gate)
    answers: list[dict] = []
    asker = threading.Thread(target=lambda: answers.append(loop.grow({"kind": "layer"})), daemon=True)
    asker.start()
    deadline = time.monotonic() + 10
    while loop.requests.pending == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    result = loop.run()
    asker.join(timeout=30)
    assert not asker.is_alive() and answers and answers[0]["block"] == 3, answers
    new = loop.final_net().blocks[3]
    assert not isinstance(new.modules["f"], GatedEncoder) and "gate" not in new.spec.encoder.params
    assert isinstance(loop.final_net().blocks[2].modules["f"], GatedEncoder)
    planned, asked = result["growth"]  # the first grew before grow.eval_at_growth was on
    assert planned["acc_just_before"] is None and asked["acc_just_before"] is not None
    said = [line for line in format_report(result).splitlines() if line.startswith("  growth at epoch")]
    assert "(at growth" not in said[0]
    assert said[1].endswith(f" (at growth {asked['acc_just_before']:.4f} -> {asked['acc_just_after']:.4f})")


def _wait_for_file(path: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} did not appear in time"
        time.sleep(0.05)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("method", ["al", "bp"])
def test_preserve_on_ray_ends_as_the_reference_and_records_the_same_rows(method):
    """The local-learning pipeline (AL: its bridge and an identity decoder; the classifier of the other local
    rules is the reference's path above) and GPipe (BP): the exit comes from the stage below when the block is
    attached; weights and growth rows as the reference's."""
    cfg = tiny_config(name=f"preserve-{method}", method=method, threads=1, train={"epochs": 1},
                      grow={"init": "preserve", "schedule": TWO_STEPS[:1], "eval_at_growth": True})  # fmt: skip
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    keys = ("epoch", "blocks", "acc_just_before", "acc_just_after")
    (ours,), (theirs,) = ([[g[k] for k in keys] for g in rows] for rows in (result["growth"], reference.growth))
    assert ours == pytest.approx(theirs, abs=1e-6) and ours[:2] == [1, 3]
    assert ours[3] == pytest.approx(ours[2], abs=1e-6)


@pytest.mark.usefixtures("ray_session")
def test_a_request_mid_epoch_is_measured_just_before_and_after_and_keeps_the_accuracy(monkeypatch, tmp_path):
    """Stage 0 holds before batch HOLD of epoch 1 until the request's block is ready: the accuracy just before
    comes from an evaluation there (no epoch has ended yet), and with preserve the one after equals it."""
    from growpipe.runtime.client import request_growth

    gate = tmp_path / "gate"
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"1:{HOLD}:{gate}")
    cfg = tiny_config(name="preserve-mid", method="dascpl", threads=1, data={"batch_size": 32, "limit_train": 640},
                      grow={"init": "preserve", "max_blocks": 3, "cache": {"enabled": False},
                            "eval_at_growth": True})  # fmt: skip
    with Pipeline(cfg) as p:
        done: list[dict] = []
        run = threading.Thread(target=lambda: done.append(p.train(progress=None)))
        run.start()
        _wait_for_file(Path(f"{gate}.held"))  # inside the hold: epoch 1 is under way
        answer = request_growth("preserve-mid", {"kind": "layer"})
        gate.touch()
        run.join(timeout=180)
    (g,) = done[0]["growth"]
    assert (answer["block"], g["epoch"], g["batch"]) == (2, 0, HOLD) and g["acc_before"] is None
    assert g["acc_just_before"] is not None and g["acc_just_after"] == pytest.approx(g["acc_just_before"], abs=1e-9)
