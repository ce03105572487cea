"""The divergence guard (train.on_nonfinite): a non-finite loss or gradient stops the run before any weight
turns non-finite, naming block, epoch and batch, or (skip_batch) its update is skipped and counted."""

from __future__ import annotations

import copy
import math
import pickle
import re
from pathlib import Path

import pytest
import torch

from growpipe.cli import main
from growpipe.data import load_data
from growpipe.data.bundle import batch_order
from growpipe.errors import NonFiniteError
from growpipe.local import train_local
from growpipe.loop.policies import Raise, decide_failure, learned_nothing
from growpipe.loop.stats import StageStats, merge_by_stage
from growpipe.nn.guard import SKIPPED, guarded_update
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from growpipe.tracking import epoch_metrics
from tests.conftest import tiny_config

STOP_HINT = "lower train.lr, or set train.on_nonfinite=skip_batch to skip such batches"
BLOCK_CLASSES = {"al": "ALBlock", "scpl": "SCPLBlock", "dascpl": "DASCPLBlock", "bp": "BPBlock"}


def _net(method: str, mode: str, **train) -> tuple[GrowableNet, object]:
    cfg = tiny_config(method=method, train={"on_nonfinite": mode, **train})
    bundle = load_data(cfg.data, cfg.seed)
    return GrowableNet.build(cfg.rule(), cfg.net, InputInfo.from_bundle(bundle, cfg.net)), bundle


def _learned_state(net: GrowableNet) -> list[dict]:
    """Every block's weights and optimizer state (not its step count), copied."""
    return [copy.deepcopy({"modules": s["modules"], "optimizers": s["optimizers"]}) for s in net.state_dict()["blocks"]]


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict | list | tuple):
        for v in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(v)


def _same(a, b) -> bool:
    ta, tb = list(_tensors(a)), list(_tensors(b))
    return len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def _all_finite(obj) -> bool:
    return all(bool(t.isfinite().all()) for t in _tensors(obj) if t.is_floating_point())


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl", "bp"])
def test_a_nan_input_stops_or_is_skipped_by_every_rule_before_any_weight_moves(method):
    net, bundle = _net(method, "stop")
    clean = next(iter(_batches(bundle)))
    poisoned = copy.copy(clean)
    poisoned.x = clean.x.clone()
    poisoned.x[0] = float("nan")
    poisoned.index = 7
    before = _learned_state(net)
    with pytest.raises(NonFiniteError) as stop:
        net.train_step(poisoned)
    where = 1 if method == "bp" else 0  # BP's one loss is at the last block; a local rule's first block sees it
    pattern = rf"block {where} \({BLOCK_CLASSES[method]}\): non-finite loss \((\w+=nan(, )?)+\) at batch 7; "
    assert re.fullmatch(pattern + re.escape(STOP_HINT), str(stop.value)), str(stop.value)
    assert _same(_learned_state(net), before)

    for b in net.blocks:
        b.on_nonfinite = "skip_batch"
    steps = [b.steps for b in net.blocks]
    assert net.train_step(poisoned) == {f"b0.{SKIPPED}": 1.0, f"b1.{SKIPPED}": 1.0}  # block 1 gets NaN features
    assert _same(_learned_state(net), before)  # weights and optimizer state untouched
    assert [b.steps for b in net.blocks] == [s + 1 for s in steps]  # the RNG streams move on all the same
    metrics = net.train_step(clean)
    assert metrics and all(math.isfinite(v) for v in metrics.values()) and SKIPPED not in str(metrics)
    assert not _same(_learned_state(net), before)


def _batches(bundle, epoch: int = 1):
    from growpipe.data import iterate_batches

    return iterate_batches(bundle.train, 64, shuffle=True, seed=0, epoch=epoch)


def test_a_huge_rate_stops_at_the_first_non_finite_loss_with_every_weight_still_finite():
    net, bundle = _net("scpl", "stop", lr=1e8)
    with pytest.raises(NonFiniteError, match=r"^block 1 \(SCPLBlock\): non-finite loss \(supcon=nan") as stop:
        for p in _batches(bundle):
            net.train_step(p)
    assert stop.value.batch is not None and stop.value.batch > 0  # it trained (diverging) before
    assert _all_finite(_learned_state(net))


def test_non_finite_gradients_are_caught_and_huge_finite_ones_are_not():
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.1)
    with pytest.raises(NonFiniteError, match=r"^non-finite gradient \(loss l=0\); lower train.lr"):
        guarded_update({"l": torch.sqrt(w - 1).sum()}, [opt], "stop")  # sqrt(0) = 0, its slope is infinite
    assert guarded_update({"l": torch.sqrt(w - 1).sum()}, [opt], "skip_batch") == {SKIPPED: 1.0}
    assert torch.equal(w, torch.ones(3)) and w.grad is None and not opt.state
    big = torch.ones(1000, requires_grad=True)
    opt = torch.optim.SGD([big], lr=1e-30)
    metrics = guarded_update({"l": (big * 1e25).sum()}, [opt], "stop")  # huge, finite: squares would overflow
    assert metrics == {"l": pytest.approx(1e28, rel=1e-3)} and not torch.equal(big, torch.ones(1000))


def test_the_error_travels_in_one_line_and_an_epoch_that_skipped_everything_is_named():
    e = NonFiniteError("non-finite loss (ce=nan)", STOP_HINT).located("block 1 (BPBlock)", batch=3)
    e = pickle.loads(pickle.dumps(e)).located("stage 1 (block 1, BPBlock)", epoch=2, batch=9)  # batch kept
    assert str(e) == f"stage 1 (block 1, BPBlock): non-finite loss (ce=nan) at epoch 2, batch 3; {STOP_HINT}"
    assert isinstance(decide_failure(str(e), False, 0, 3, "ckpt/seq-1", True), Raise)  # never retried

    a, b = StageStats(0, batches=5), StageStats(1, batches=5)
    a.add_losses({"b0.ce": 1.0, f"b1.{SKIPPED}": 1.0})
    b.add_losses({f"b2.{SKIPPED}": 1.0})
    assert a.losses == {"b0.ce": 1.0} and a.skipped == {"b1": 1}
    idle = StageStats(1, batches=3, skipped={"b2": 3})
    assert learned_nothing([a, b]) is None  # each block learned from some batch
    assert merge_by_stage([a, b, idle])[1].skipped == {"b2": 4} and merge_by_stage([a, b, idle])[1].batches == 8
    assert learned_nothing(merge_by_stage([a, b, idle])) is None  # block 2 learned from 4 of the 8
    assert learned_nothing([a, idle]) == "block 2 (3 of 3) skipped every batch of the epoch (a non-finite loss or " \
        "gradient each time)"  # fmt: skip


def test_skip_batch_counts_the_batches_a_nan_sample_spoils_and_stop_names_that_batch(tmp_path: Path):
    cfg = tiny_config(method="scpl", threads=1, train={"epochs": 2, "on_nonfinite": "skip_batch"})
    bundle = load_data(cfg.data, cfg.seed)
    bundle.train.x[5] = float("nan")  # one sample: one batch per epoch
    lines: list[str] = []
    result = train_local(cfg, progress=lines.append, bundle=bundle).result
    assert [row["skipped_batches"] for row in result["history"]] == [{"b0": 1, "b1": 1}] * 2
    assert result["skipped_batches"] == {"b0": 2, "b1": 2}
    assert all(math.isfinite(v) for row in result["history"] for v in row["loss"].values())
    assert sum(line.endswith("| skipped batches b0=1 b1=1") for line in lines) == 2, lines
    assert epoch_metrics(result["history"][0])["skipped_batches.b1"] == 1

    where = next(b for b, idx in batch_order(len(bundle.train), 64, shuffle=True, epoch=1) if 5 in idx.tolist())
    with pytest.raises(NonFiniteError) as stop:
        train_local(cfg.model_copy(update={"train": cfg.train.model_copy(update={"on_nonfinite": "stop"})}),
                    progress=None, bundle=bundle)  # fmt: skip
    assert (stop.value.epoch, stop.value.batch) == (1, where)
    assert str(stop.value).startswith(f"block 0 (SCPLBlock): non-finite loss (supcon=nan) at epoch 1, batch {where};")


@pytest.mark.usefixtures("mlflow_db")  # an empty store at tmp_path/mlflow.db
def test_a_diverging_run_exits_1_with_one_line_keeps_its_finite_checkpoints_and_fails_in_mlflow(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from growpipe.checkpoint import CheckpointStore

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sets = ["name=diverges", "method=scpl", "train.lr=1e8", "train.epochs=2", "net.width=64", "threads=1",
            f"tracking.uri={uri}", "tracking.experiment=tests", f"tracking.workdir={tmp_path}",
            "tracking.system_metrics=false", f"checkpoint.uri={tmp_path / 'ck'}", "checkpoint.every_batches=2",
            "checkpoint.keep=10"]  # fmt: skip
    assert main(["train", "--runtime", "local", "-q", *(a for kv in sets for a in ("--set", kv))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    found = re.fullmatch(r"growpipe train: error: (block 1 \(SCPLBlock\): non-finite loss \(supcon=nan\) at epoch 1, "
                         rf"batch (\d+); {re.escape(STOP_HINT)})", err[0])  # fmt: skip
    assert found, err[0]
    message, batch = found.group(1), int(found.group(2))

    store = CheckpointStore(str(tmp_path / "ck"), "diverges")
    newest = store.latest()
    assert newest is not None and (newest.epoch, newest.batch) == (0, batch // 2 * 2)  # none after the failure
    manifest = store.read_manifest(newest)
    assert _all_finite(store.load_blocks(newest.path, manifest["shards"], [0, 1]))  # the resume point

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["growpipe.end_reason"] == message


def _bp_stages(cfg) -> tuple[list, InputInfo]:
    """Two pipelined-BP stages of `cfg` (runtime.engine: gpipe or 1f1b) in this process, set up, and the
    input info."""
    from growpipe.nn.net import plan_blocks
    from growpipe.runtime.async_bp import AsyncBPStage
    from growpipe.runtime.bp_stage import BPStage

    one_f_one_b = cfg.runtime.engine == "1f1b"
    threads = torch.get_num_threads()
    try:  # a stage sets torch's threads to runtime.cpus_per_stage
        stages = [(AsyncBPStage if one_f_one_b else BPStage)(i, cfg) for i in range(2)]
    finally:
        torch.set_num_threads(threads)
    info, _ = stages[0].load_data()
    for i, (st, spec) in enumerate(zip(stages, plan_blocks(cfg.net, cfg.rule(), info), strict=True)):
        st.setup(spec, info, i == 1, *((2, False) if one_f_one_b else ()))
    return stages, info


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_bp_skips_a_non_finite_mini_batch_on_every_stage_or_stops_on_it(schedule):
    """The stage classes in this process, driven in each schedule's order: the last stage decides."""
    from growpipe.data.batches import micro_slices

    cfg = tiny_config(method="bp", threads=1, train={"on_nonfinite": "skip_batch"},
                      runtime={"engine": schedule}, bp_pipeline={"micro_batches": 2})  # fmt: skip
    one_f_one_b = schedule == "1f1b"
    stages, _ = _bp_stages(cfg)
    split = stages[0].bundle.train
    _, spoiled = next(batch_order(len(split), 64, shuffle=True, epoch=1, start_batch=1))
    split.x[spoiled] = float("nan")  # every sample of batch 1

    def train(b: int, spoil_first_stage: bool = False):
        if one_f_one_b:
            stages[1].forward(1, b, stages[0].forward(1, b))
            return stages[0].backward(b, stages[1].backward(b, None))
        shares = [len(part) / 64 for part in micro_slices(64, 2)]
        for m, share in enumerate(shares):
            stages[1].forward(1, b, m, share, stages[0].forward(1, b, m, share))
        for m in reversed(range(len(shares))):
            stages[0].backward(m, stages[1].backward(m, None))
        if spoil_first_stage:  # a finite loss, but block 0's gradients are not
            next(stages[0].block.parameters()).grad.view(-1)[0] = float("inf")
        verdicts = [stages[1].verdict(b), stages[0].verdict(b)]
        assert [st.step(b, *verdicts) for st in stages] == [verdicts[0] or verdicts[1]] * 2
        return verdicts[0] or verdicts[1]

    def learned() -> list:
        return [copy.deepcopy(st.state_dict()) for st in stages]

    train(0)
    before = learned()
    verdict = train(1)
    assert all(_same(a["modules"], b["modules"]) and _same(a["optimizers"], b["optimizers"])
               for a, b in zip(learned(), before, strict=True))  # fmt: skip
    train(2)
    stats = [st.epoch_stats() for st in stages]
    assert [s.skipped for s in stats] == [{"b0": 1}, {"b1": 1}] and [s.batches for s in stats] == [3, 3]
    assert [st.block.steps for st in stages] == [3, 3]  # a skipped mini-batch is a step, as in the reference
    assert math.isfinite(stats[1].losses["b1.ce"]) and stats[1].loss_batches == {"b1.ce": 2}
    assert _all_finite(learned())

    for st in stages:
        st.block.on_nonfinite = "stop"
    stop = f"stage 1 (block 1, BPBlock): non-finite loss (ce=nan) at batch 1; {STOP_HINT}"
    if one_f_one_b:  # the last stage raises; the stages above never get a gradient of the mini-batch
        with pytest.raises(NonFiniteError, match=re.escape(stop)):
            train(1)
    else:  # every stage gets every stage's verdict; the engine raises the first (train.on_nonfinite: stop)
        assert str(verdict) == stop
        before = learned()
        gradient = train(3, spoil_first_stage=True)  # no stage steps when any stage's gradients are not finite
        assert str(gradient) == f"stage 0 (block 0, BPBlock): non-finite gradient at batch 3; {STOP_HINT}"
        assert all(_same(a["modules"], b["modules"]) for a, b in zip(learned(), before, strict=True))


@pytest.mark.usefixtures("ray_session")
def test_the_ray_pipeline_stops_at_the_reference_trainers_batch_naming_stage_block_epoch_and_batch():
    from growpipe.errors import PipelineError
    from growpipe.runtime.pipeline import Pipeline
    from tests.conftest import run_actors

    cfg = tiny_config(name="diverges-on-ray", method="scpl", threads=1, train={"epochs": 2, "lr": 1e8})
    with pytest.raises(NonFiniteError) as reference:
        train_local(cfg, progress=None)
    where = f"stage 1 (block 1, SCPLBlock): non-finite loss (supcon=nan) at epoch 1, batch {reference.value.batch}"
    with pytest.raises(PipelineError) as ray_run, Pipeline(cfg) as p:
        p.train(progress=None)
    assert str(ray_run.value) == f"{where}; {STOP_HINT}"
    assert run_actors("diverges-on-ray") == []


@pytest.mark.usefixtures("ray_session")
def test_gpipe_skips_like_single_process_bp_and_stops_once_an_epoch_learns_nothing():
    from growpipe.api import train
    from growpipe.errors import PipelineError

    cfg = tiny_config(name="gpipe-skips", method="bp", threads=1, bp_pipeline={"micro_batches": 2},
                      train={"epochs": 2, "lr": 1e20, "on_nonfinite": "skip_batch"})  # fmt: skip
    runs = {}
    for runtime in ("local", "ray"):
        lines: list[str] = []
        with pytest.raises((NonFiniteError, PipelineError)) as stop:
            train(cfg, runtime=runtime, progress=lines.append)
        runs[runtime] = (str(stop.value), [line.split("| ")[-1] for line in lines if line.startswith("epoch")])
    assert runs["ray"] == runs["local"]
    message, skipped = runs["ray"]
    assert skipped == ["skipped batches b0=21 b1=21"]  # epoch 1: only the first mini-batch was finite
    assert message.startswith("block 0 (22 of 22), block 1 (22 of 22) skipped every batch of the epoch")
    assert " at epoch 2; lower train.lr" in message


def test_grad_clip_scales_each_optimizers_gradients_on_its_own_before_the_step():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)

    def step(grad_clip: float | None) -> tuple[list[float], list[float]]:
        for w in (a, b):
            w.data.zero_()
        opts = [torch.optim.SGD([a], lr=1.0), torch.optim.SGD([b], lr=1.0)]  # a step moves w by -grad
        loss = (a * torch.tensor([3.0, 4.0])).sum() + (b * torch.tensor([0.3, 0.4])).sum()  # norms 5 and 0.5
        guarded_update({"l": loss}, opts, "stop", grad_clip=grad_clip)
        return a.tolist(), b.tolist()

    assert step(None) == ([-3.0, -4.0], [pytest.approx(-0.3), pytest.approx(-0.4)])
    clipped_a, clipped_b = step(1.0)  # a to norm 1; b under it stays (one norm over both would shrink b too)
    assert clipped_a == pytest.approx([-0.6, -0.8], abs=1e-6) and clipped_b == pytest.approx([-0.3, -0.4])


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_grad_clip_at_or_below_zero_is_refused_in_one_line(value, capsys):
    assert main(["train", "--runtime", "local", "-q", "--set", f"train.grad_clip={value}"]) == 2
    err = capsys.readouterr().err
    assert f"train.grad_clip: got {float(value)}; give a norm above 0 (e.g. 1.0), or null for no clipping" in err


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_bp_stages_clip_their_block_as_single_process_bp_does(schedule):
    """Each stage clips its own block's gradients before its step (GPipe in step, 1F1B in backward): the
    weights of single-process BP with the same train.grad_clip, and not those of a run without it."""
    cfg = tiny_config(method="bp", threads=1, train={"grad_clip": 0.1}, runtime={"engine": schedule},
                      bp_pipeline={"micro_batches": 1})  # fmt: skip
    one_f_one_b = schedule == "1f1b"
    stages, info = _bp_stages(cfg)
    clipped = GrowableNet.build(cfg.rule(), cfg.net, info)
    free = GrowableNet.build(cfg.model_copy(update={"train": cfg.train.model_copy(update={"grad_clip": None})}).rule(),
                             cfg.net, info)  # fmt: skip
    for b in range(4):
        packet = stages[0].reader.get(1, b).parts[0]
        clipped.train_step(packet)
        free.train_step(packet)
        if one_f_one_b:
            stages[1].forward(1, b, stages[0].forward(1, b))
            stages[0].backward(b, stages[1].backward(b, None))
        else:
            stages[1].forward(1, b, 0, 1.0, stages[0].forward(1, b, 0, 1.0))
            stages[0].backward(0, stages[1].backward(0, None))
            verdicts = [stages[1].verdict(b), stages[0].verdict(b)]
            assert [st.step(b, *verdicts) for st in stages] == [None, None]
    for st, ref, other in zip(stages, clipped.blocks, free.blocks, strict=True):
        ours = st.block.modules.state_dict()
        for k, v in ref.modules.state_dict().items():
            assert torch.allclose(ours[k], v, atol=1e-6, rtol=0), k
        assert any(not torch.allclose(ours[k], v, atol=1e-4) for k, v in other.modules.state_dict().items())
