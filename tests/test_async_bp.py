"""Asynchronous 1F1B on the stage actors: the schedule, convergence against BP, and SpecTrain's prediction
lowering the weight staleness that weight stashing leaves."""

from __future__ import annotations

import pytest

from growpipe.api import train
from growpipe.errors import ConfigError
from growpipe.local import train_local
from growpipe.runtime.async_bp import Stretch, one_f_one_b_order
from tests.conftest import tiny_config


def test_1f1b_order_runs_k_minus_i_minus_1_ahead_and_alternates():
    k, n = 4, 10
    orders = one_f_one_b_order(k, n)
    for i, ops in enumerate(orders):
        assert sorted(ops) == sorted([("F", m) for m in range(n)] + [("B", m) for m in range(n)])
        for m in range(n):  # updates applied between a micro-batch's forward and its backward
            f, b = ops.index(("F", m)), ops.index(("B", m))
            assert sum(1 for op, _ in ops[f:b] if op == "B") == min(k - i - 1, m)  # the staleness
        steady = ops[k - i - 1 : k - i - 1 + 6]
        assert [op for op, _ in steady] == ["F", "B"] * 3  # one forward, one backward


class _Method:
    """A stage actor's method as Stretch calls it: `remote` records (op, mini-batch) in the stage's submission
    order and returns a stand-in ref."""

    def __init__(self, stage: int, op: str, log: list[list[tuple[str, int]]]):
        self.stage, self.op, self.log = stage, op, log

    def remote(self, *args: object) -> tuple[int, str, object]:
        batch = args[1] if self.op == "F" else args[0]
        self.log[self.stage].append((self.op, batch))  # type: ignore[arg-type]
        return (self.stage, self.op, batch)


class _Stage:
    def __init__(self, stage: int, log: list[list[tuple[str, int]]]):
        self.forward, self.backward = _Method(stage, "F", log), _Method(stage, "B", log)


@pytest.mark.parametrize("stop", [None, 0, 3])
def test_a_stretch_submitted_a_few_batches_ahead_ends_early_as_a_shorter_stretchs_1f1b_order(stop):
    """The engine's way (gpipe._1f1b): submit k+2 mini-batches ahead, one more as each is done; a pause after
    `stop` are done ends the stretch after those stage 0 was given: every stage's calls are then exactly the
    1F1B order of that shorter stretch (a prefix of the longer one's, then its drain)."""
    k, n, first = 4, 12, 5
    log: list[list[tuple[str, int]]] = [[] for _ in range(k)]
    stretch = Stretch([_Stage(i, log) for i in range(k)], epoch=1, first=first, batches=n)
    ahead = k + 2
    stretch.submit(ahead)
    assert [m for op, m in log[0] if op == "F"] == [first + m for m in range(ahead)]  # no forward past the window
    done = 0
    while done < stretch.batches:
        if done == stop:
            stretch.end_before(stretch.submitted)
        stretch.submit(done + ahead)
        assert stretch.last_call(done) == (0, "B", first + done)  # the mini-batch's last call
        done += 1
    length = n if stop is None else max(ahead, stop - 1 + ahead)  # what stage 0 had been given by then
    assert stretch.batches == done == length
    expected = one_f_one_b_order(k, length)
    assert log == [[(op, first + m) for op, m in ops] for ops in expected]


def _cfg(**runtime):
    return tiny_config(
        name=f"1f1b-{runtime.get('spectrain', False)}", method="bp", threads=1,
        net={"blocks": 3, "width": 64}, train={"epochs": 6}, runtime={"engine": "1f1b"}, bp_pipeline=runtime,
    )  # fmt: skip


@pytest.mark.usefixtures("ray_session")
def test_1f1b_converges_like_bp_and_spectrain_lowers_staleness():
    bp = train_local(_cfg(), progress=None).summary()["test_accuracy"]
    stash = train(_cfg(spectrain=False), progress=None).result
    spec = train(_cfg(spectrain=True), progress=None).result
    assert stash["schedule"] == "1F1B + weight stashing" and spec["schedule"] == "1F1B + SpecTrain"
    assert abs(stash["test_accuracy"] - bp) <= 0.01 and abs(spec["test_accuracy"] - bp) <= 0.01
    assert stash["staleness"][-1] == spec["staleness"][-1] == 0.0  # the last stage is never stale
    for i in (0, 1):
        assert spec["staleness"][i] < 0.6 * stash["staleness"][i], (spec["staleness"], stash["staleness"])


def test_1f1b_needs_a_micro_batch_per_stage_refused_before_ray(monkeypatch: pytest.MonkeyPatch):
    import growpipe.runtime.pipeline

    def no_ray(*_a, **_k):
        raise AssertionError("Ray was reached before the config was refused")

    monkeypatch.setattr(growpipe.runtime.pipeline, "connect", no_ray)
    cfg = tiny_config(method="bp", net={"blocks": 3}, data={"limit_train": 100, "batch_size": 64},
                      runtime={"engine": "1f1b"})  # fmt: skip
    with pytest.raises(ConfigError, match="an epoch has 2 batch\\(es\\) for 3 stages"):
        train(cfg, progress=None)
