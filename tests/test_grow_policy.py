"""Bad input to growth: a plan that cannot hold stops before the run starts (one line naming the field and the
fix, exit 2); a grow request while the run is stopping is refused at once and changes nothing."""

import threading
import time

import pytest

from growpipe.cli import main
from growpipe.config import GrowStep
from growpipe.errors import ConfigError
from growpipe.loop.loop import RunLoop
from growpipe.loop.orders import GrowRequests
from growpipe.nn.net import plan_blocks, plan_growth_block
from growpipe.nn.specs import InputInfo
from tests.conftest import tiny_config
from tests.test_loop import FakeEngine, _cfg

QUIET = ["--set", "tracking.mlflow=false", "--set", "checkpoint.enabled=false"]
PLATEAU = ["--set", "data.val_fraction=0.1", "--set", "grow.max_blocks=3"]


@pytest.mark.parametrize(
    ("sets", "field", "fix"),
    [
        (["grow.max_blocks=3", "grow.schedule=[{kind: layer}, {kind: layer}]"], "grow.max_blocks (3)",
         "is below the 4 blocks the plan grows to (net.blocks 2 + 2 schedule step(s)); raise it to 4 or more, or "
         "plan fewer blocks"),
        (["grow.every_epochs=0", "grow.max_blocks=3"], "grow.every_epochs", "greater than or equal to 1"),
        (["grow.on_plateau.patience=0"], "grow.on_plateau.patience", "greater than or equal to 1"),
        (["grow.on_plateau.min_delta=-0.01"], "grow.on_plateau.min_delta", "greater than or equal to 0"),
        (["grow.joint.epochs=0"], "grow.joint.epochs", "greater than or equal to 1"),
        (["grow.joint={epochs: 1, lr_factor: 0}"], "grow.joint.lr_factor", "greater than 0"),
        (["grow.joint={epochs: 1}", "grow.schedule=[{kind: layer, epochs: 0}]"], "grow",
         "give that step epochs: 1 or more"),
    ],
    ids=["past-max-blocks", "interval", "patience", "min-gain", "joint-epochs", "joint-rate", "joint-last-step"],
)  # fmt: skip
def test_a_growth_plan_that_cannot_hold_is_one_line_and_exit_2(sets, field, fix, capsys, tmp_path):
    plateau = PLATEAU if "on_plateau" in sets[0] else []
    out = tmp_path / "result.json"
    argv = ["train", "--runtime", "local", *QUIET, *plateau, *(a for s in sets for a in ("--set", s))]
    assert main([*argv, "--json-out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0] == "growpipe train: error: 1 problem(s) before the run", err
    assert err[1].startswith(f"  {field}") and err[1].endswith(fix), err
    assert not out.exists()


def test_a_grow_request_while_the_run_is_stopping_is_refused_and_changes_nothing():
    from growpipe.local import LocalEngine

    cfg = tiny_config(name="stopping", grow={"max_blocks": 4})
    loop = RunLoop(cfg, LocalEngine(cfg))
    loop.step()  # STARTING: the net is built, the run about to train
    specs = list(loop.specs)
    loop.shutdown("asked to stop")
    answers: list[dict] = []
    asker = threading.Thread(target=lambda: answers.append(loop.grow({"kind": "layer"})), daemon=True)
    asker.start()
    asker.join(timeout=30)  # answered at once: nothing waits for a run that will not grow
    assert not asker.is_alive(), "a grow request to a stopping run waited instead of being refused"
    assert answers == [{"error": "run 'stopping' is stopping (asked to stop); nothing to grow"}]
    assert loop.specs == specs and loop.requests.pending == 0 and loop.requests.orders.empty()
    assert loop.engine.net is not None and loop.engine.net.depth == 2


STOPPING = "run 'r' is stopping (asked to stop); nothing to grow"


def _asking(requests: GrowRequests, run: RunLoop, answers: list[dict]) -> threading.Thread:
    """A caller's request from a daemon thread (it waits for its answer); returned once it is accepted."""
    asker = threading.Thread(target=lambda: answers.append(requests.submit({"kind": "layer"}, run)), daemon=True)
    before = requests.pending
    asker.start()
    deadline = time.monotonic() + 10
    while requests.pending == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert requests.pending == before + 1, "the request was not accepted"
    return asker


def _answered(asker: threading.Thread) -> None:
    asker.join(timeout=10)
    assert not asker.is_alive(), "a request's caller still waits after the requests were closed"


def test_closed_requests_queue_nothing_and_release_every_caller_waiting():
    """The invariant that keeps a request from being queued behind a stop: close() refuses from then on (under
    the lock submit checks it in), answers what was queued and what the loop had taken but not placed yet."""
    cfg = _cfg(grow={"max_blocks": 5})
    engine = FakeEngine()
    run = RunLoop(cfg, engine)
    run.step()  # STARTING: the first blocks built
    requests = GrowRequests(cfg, engine, "r", lambda _line: None)
    taken: list[dict] = []
    first = _asking(requests, run, taken)
    queued: list[dict] = []
    second = _asking(requests, run, queued)
    order = requests.next_order()  # the loop took the first one just before the stop
    assert order is not None
    requests.close(STOPPING)
    _answered(second)  # queued: answered by the close
    assert queued == [{"error": STOPPING}] and requests.next_order() is None
    assert not requests.prepare(order, run)  # taken before the close: refused, no block placed for it
    _answered(first)
    assert taken == [{"error": STOPPING}]
    assert requests.submit({"kind": "layer"}, run) == {"error": STOPPING}  # refused at once, nothing queued
    assert requests.orders.empty() and requests.pending == 0 and requests.prepared is None
    assert not [c for c in engine.calls if c[0] == "prepare"] and engine.depth == 2
    requests.close("run 'r' has errored; nothing to grow")  # the loop's own close at its end: the first reason stays
    assert requests.submit({"kind": "layer"}, run) == {"error": STOPPING}


def test_close_waits_for_the_block_being_placed_and_discards_it():
    """An engine that places while training: the block of a request is being placed (held by a gate) when
    the requests close; the close refuses new requests at once, waits for the placement, discards the block."""

    class Placing(FakeEngine):
        places_while_training = True

    cfg = _cfg(grow={"max_blocks": 4})
    engine = Placing()
    engine.gate = threading.Event()
    run = RunLoop(cfg, engine)
    run.step()
    requests = GrowRequests(cfg, engine, "r", lambda _line: None)
    answers: list[dict] = []
    with requests.pausing(run):  # an epoch runs
        asker = _asking(requests, run, answers)
        assert engine.preparing.wait(10)  # its block is being placed, in a thread of its own
        closing = threading.Thread(target=requests.close, args=(STOPPING,), daemon=True)
        closing.start()
        deadline = time.monotonic() + 10
        while requests.closed is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert requests.submit({"kind": "layer"}, run) == {"error": STOPPING}  # while the placement goes on
        engine.gate.set()
        closing.join(timeout=10)
        assert not closing.is_alive()
    _answered(asker)
    assert answers == [{"error": STOPPING}] and ("discard", 2) in engine.calls and engine.depth == 2
    assert requests.pending == 0 and requests.prepared is None and requests.orders.empty()


def test_a_request_refused_under_preserve_says_what_it_can_send_and_a_planned_step_what_to_set():
    """grow.init cannot change on a running job: a request is told the width to send; a conv block on maps it
    pools, which no request can change, names the net.blocks a run would start with."""
    answers: list[dict] = []
    askers: list[threading.Thread] = []
    loop: RunLoop

    def ask(epoch, batch):
        if (epoch, batch) == (1, 3) and not askers:
            askers.append(threading.Thread(target=lambda: answers.append(loop.grow({"kind": "layer", "width": 32})),
                                           daemon=True))  # fmt: skip
            askers[0].start()

    loop = RunLoop(_cfg(grow={"init": "preserve", "max_blocks": 4}), FakeEngine(on_batch=ask))
    result = loop.run()
    _answered(askers[0])
    assert answers == [{"error": "grow.init: preserve: block 2 (mlp) turns block 1's output (64,) into (32,), so it "
                                 "cannot start as the identity; send --width 64 (the features below)"}]  # fmt: skip
    assert result["blocks"] == 2 and result["growth"] == []  # the run went on as it was
    cfg = tiny_config(net={"backbone": "cnn", "widths": [8, 16]}, grow={"init": "preserve"})
    info = InputInfo((1, 8, 8), "float", 10)
    last = plan_blocks(cfg.net, cfg.rule(), info)[-1]
    maps = ("turns block 1's output (16, 2, 2) into (16, 1, 1), so it cannot start as the identity; a conv block "
            "pools 2x2 feature maps (it does while they are 2x2 or more)")  # fmt: skip
    with pytest.raises(ConfigError) as asked:
        plan_growth_block(cfg.net, info, last, GrowStep(kind="layer"), preserve=True, request=True)
    assert str(asked.value).endswith(f"{maps}, whatever the request; a run started with net.blocks >= 3 (its blocks "
                                     "bring them to 1x1, net.widths one per block) can")  # fmt: skip
    with pytest.raises(ConfigError) as planned:
        plan_growth_block(cfg.net, info, last, GrowStep(kind="layer"), preserve=True)
    assert str(planned.value).endswith(f"{maps}; set net.blocks >= 3 (its blocks bring them to 1x1, net.widths one "
                                       "per block), or set grow.init: fresh")  # fmt: skip
    deeper = tiny_config(net={"backbone": "cnn", "blocks": 3, "widths": [8, 16, 16]}, grow={"init": "preserve"})
    last = plan_blocks(deeper.net, deeper.rule(), info)[-1]  # the fix named: it can
    assert plan_growth_block(deeper.net, info, last, GrowStep(kind="layer"), preserve=True).encoder.params["gate"]
