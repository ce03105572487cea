"""Controller: the actor that hosts a run's loop on the cluster, named after the run so that `growpipe grow`
finds it. It picks the engine from the config (the local-learning pipeline, GPipe / 1F1B, or Ray Train DDP),
runs the loop in one thread and answers progress, status and grow calls from others (threaded, no CPU)."""

from __future__ import annotations

import threading
from typing import Any

import ray

from growpipe import envvars
from growpipe.config import RunConfig
from growpipe.errors import BAD_INPUT
from growpipe.loop.engine import Engine
from growpipe.loop.loop import RunLoop
from growpipe.prepare import checkpoint_store, run_callbacks
from growpipe.runtime import NAMESPACE


def make_engine(cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None, say: Any) -> Engine:
    """The Ray engine for a config: method bp by runtime.bp_schedule, the local-learning pipeline else."""
    if cfg.method != "bp":
        from growpipe.runtime.pipeline_engine import PipelineEngine

        return PipelineEngine(cfg, run_name, reserved, say)
    if cfg.runtime.bp_schedule == "ddp":
        from growpipe.runtime.ddp import DDPEngine

        return DDPEngine(cfg, run_name, reserved, say)
    from growpipe.runtime.gpipe import BPPipelineEngine

    return BPPipelineEngine(cfg, run_name, reserved, say)


class Controller:
    """One run on the cluster: its loop, its engine and its progress lines."""

    def __init__(self, cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None = None,
                 resume: str | None = None):  # fmt: skip
        """`reserved` = (placement group, first bundle) to place the stages in (a Tune trial's); `resume`:
        the checkpoint directory to start from (`cfg` names the MLflow run it continues: growpipe.resume)."""
        self._lock = threading.Lock()
        self._lines: list[str] = []
        store = checkpoint_store(cfg, run_name)
        engine = make_engine(cfg, run_name, reserved, self._say)
        callbacks = run_callbacks(cfg, run_name, self._say)
        self.loop = RunLoop(cfg, engine, run_name=run_name, store=store, callbacks=callbacks, say=self._say,
                            resume=resume)  # fmt: skip

    def run(self, keep_net: bool = True) -> dict[str, Any]:
        """Drive the run to its end; the result JSON, or {'error': message, 'bad_input': bool}. `keep_net`:
        gather every block's weights at the end for final_state (else only a callback that wants the net
        does)."""
        self.loop.keep_net = keep_net
        result = self.loop.run()
        if "error" in result:
            result["bad_input"] = isinstance(self.loop.failure, BAD_INPUT)
        return result

    def grow(self, request: dict[str, Any]) -> dict[str, Any]:
        """Append a block to this running job (see RunLoop.grow)."""
        return self.loop.grow(request)

    def _say(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def progress(self, since: int = 0) -> tuple[list[str], str]:
        """Progress lines from index `since` on, and the current state."""
        with self._lock:
            return self._lines[since:], self.loop.state.name

    def rows(self, since: int = 0) -> list[dict[str, Any]]:
        """Epoch result rows from index `since` on (for reporting to Tune)."""
        return list(self.loop.history[since:])

    def epoch_position(self) -> dict[str, int] | None:
        """Where the running epoch is: {epoch, epochs, batch, batches}; None outside an epoch."""
        return self.loop.position()

    def final_state(self) -> dict[str, Any] | None:
        """After FINISHED: the topology, input description and every block's state."""
        return self.loop.final()

    def status(self) -> dict[str, Any]:
        """A small snapshot: state, finished epochs, blocks."""
        return self.loop.status()

    def shutdown(self, reason: str | None = None) -> None:
        """Release every worker and placement group now (the driver calls this before killing the
        controller: placement groups outlive the actor that made them); `reason`: the run was stopped
        before its end (recorded as KILLED)."""
        self.loop.shutdown(reason)


def launch_controller(cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None = None,
                      resume: str | None = None) -> Any:  # fmt: skip
    """Start a run's controller actor: named (found by run name in the growpipe namespace), threaded, no CPU,
    on the head node (else the driver's), so that losing a worker node never takes the run's loop with it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    heads = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]]
    node = heads[0] if heads else ray.get_runtime_context().get_node_id()
    here = NodeAffinitySchedulingStrategy(node_id=node, soft=not heads)  # it needs no CPU: the head always fits
    return (
        ray.remote(Controller)
        .options(
            name=run_name,
            namespace=NAMESPACE,
            num_cpus=0,
            max_concurrency=16,  # run() + progress polls + grow() calls waiting for their turn
            runtime_env={"env_vars": envvars.forwarded()},
            scheduling_strategy=here,
        )
        .remote(cfg, run_name, reserved, resume)
    )
