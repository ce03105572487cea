"""The library-noise checker (tests/noise.py) on lines `make demo`, a sweep and a serve run printed before
growpipe.quiet kept them out, and on growpipe's own lines, which never count; growpipe.quiet's settings."""

from __future__ import annotations

import logging
import os

from tests.noise import library_noise

LIBRARY_LINES = [
    "2026-11-27 11:53:32,308\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at "
    "\x1b[1m\x1b[32mhttp://127.0.0.1:8266 \x1b[39m\x1b[22m",
    "\x1b[36m(Controller pid=6202)\x1b[0m 2026/11/27 11:53:53 INFO mlflow.store.db.utils: Creating initial MLflow "
    "database tables...",
    "(Controller pid=6202) 2026/11/27 11:54:12 INFO mlflow.pyfunc: Validating input example against model signature",
    "2026/11/27 11:54:49 INFO mlflow.system_metrics.system_metrics_monitor: Started monitoring system metrics.",
    "2026-11-27 11:54:53,894\tWARNING tune.py:819 -- You have passed a `SearchGenerator` instance as the `search_alg`",
    "\x1b[36m(growpipe_train pid=7798)\x1b[0m Checkpoint successfully created at: Checkpoint(filesystem=local, "
    "path=/tmp/swp/out/trials/x/checkpoint_000000)",
    "To visualize your results with TensorBoard, run: `tensorboard --logdir /tmp/ray/session_x/driver_artifacts`",
    "\x1b[36m(ServeReplica:growpipe:NetServer pid=13534)\x1b[0m WARNING 2026-11-27 11:59:55,277 growpipe_NetServer "
    "pbrv7eu4 6325d40b -- `max_batch_size` (1024) * `max_concurrent_batches` (1) is larger than `max_ongoing_requests`",
    "INFO  [alembic.runtime.migration] Context impl SQLiteImpl.",
    "WARNING:root:something a library said",
    "/x/lib/python3.11/site-packages/torch/nn/modules/module.py:1: UserWarning: a library's warning",
    "[W1127 11:53:32.539862 123 ProcessGroupGloo.cpp:1] Warning: a torch C++ line",
    "(raylet) [2026-11-27 11:55:01,123 E 4321 4321] (raylet) worker_pool.cc:1: Some workers of the worker process",
]

GROWPIPE_LINES = [
    "ray    dashboard http://127.0.0.1:8266",
    "run    noise-probe-20110 (checkpoints in /tmp/noisewd/runs/checkpoints/noise-probe-20110)",
    "mlflow run 2527 in sqlite:////tmp/noisewd/runs/mlflow.db (mlflow ui, then http://127.0.0.1:5000/#/x)",
    "ckpt   ckpt-000000-0000000-0001 (epoch 0, batch 0)",
    "epoch   1/16 | blocks 2 (training 2) | loss b0.assoc=0.041 | acc @1=0.3756 @2=0.1111 | 3116 samples/s | 0.4s",
    "warn   MLflow at http://127.0.0.1:9 not reachable (ConnectionError: x); training goes on, metrics are kept",
    "mlflow model demo version 1 registered (LoggedModel models:/m-0123)",
    "│ growpipe_train_5bd3f_00000   TERMINATED        0.003        2            32.1704     0.242222 │",
    "| 5bd3f_00001 | 1e-09 | 0.0578 | 1 | stopped early (ASHA) |",
    "  stage  block         samples/s   busy s  wait-in s  blocked s   util  hop ms  max in flight  node      device",
    "growpipe train: stopped by SIGTERM",
]

EXCUSED_LINES = [  # as a loaded CI run printed them
    "(ServeController pid=29568) WARNING 2026-12-07 05:03:59,838 controller 29568 -- Proxy actor readiness check for "
    "proxy on 11b160fb0a83a2a67ea015cbc40a32d6658cd2b5d3ae3d9bab366ab3 didn't complete in 5.0s.",
    "(ProxyActor pid=29686) WARNING 2026-12-07 05:04:41,714 proxy 192.0.2.2 -- Failed to get queue length from "
    "Replica(id='7i3em3mf', deployment='NetServer', app='growpipe') within 0.1s.",
]


def test_library_noise_finds_library_log_lines_and_never_growpipes_own():
    output = "\n".join(GROWPIPE_LINES[:3] + LIBRARY_LINES + GROWPIPE_LINES[3:])
    found = library_noise(output)
    assert len(found) == len(LIBRARY_LINES), found
    assert found[0].startswith("2026-11-27 11:53:32,308\tINFO worker.py:2029 -- Started") and "\x1b" not in found[0]
    assert library_noise("\n".join(GROWPIPE_LINES)) == []
    assert library_noise("\n".join(EXCUSED_LINES)) == []


def test_quiet_libraries_keeps_mlflow_at_warning_unless_asked_and_drops_what_does_not_apply(monkeypatch):
    from growpipe.quiet import quiet_libraries

    monkeypatch.delenv("MLFLOW_LOGGING_LEVEL", raising=False)
    quiet_libraries()
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"  # inherited by the processes this one starts
    assert logging.getLogger("mlflow").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("ray.train._internal.storage").getEffectiveLevel() == logging.WARNING
    serve = logging.getLogger("ray.serve")
    message = "`max_batch_size` (1024) * `max_concurrent_batches` (1) is larger than `max_ongoing_requests` (64)."
    dropped = logging.LogRecord("ray.serve", logging.WARNING, "", 0, message, (), None)
    kept = logging.LogRecord("ray.serve", logging.WARNING, "", 0, "a replica is unhealthy", (), None)
    assert not serve.filter(dropped) and serve.filter(kept)
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "info")  # the user's choice holds
    quiet_libraries()
    assert logging.getLogger("mlflow").getEffectiveLevel() == logging.INFO
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "WARNING")
    quiet_libraries()


def test_serve_teardown_drops_a_long_poll_callback_that_finds_ray_shut_down_and_keeps_other_asyncio_errors(
    monkeypatch,
):
    """`growpipe serve` stopping: an update the controller pushed as the application went, handled after Ray
    shut down, is asyncio's "Exception in callback LongPollClient..." (a traceback, seen in a CI run)."""
    from growpipe.quiet import drop_serve_teardown

    for name in ("asyncio", "ray.serve"):  # the filters go with the test
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "filters", list(logger.filters))
    drop_serve_teardown()
    asyncio_logger = logging.getLogger("asyncio")
    late = "Exception in callback LongPollClient._process_update.<locals>.chained()"
    other = "Exception in callback Task.__step()"
    assert not asyncio_logger.filter(logging.LogRecord("asyncio", logging.ERROR, "", 0, late, (), None))
    assert asyncio_logger.filter(logging.LogRecord("asyncio", logging.ERROR, "", 0, other, (), None))


def test_a_process_being_ended_prints_no_systemexit_from_a_callback_and_every_other_ignored_exception(monkeypatch):
    """Ray's SIGTERM handler raises SystemExit where the main thread is; in a weakref callback Python would print
    it as an ignored exception. quiet_exit drops those and hands on every other one."""
    import sys
    import weakref

    from growpipe.quiet import quiet_exit

    seen: list = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)  # the hook before (restored after the test)
    quiet_exit()
    quiet_exit()  # once only

    class Thing:
        pass

    def ending(_):
        raise SystemExit(1)

    def failing(_):
        raise ValueError("a real problem")

    a, b = Thing(), Thing()
    refs = [weakref.ref(a, ending), weakref.ref(b, failing)]
    del a, b
    assert [type(u.exc_value) for u in seen] == [ValueError] and len(refs) == 2


def test_a_drivers_ray_lines_keep_ray_train_failures_and_drop_its_start_up_and_bookkeeping_actors():
    """What the driver's Ray log handler (growpipe.quiet.quiet_ray_job_actors) passes on, on lines a DDP run and
    a job cluster printed: a worker group's start-up and Ray's bookkeeping actors go, a retry and a warning stay."""
    from growpipe.quiet import _without_job_actors

    printed: list[dict] = []
    handle = _without_job_actors(printed.append)
    start_up = ["Requesting resources: {'CPU': 1.0} * 2", "Started training worker group of size 2: ",
                "- (ip=192.0.2.2, pid=1) world_rank=0, local_rank=0"]  # fmt: skip
    handle({"actor_name": "TrainController", "lines": [*start_up, "[FailurePolicy] RETRY"]})
    handle({"actor_name": "RayTrainWorker", "lines": ["Setting up process group for: env:// [rank=0, world_size=2]"]})
    handle({"actor_name": "PlacementGroupCleaner", "lines": ["Failed to query Ray Train Controller actor state."]})
    handle({"actor_name": "Controller", "lines": ["WARNING something a run should see"]})
    assert [(d["actor_name"], d["lines"]) for d in printed] == [
        ("TrainController", ["[FailurePolicy] RETRY"]),
        ("Controller", ["WARNING something a run should see"]),
    ]
