"""Elastic on a real multi-node Ray cluster (three raylets on this machine): stages one per node, a node
lost and replaced, a node lost with no replacement (the run shrinks, then spreads out again when a node
joins: the elastic benchmark's measurement), and nothing left to run on (a clear failure, the checkpoint kept
for --resume)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import ray

from growpipe.checkpoint import CheckpointStore
from growpipe.errors import InputError, PipelineError
from growpipe.local import train_local
from growpipe.report import format_stage_table, format_topology_changes
from growpipe.runtime.pipeline import Pipeline
from tests.conftest import assert_same_weights, tiny_config

pytestmark = pytest.mark.usefixtures("multinode")


def _cfg(tmp_path: Path, name: str, epochs: int = 4, checkpoints: bool = True, **runtime):
    return tiny_config(
        name=name, method="dascpl", threads=1, net={"width": 32}, train={"epochs": epochs},
        checkpoint={"enabled": checkpoints, "uri": str(tmp_path / "ck"), "every_epochs": 1},
        runtime={"placement": "STRICT_SPREAD", "timeline_epoch": 0, "placement_timeout_s": 30, **runtime},
    )  # fmt: skip


def _node_of(p: Pipeline, block: int, cluster) -> object:
    """The worker raylet the actor of `block` runs on (the controller's status says)."""
    node_id = ray.get(p.controller.status.remote())["nodes"][block]
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


class _Run:
    """p.train() in a thread; its result, error and progress lines."""

    def __init__(self, p: Pipeline):
        self.lines: list[str] = []
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._go, args=(p,))
        self.thread.start()

    def _go(self, p: Pipeline) -> None:
        try:
            self.result = p.train(progress=self.lines.append)
        except BaseException as e:  # handed to the test
            self.error = e

    def wait_epoch(self, p: Pipeline, epoch: int, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while ray.get(p.controller.status.remote())["epoch"] < epoch:
            assert time.time() < deadline and self.error is None, (self.error, self.lines[-5:])
            time.sleep(0.1)

    def join(self, timeout: float = 240) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.lines[-10:]


def test_stages_spread_one_per_node_and_a_lost_node_replaced_ends_as_if_undisturbed(tmp_path, multinode, monkeypatch):
    gate = tmp_path / "gate"  # epoch 2 waits before its batch 3 until the node is lost and back
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"2:3:{gate}")
    calm = train_local(_cfg(tmp_path, "calm", checkpoints=False), progress=None).summary()
    with Pipeline(_cfg(tmp_path, "replaced")) as p:
        run = _Run(p)
        run.wait_epoch(p, 2)
        multinode.remove_node(_node_of(p, 1, multinode))
        time.sleep(2)
        multinode.add_node(num_cpus=1)  # capacity comes back within placement_timeout_s: replaced
        gate.touch()
        run.join()
    assert run.error is None, (run.error, run.lines[-12:])
    result = run.result
    assert result["restarts"] == 1 and [c["change"] for c in result["topology_changes"]] == ["replace"]
    nodes = [s["node"] for s in result["stages"]]
    assert len(set(nodes)) == 2 and all(nodes) and {s["device"] for s in result["stages"]} == {"cpu"}
    table = format_stage_table(result["stages"]).splitlines()
    assert all(row.split()[-2:] == [node[:8], "cpu"] for row, node in zip(table[1:], nodes, strict=True))
    assert result["test_accuracy"] == calm["test_accuracy"] and result["exit_accuracy"] == calm["exit_accuracy"]


def test_a_lost_node_without_a_replacement_shrinks_then_spreads_out_when_a_node_joins(tmp_path, multinode,
                                                                                      monkeypatch):  # fmt: skip
    """`growpipe bench elastic`'s measurement on a tiny run: the lost block runs packed into the surviving stage
    actor (the same maths: the reference trainer's weights), and once a node joins the blocks go back into
    their own actors at the next epoch boundary."""
    from tests.test_bench import _bench_module

    monkeypatch.setenv("GROWPIPE_STEP_DELAY_MS", "80")  # epochs of ~2 s: longer than a raylet takes to join
    timeout, epochs = 2.0, 6
    reference = train_local(_cfg(tmp_path, "ref", epochs, checkpoints=False), progress=None)
    cfg = lambda name: _cfg(tmp_path, name, epochs, placement_timeout_s=timeout)  # noqa: E731
    row = _bench_module("elastic").measure(multinode, cfg("calm"), cfg("shrunk"), keep_net=True)
    changes = row["topology_changes"]
    assert [c["change"] for c in changes] == ["shrink", "expand"], changes
    assert "node " in changes[0]["why"] and "shrink" in format_topology_changes(changes)
    assert changes[0]["actors"] == 1 and changes[1]["actors"] == 2 and changes[1]["epoch"] > changes[0]["epoch"]
    assert timeout <= row["loss_to_training_s"] < timeout + 15 and row["join_to_spread_s"] >= 0
    assert row["spread_samples_per_second"] > 0 and row["shrunk_samples_per_second"] > 0
    assert row["test_accuracy_disturbed"] == row["test_accuracy_undisturbed"] and row["restarts"] == 1  # the shrink
    assert_same_weights(reference.net, row["net"], atol=1e-6)


def _ddp_workers_alive() -> list[str]:
    """The nodes of the live Ray Train workers (from the GCS: this Ray runs no dashboard for the State API)."""
    return [a["Address"]["NodeID"] for a in ray._private.state.actors().values()
            if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE"]  # fmt: skip


def test_ddp_with_min_workers_trains_on_with_fewer_when_a_workers_node_is_lost(tmp_path, multinode, monkeypatch):
    """ddp.min_workers: Ray Train's elastic scaling restarts the group on the one node left (FailureConfig, not
    the loop, retries), and the run ends with its epoch trained."""
    gate = tmp_path / "gate"  # every worker waits before batch 1 of epoch 1 until the node is gone
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"1:1:{gate}")
    # start_timeout_s: Ray Train first asks for 2 workers again, each try waiting that long, until its view of the
    # cluster has the node's loss (its AutoscalingCoordinator looks every 20 s): short tries end that wait sooner.
    # A group the nodes left can hold is placed at once, and a try that timed out does not count against
    # FailureConfig's max_failures.
    cfg = tiny_config(name="ddp-elastic", method="bp", threads=1, net={"blocks": 2, "width": 32},
                      train={"epochs": 1}, data={"limit_train": 256, "batch_size": 64},
                      ddp={"workers": 2, "min_workers": 1, "start_timeout_s": 3},
                      runtime={"engine": "ddp", "max_stage_restarts": 2})  # fmt: skip
    with Pipeline(cfg) as p:
        run = _Run(p)
        deadline = time.time() + 180
        while not Path(f"{gate}.held").exists():  # a worker holds at batch 1: the group trained batch 0 together
            assert time.time() < deadline and run.error is None, (run.error, run.lines[-5:])
            time.sleep(0.1)
        nodes = _ddp_workers_alive()
        assert len(nodes) == 2, nodes
        multinode.remove_node(next(n for n in multinode.worker_nodes if n.node_id == nodes[0]))
        gate.touch()
        run.join()
    multinode.add_node(num_cpus=1)  # the next test's two workers
    multinode.wait_for_nodes()
    assert run.error is None, (run.error, run.lines[-12:])
    result = run.result
    assert result["epochs"] == 1 and result["restarts"] == 0 and result["workers_at_end"] == 1, result


def test_nothing_left_to_run_on_fails_clearly_and_the_checkpoint_resumes_later(tmp_path, multinode, monkeypatch):
    gate = tmp_path / "gate"  # epoch 2 holds at its batch 1 until the nodes are gone
    monkeypatch.setenv("GROWPIPE_HOLD_AT", f"2:1:{gate}")
    cfg = _cfg(tmp_path, "stranded", 3, placement_timeout_s=2.0, placement="SPREAD")
    store = CheckpointStore(str(tmp_path / "ck"), "stranded")
    with Pipeline(cfg) as p:
        run = _Run(p)
        deadline = time.time() + 120
        # held in epoch 2, and epoch 1's checkpoint (written in the background) complete
        while not Path(f"{gate}.held").exists() or (done := store.latest()) is None or done.epoch < 1:
            assert time.time() < deadline and run.error is None, (run.error, run.lines[-5:])
            time.sleep(0.1)
        nodes = ray.get(p.controller.status.remote())["nodes"]
        assert len(set(nodes)) == 2 and {n.node_id for n in multinode.worker_nodes} == set(nodes)  # SPREAD too
        for node in list(multinode.worker_nodes):
            multinode.remove_node(node)
        gate.touch()
        run.join()
    assert isinstance(run.error, PipelineError) and not isinstance(run.error, InputError)  # exit 1, not 2
    assert "no worker is left to run on" in str(run.error) and "--resume" in str(run.error)
    latest = store.latest()
    assert latest is not None and latest.epoch >= 1
    for _ in range(2):
        multinode.add_node(num_cpus=1)
    multinode.wait_for_nodes()
    with Pipeline(cfg, resume=latest.path) as p:
        result = p.train(progress=None)
    assert result["epochs"] == 3 and [h["epoch"] for h in result["history"]] == [1, 2, 3]
