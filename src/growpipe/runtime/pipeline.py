"""Driver-side handle of a run on Ray (any method: the controller picks the engine): connect to (or start)
Ray, launch the controller, follow its progress, return the result, clean up."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import ray

from growpipe import signals
from growpipe.config import RunConfig
from growpipe.errors import InputError, PipelineError
from growpipe.prepare import logical_cpus_needed, resolve_paths
from growpipe.progress import EpochBar
from growpipe.runtime import NAMESPACE
from growpipe.runtime.controller import launch_controller
from growpipe.runtime.placement import reserved_bundles_problem
from growpipe.runtime.transport import check_transport

POLL_S = 0.5


def join_cluster(address: str, log_to_driver: bool) -> Any:
    """ray.init on an existing cluster, its failures said in one line with the fix: a missing or wrong auth
    token (Ray 2.60 clusters use token authentication), or nothing at `address`."""
    try:
        return ray.init(address=address, namespace=NAMESPACE, log_to_driver=log_to_driver)
    except ray.exceptions.AuthenticationError:
        raise InputError(
            f"--address {address}: the cluster uses token authentication and no token was found here; put the "
            "cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token"
        ) from None
    except ConnectionError as e:
        hint = "" if os.environ.get("RAY_AUTH_MODE") == "token" else (
            "; if it uses token authentication (Ray 2.60's default), set RAY_AUTH_MODE=token with the cluster's "
            "token in ~/.ray/auth_token")  # fmt: skip
        raise InputError(f"--address {address}: no Ray cluster answered ({str(e).splitlines()[0]}){hint}") from None


@contextlib.contextmanager
def _starting_ray() -> Any:
    """Around ray.init: it puts its own SIGTERM handler in place (sys.exit); put back the one the command
    installed (see growpipe.signals), and turn a signal that arrives meanwhile into a stop that releases
    whatever Ray had started."""
    import signal
    import threading

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
    if ray.is_initialized():
        return False, None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        with _starting_ray():
            ctx = join_cluster(address, log_to_driver=True)
        return True, _url(ctx.dashboard_url)
    cpus = cpus or cfg.runtime.num_cpus or max(os.cpu_count() or 1, logical_cpus_needed(cfg))
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
        self.run_name = run_name or self.cfg.name
        self.reserved = reserved
        self.dashboard_url: str | None = None
        self.controller: Any = None
        self._owns_ray = False
        self._stop_reason: str | None = None

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
        try:
            ray.get_actor(self.run_name, namespace=NAMESPACE)
        except ValueError:
            pass
        else:
            self.stop()
            raise InputError(f"a run named {self.run_name!r} is already running on this cluster; set name: to another")
        self.controller = launch_controller(self.cfg, self.run_name, self.reserved, self.resume)
        return self

    def train(
        self,
        progress: Callable[[str], None] | None = print,
        on_epoch: Callable[[dict[str, Any]], None] | None = None,
        bar: EpochBar | None = None,
        keep_net: bool = True,
    ) -> dict[str, Any]:
        """Run to the end, passing the controller's progress lines to `progress`, each finished epoch's row
        to `on_epoch` (e.g. a Tune report) and the running epoch's position to `bar`; raise PipelineError
        if the run fails."""
        if self.controller is None:
            self.start()
        if progress and self.dashboard_url:
            progress(f"ray    dashboard {self.dashboard_url}")
        controller = self.controller  # stop() may drop the handle from another thread
        ref = controller.run.remote(keep_net)
        try:
            return self._follow(controller, ref, progress, on_epoch, bar)
        finally:
            if bar is not None:
                bar.clear()  # also when the run fails or is stopped: its error starts on a clean line

    def _follow(self, controller: Any, ref: Any, progress: Callable[[str], None] | None,
                on_epoch: Callable[[dict[str, Any]], None] | None, bar: EpochBar | None) -> dict[str, Any]:  # fmt: skip
        """Pass on the controller's lines, rows and bar until its run() (`ref`) returns; its result."""
        seen = rows = 0
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=POLL_S)
                signals.check()  # a stop whose KeyboardInterrupt was swallowed where it landed
                seen = self._drain(controller, seen, progress)
                rows = self._report_rows(controller, rows, on_epoch)
                if ready:
                    break
                if bar is not None and bar.active:
                    self._draw(controller, bar)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from `ray job stop` (the CLI turns it into this)
            self.stop(f"interrupted ({signals.describe()})")
            raise
        except SystemExit:  # a Tune scheduler stopping this trial
            self.stop("stopped early by the Tune scheduler")
            raise
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError:  # killed by stop(), or its node went away
            why = f"stopped: {self._stop_reason}" if self._stop_reason else "the run's controller actor died"
            raise PipelineError(why) from None
        if bar is not None:
            bar.clear()
        self._drain(controller, seen, progress)
        self._report_rows(controller, rows, on_epoch)
        if "error" in result:
            raise (InputError if result.get("bad_input") else PipelineError)(result["error"])
        return result

    def _report_rows(self, controller: Any, since: int, on_epoch: Callable[[dict[str, Any]], None] | None) -> int:
        if on_epoch is None:
            return since
        try:
            rows = ray.get(controller.rows.remote(since), timeout=30)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return since
        for row in rows:
            on_epoch(row)
        return since + len(rows)

    def _draw(self, controller: Any, bar: EpochBar) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            pos = ray.get(controller.epoch_position.remote(), timeout=10)
            if pos:
                bar.update(pos["epoch"], pos["epochs"], pos["batch"], pos["batches"])

    def final_net(self) -> Any:
        """The trained net rebuilt in this process from the stages' final states (after train())."""
        from growpipe.nn.net import GrowableNet

        final = ray.get(self.controller.final_state.remote(), timeout=60)
        if final is None:
            raise PipelineError("the run has not finished, or ran with keep_net=False; call train() first")
        return GrowableNet.from_states(self.cfg.rule(), final["info"], final["topology"], final["states"])

    def _drain(self, controller: Any, seen: int, progress: Callable[[str], None] | None) -> int:
        try:
            lines, _ = ray.get(controller.progress.remote(seen), timeout=30)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return seen
        for line in lines:
            if progress:
                progress(line)
        return seen + len(lines)

    def stop(self, reason: str | None = None) -> None:
        """Release the run's workers and placement groups, kill the controller and disconnect if this
        handle connected. `reason`: the run is stopped before its end (its MLflow run ends KILLED)."""
        self._stop_reason = self._stop_reason or reason
        if self.controller is not None:
            with contextlib.suppress(ray.exceptions.RayError):  # already gone: its resources went with it
                ray.get(self.controller.shutdown.remote(reason), timeout=30)
            ray.kill(self.controller, no_restart=True)
            self.controller = None
            time.sleep(0.1)  # let the name be released before a next run reuses it
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
