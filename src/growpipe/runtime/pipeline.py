"""Driver-side handle of a run on Ray (any method: the controller picks the engine): connect to (or start)
Ray, launch the controller, follow the events it pushes (lines, epochs, the bar's position), return the result,
close the controller (it ends itself: runtime/controller.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray

from growpipe import signals
from growpipe.config import RunConfig
from growpipe.errors import InputError, PipelineError
from growpipe.nn.net import GrowableNet
from growpipe.prepare import logical_cpus_needed, resolve_paths
from growpipe.progress import EpochBar
from growpipe.quiet import quiet_libraries, quiet_ray_job_actors
from growpipe.runtime import NAMESPACE
from growpipe.runtime.cluster_record import AUTH_MODE_VAR, auth_problem, gcs_unreachable, has_token, use_token_auth
from growpipe.runtime.controller import launch_controller
from growpipe.runtime.names import controller_name, controllers
from growpipe.runtime.placement import reserved_bundles_problem
from growpipe.runtime.transport import check_transport

SIGNAL_CHECK_S = 0.5  # how long a wait for the next event goes without looking for a swallowed Ctrl-C
END_WAIT_S = 30.0  # how long a stopped run's controller may take to return from run() and exit: then it is killed
FLUSH_AT_EXIT_VAR = "RAY_task_events_shutdown_flush_timeout_ms"
FLUSH_AT_EXIT_MS = 500
"""How long ray.shutdown waits to send its last task events to an embedded Ray's GCS (Ray's default: 5 s). That
GCS goes with the command, so nobody reads them; and a SIGTERM sent to the command's process group (`kill --
-PGID`, systemd, timeout(1)) has already ended it, so the wait, always hit then, was 5 s for nothing."""

OnEpoch = Callable[[dict[str, Any], str | None], None]


def join_cluster(address: str, log_to_driver: bool, chosen_by: str | None = None) -> Any:
    """ray.init on an existing cluster (`chosen_by`: how `address` was chosen, for the messages), its failures
    said in one line with the fix, before ray.init would wait or retry: nothing listening at `address`, or a
    cluster that refuses this process's auth token (Ray 2.60 clusters use token authentication: with
    RAY_AUTH_MODE unset, the token on this machine is offered, as Ray's own `ray start --address` does)."""
    said = chosen_by or f"--address {address}"
    if why := gcs_unreachable(address):
        raise InputError(f"{said}: no Ray cluster answers at {address} ({why}); check the address")
    problem = auth_problem(address)
    if problem == "refused" and os.environ.get(AUTH_MODE_VAR) is None and has_token():
        use_token_auth()
        problem = auth_problem(address)
    if problem:
        found = (
            "no token was found here" if problem == "no token" or not has_token() else "the token here is not its own"
        )
        raise InputError(
            f"{said}: the Ray cluster at {address} refused this process (it uses token authentication and {found}); "
            "put the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH) and set "
            "RAY_AUTH_MODE=token"
        )
    try:
        return ray.init(address=address, namespace=NAMESPACE, log_to_driver=log_to_driver,
                        logging_level=logging.WARNING)  # fmt: skip
    except ray.exceptions.AuthenticationError:
        raise InputError(
            f"{said}: the cluster uses token authentication and no token was found here; put the "
            "cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token"
        ) from None
    except ConnectionError as e:
        raise InputError(f"{said}: no Ray cluster answered ({str(e).splitlines()[0]})") from None


@contextlib.contextmanager
def _starting_ray() -> Any:
    """Around ray.init: it puts its own SIGTERM handler in place (sys.exit); put back the one the command
    installed (see growpipe.signals), and turn a signal that arrives meanwhile into a stop that releases
    whatever Ray had started."""
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with signals.watching():
            yield
    except SystemExit as e:
        if e.code != signal.SIGTERM:  # not Ray's handler for SIGTERM (sys.exit(signum)) while ray.init ran
            raise
        signals.note(signal.SIGTERM)
        _release_partial_ray()
        raise KeyboardInterrupt("signal SIGTERM") from None
    except KeyboardInterrupt:
        _release_partial_ray()
        raise
    finally:
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
    if signals.received():  # it arrived inside ray.init and what it raised was caught there
        _release_partial_ray()
        signals.check()


def _release_partial_ray() -> None:
    with contextlib.suppress(Exception):
        ray.shutdown()
    node = getattr(ray._private.worker, "_global_node", None)
    if node is not None:  # ray.init stopped before the driver connected: its processes are not ray.shutdown's
        with contextlib.suppress(Exception):
            node.kill_all_processes(check_alive=False, allow_graceful=True)


def connect(cfg: RunConfig, address: str | None = None, cpus: int | None = None) -> tuple[bool, str | None]:
    """Make sure Ray is up: an existing connection, `address` / $RAY_ADDRESS, or an embedded local Ray
    (with `cpus` logical CPUs, default: enough for the run).

    Returns (True when this call started or connected Ray and so should shut it down, the dashboard URL).
    """
    quiet_libraries()  # before Ray starts: an embedded Ray's workers inherit the settings
    if ray.is_initialized():
        return False, None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        with _starting_ray():
            ctx = join_cluster(address, log_to_driver=True)
        quiet_ray_job_actors()  # another job's end is not this run's news
        return True, _url(ctx.dashboard_url)
    cpus = cpus or cfg.runtime.num_cpus or max(os.cpu_count() or 1, logical_cpus_needed(cfg))
    if os.environ.get(AUTH_MODE_VAR) is None:
        use_token_auth()  # what Ray 2.60 picks for a new local Ray, said here so that it does not warn of it
    os.environ.setdefault(FLUSH_AT_EXIT_VAR, str(FLUSH_AT_EXIT_MS))
    with _starting_ray():
        try:
            ctx = ray.init(
                address="local",  # a new Ray of its own, even when `ray start` left one running on this machine
                num_cpus=cpus,
                namespace=NAMESPACE,
                include_dashboard=cfg.runtime.dashboard,
                log_to_driver=True,
                _system_config={"max_direct_call_object_size": cfg.runtime.inline_kb * 1024},
            )
        except Exception as e:  # a raylet or GCS that did not come up in time (a loaded machine), ports, disk
            _release_partial_ray()
            raise PipelineError(
                f"the embedded Ray did not start ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                "on a loaded machine try again, or start a cluster once (raylocal/up) and pass --address"
            ) from None
    quiet_ray_job_actors()  # Ray Train's placement-group cleaner cannot reach a State API without the dashboard
    return True, _url(ctx.dashboard_url)


def _url(address: str | None) -> str | None:
    if not address:
        return None
    return address if "://" in address else f"http://{address}"


class Pipeline:
    """One run on Ray: `train()` blocks until the controller finishes and returns the result JSON."""

    def __init__(
        self,
        cfg: RunConfig,
        address: str | None = None,
        run_name: str | None = None,
        reserved: tuple[Any, int] | None = None,
        resume: str | None = None,
    ):
        """`reserved` = (placement group, first bundle) to place the stages in, e.g. a Tune trial's;
        `resume`: the checkpoint directory to continue from (see growpipe.resume.plan_resume)."""
        self.cfg = resolve_paths(cfg)  # paths from here: actors may run elsewhere
        self.resume = resume
        self.address = address
        name = run_name or self.cfg.name
        assert name is not None, "resolve_paths names every run"
        self.run_name = name
        self.reserved = reserved
        self.dashboard_url: str | None = None
        self.actor_name: str | None = None  # the controller's (RUN@ATTEMPT, runtime/names.py), once started
        self.controller: Any = None
        self._owns_ray = False
        self._stop_reason: str | None = None
        self._running: Any = None  # the controller's run() call, from train() until stop()

    def start(self) -> Pipeline:
        """Connect to Ray and launch the controller (refuses a second live run with the same name, a
        reserved placement group without a bundle for each block the run may grow to, and a pipeline.transport
        the config cannot use)."""
        check_transport(self.cfg)
        if self.reserved is not None:
            pg, first = self.reserved
            if why := reserved_bundles_problem(self.cfg, len(pg.bundle_specs), first):
                raise InputError(why)
        self._owns_ray, self.dashboard_url = connect(self.cfg, self.address)
        if any(status is None or not status["ended"] for _, _, status in controllers(self.run_name)):
            self.stop()
            raise InputError(f"a run named {self.run_name!r} is already running on this cluster; set name: to another")
        self.actor_name = controller_name(self.run_name)
        self.controller = launch_controller(self.cfg, self.run_name, self.actor_name, self.reserved, self.resume)
        return self

    def train(
        self,
        progress: Callable[[str], None] | None = print,
        on_epoch: OnEpoch | None = None,
        bar: EpochBar | None = None,
        keep_net: bool = True,
    ) -> dict[str, Any]:
        """Run to the end, passing the controller's progress lines to `progress`, each finished epoch's row
        and the checkpoint directory written at its boundary (None: none) to `on_epoch` (e.g. a Tune report),
        and the running epoch's position to `bar`; raise PipelineError if the run fails. With `on_epoch`, the
        next epoch trains only once it has returned (a Tune report that stops the trial stops the run first)."""
        if self.controller is None:
            self.start()
        if progress and self.dashboard_url:
            progress(f"ray    dashboard {self.dashboard_url}")
        controller = self.controller  # stop() may drop the handle from another thread
        stream = controller.events_from_start.remote()
        positions = bar is not None and bar.active
        ref = self._running = controller.run.remote(keep_net, paced=on_epoch is not None, positions=positions)
        try:
            return self._follow(controller, stream, ref, progress, on_epoch, bar)
        finally:
            if bar is not None:
                bar.clear()  # also when the run fails or is stopped: its error starts on a clean line

    def _follow(self, controller: Any, stream: Any, ref: Any, progress: Callable[[str], None] | None,
                on_epoch: OnEpoch | None, bar: EpochBar | None) -> dict[str, Any]:  # fmt: skip
        """Hand on the controller's events until its run() (`ref`) returns; its result."""
        try:
            for event in _events(stream):
                kind = event["kind"]
                if kind == "line" and progress:
                    progress(event["line"])
                elif kind == "position" and bar is not None:
                    bar.update(event["epoch"], event["epochs"], event["batch"], event["batches"])
                elif kind == "epoch" and on_epoch is not None:
                    on_epoch(event["row"], event["checkpoint"])
                    controller.took.remote(event["row"]["epoch"])
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from `ray job stop` (the CLI turns it into this)
            self.stop(f"interrupted ({signals.describe()})")
            raise
        except SystemExit:  # a Tune scheduler stopping this trial (its report raises it)
            self.stop("stopped early by the Tune scheduler")
            raise
        except ray.exceptions.RayActorError:  # it died (its node went away, or stop() had to kill it): said below
            pass
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError:
            why = f"stopped: {self._stop_reason}" if self._stop_reason else "the run's controller actor died"
            raise PipelineError(why) from None
        if "error" in result:
            raise (InputError if result.get("bad_input") else PipelineError)(result["error"])
        return result

    def final_net(self) -> Any:
        """The trained net rebuilt in this process from the stages' final states (after train())."""
        final = ray.get(self.controller.final_state.remote(), timeout=60)
        if final is None:
            raise PipelineError("the run has not finished, or ran with keep_net=False; call train() first")
        return GrowableNet.from_states(self.cfg.rule(), final["info"], final["topology"], final["states"])

    def stop(self, reason: str | None = None) -> None:
        """End the run's controller and disconnect if this handle connected. A run still going is stopped
        first (`reason`: why; its MLflow run ends KILLED) and its run() returns; then the controller, closed,
        has released its workers and placement groups and exits (see _end_controller)."""
        running = self._running is not None and not ray.wait([self._running], timeout=0)[0]
        if reason is None and running:
            reason = "the driver stopped following it"  # else its failure policy could restore the stages it lost
        self._stop_reason = self._stop_reason or reason
        controller, self.controller = self.controller, None
        if controller is not None:
            _end_controller(controller, self._running if running else None, reason)
        self._running = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _end_controller(controller: Any, running: Any, reason: str | None) -> None:
    """Stop the run (given a `reason`, or while its run() call `running` has not returned) and wait until run()
    has returned, then close the controller: it releases what its engine still holds and exits once its calls
    have returned. Killed only when that takes more than END_WAIT_S in all (a threaded actor killed while a call
    of its own completes can abort in Ray's core). A controller already dead has nothing left to wait for."""
    deadline = time.monotonic() + END_WAIT_S
    with contextlib.suppress(ray.exceptions.RayError):
        if reason is not None or running is not None:
            waits = [controller.stop.remote(reason), *([running] if running is not None else [])]
            ray.wait(waits, num_returns=len(waits), timeout=END_WAIT_S)
        closing = controller.close.remote()  # fails once the actor has exited
        if not ray.wait([closing], timeout=max(0.0, deadline - time.monotonic()))[0]:
            ray.kill(controller, no_restart=True)  # the last resort: still busy past END_WAIT_S


def _events(stream: Any) -> Iterator[dict[str, Any]]:
    """The events of a controller's stream as they arrive. The wait for the next one wakes every
    SIGNAL_CHECK_S only to raise a Ctrl-C / SIGTERM that code it landed in swallowed (signals.check)."""
    while True:
        ready, _ = ray.wait([stream], timeout=SIGNAL_CHECK_S)
        signals.check()
        if not ready:
            continue
        try:
            ref = next(stream)
        except StopIteration:
            return
        yield ray.get(ref)
