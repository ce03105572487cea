"""Controller: the actor that hosts a run's loop on the cluster, named `RUN@ATTEMPT` (runtime/names.py) so that
`growpipe grow --run RUN` finds it. It picks the engine from the config (the local-learning pipeline, GPipe /
1F1B, or Ray Train DDP), runs the loop in one thread and answers the driver's event stream, status and grow
calls from others (threaded, no CPU).

It owns its shutdown: `stop()` ends the run midway (its engine stopped, so run() returns at once), run()'s end
releases the engine, and `close()`, the driver's last call, ends the actor the orderly way (ray.actor.exit_actor,
once the calls running in it returned). The driver kills it only when it does not end within a bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from growpipe import envvars
from growpipe.config import RunConfig
from growpipe.errors import BAD_INPUT
from growpipe.loop.engine import Engine
from growpipe.loop.loop import RunLoop
from growpipe.prepare import checkpoint_store, run_callbacks
from growpipe.runtime import NAMESPACE
from growpipe.runtime.ddp import DDPEngine
from growpipe.runtime.events import RunEvents
from growpipe.runtime.gpipe import BPPipelineEngine
from growpipe.runtime.pipeline_engine import PipelineEngine

POSITION_EVERY_S = 0.5  # how often a progress bar's position is pushed while an epoch runs


def make_engine(cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None, say: Any,
                actor_name: str | None = None) -> Engine:  # fmt: skip
    """The Ray engine the config names (RunConfig.engine). A stage engine names its actors after `actor_name`,
    the controller's (runtime/names.py: RUN@ATTEMPT/stageK), DDP its Ray Train storage after the run."""
    if cfg.engine() == "ddp":
        return DDPEngine(cfg, run_name)
    stages = PipelineEngine if cfg.engine() == "pipeline" else BPPipelineEngine
    return stages(cfg, actor_name or run_name, reserved, say)


class Controller:
    """One run on the cluster: its loop, its engine and its events."""

    def __init__(self, cfg: RunConfig, run_name: str, reserved: tuple[Any, int] | None = None,
                 resume: str | None = None, actor_name: str | None = None):  # fmt: skip
        """`reserved` = (placement group, first bundle) to place the stages in (a Tune trial's); `resume`:
        the checkpoint directory to start from (`cfg` names the MLflow run it continues: growpipe.resume);
        `actor_name`: this actor's name (RUN@ATTEMPT), after which its stage actors are named."""
        self.events = RunEvents()
        store = checkpoint_store(cfg, run_name)
        say = self.events.say
        engine = make_engine(cfg, run_name, reserved, say, actor_name)
        callbacks = [*run_callbacks(cfg, run_name, say, on_ray=True), self.events]
        self.loop = RunLoop(cfg, engine, run_name=run_name, store=store, callbacks=callbacks, say=say,
                            resume=resume)  # fmt: skip
        self.loop.epoch_gate = self.events.settled

    def run(self, keep_net: bool = True, paced: bool = False, positions: bool = False) -> dict[str, Any]:
        """Drive the run to its end; the result JSON, or {'error': message, 'bad_input': bool}. `keep_net`:
        gather every block's weights at the end for final_state (else only a callback that wants the net
        does); `paced`: train an epoch only once the driver took the one before (see `took`); `positions`:
        push the running epoch's position into the events (a progress bar)."""
        self.loop.keep_net = keep_net
        self.events.paced = paced
        self.loop.feed.every_s = POSITION_EVERY_S if positions else None
        try:
            result = self.loop.run()  # its engine is stopped when it returns
        finally:
            self.events.end()
        if "error" in result:
            result["bad_input"] = isinstance(self.loop.failure, BAD_INPUT)
        return result

    def events_from_start(self) -> Iterator[dict[str, Any]]:
        """The run's events as they happen (a streaming generator: the driver gets each one as it is
        yielded), from the first, until run() returns (growpipe.runtime.events)."""
        yield from self.events.follow()

    def took(self, epoch: int) -> None:
        """The driver has handled the epoch events up to `epoch` (a paced run trains the next one)."""
        self.events.take(epoch)

    def grow(self, request: dict[str, Any]) -> dict[str, Any]:
        """Append a block to this running job (see RunLoop.grow)."""
        return self.loop.grow(request)

    def final_state(self) -> dict[str, Any] | None:
        """After FINISHED: the topology, input description and every block's state."""
        return self.loop.final()

    def status(self) -> dict[str, Any]:
        """A small snapshot: state, finished epochs, blocks, and whether the run has ended (`ended`)."""
        return {**self.loop.status(), "ended": self.loop.state.terminal}

    def position(self) -> dict[str, Any]:
        """The epoch running (or the last finished) and the engine's (batches done, batches in the epoch) of it
        (None between epochs): a bench's pace, apart from status(), which never waits on a stage."""
        status = self.loop.status()
        training = status["state"] == "training"
        return {"epoch": status["epoch"], "position": self.loop.engine.position() if training else None}

    def stop(self, reason: str | None = None) -> None:
        """End the run midway: recorded as stopped (`reason`; KILLED in MLflow), grow requests refused, the
        engine stopped (its workers and placement groups released), so that run() returns at once; a paced
        run waits for no follower any more."""
        self.loop.shutdown(reason)
        self.events.release()

    def close(self) -> None:
        """The driver's last call (after run() returned, or after stop()): whatever the engine still holds is
        released (run() may never have run), the event stream ends, and this actor exits once the calls
        running in it have returned (ray.actor.exit_actor): the call fails as the driver sees it die. Killing
        a threaded actor outright instead can abort it in Ray's core (a native dump in the driver's output)."""
        self.loop.shutdown()
        self.events.release()
        self.events.end()
        ray.actor.exit_actor()


def launch_controller(cfg: RunConfig, run_name: str, actor_name: str, reserved: tuple[Any, int] | None = None,
                      resume: str | None = None) -> Any:  # fmt: skip
    """Start a run's controller actor: named `actor_name` (RUN@ATTEMPT: found by run name in the growpipe
    namespace, runtime/names.py), threaded, no CPU, on the head node (else the driver's), so that losing a
    worker node never takes the run's loop with it."""
    heads = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]]
    node = heads[0] if heads else ray.get_runtime_context().get_node_id()
    here = NodeAffinitySchedulingStrategy(node_id=node, soft=not heads)  # it needs no CPU: the head always fits
    return (
        ray.remote(Controller)
        .options(
            name=actor_name,
            namespace=NAMESPACE,
            num_cpus=0,
            max_concurrency=16,  # run() + the event stream + took() + grow() calls
            runtime_env={"env_vars": envvars.forwarded()},
            scheduling_strategy=here,
        )
        .remote(cfg, run_name, reserved, resume, actor_name)
    )
