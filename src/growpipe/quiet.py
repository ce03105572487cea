"""Library log lines a user cannot act on, kept out of growpipe's output.

MLflow's INFO lines (creating its tables, the system-metrics monitor starting and stopping, validating the
input example), alembic's, Ray's start-up line (growpipe prints the dashboard itself), Ray Train's and Tune's
bookkeeping (a line per trial checkpoint, the experiment state written) and two warnings that do not apply
(NOT_NEWS). Every process growpipe's code runs in calls quiet_libraries() before the libraries speak: the
command before Ray starts (growpipe.runtime.pipeline.connect), a run's controller actor (its MLflow tracker),
a Tune trial, a Serve replica. `MLFLOW_LOGGING_LEVEL=INFO` brings MLflow's lines back. A driver that joins a
cluster, or starts its own, also leaves out the lines of Ray's job supervisors (a job's end, sent to every driver
there) and of Ray Train's placement-group cleaner (it warns every few seconds when Ray runs no dashboard).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

MLFLOW_LOGGING_LEVEL = "MLFLOW_LOGGING_LEVEL"
"""MLflow (3.17) sets its loggers' level from this variable when it is imported: set before, it holds in every
process that inherits it (an embedded Ray's workers, and a run's actors: MLFLOW_* are forwarded)."""

QUIET_LOGGERS = (
    "alembic",  # "Context impl SQLiteImpl", "Will assume non-transactional DDL" when MLflow makes its tables
    "ray._private.worker",  # "Started a local Ray instance. View the dashboard at ..."
    "ray._private.authentication",  # "Generated new authentication token and saved to ~/.ray/auth_token"
    "ray.train",  # "Checkpoint successfully created at: Checkpoint(...)" for every report of a trial
    "ray.tune.tune",  # "Wrote the latest version of all result files and experiment state to ..."
)
"""Loggers held at WARNING (their INFO lines are bookkeeping); their warnings still show."""

QUIET_FILE_LOGGERS = (
    "ray.train.v2._internal.execution.context",  # "Reporting training result N: ..." per report of every worker
)
"""Modules whose logger is named by their file's path, not their module name: held at WARNING in a process that
has imported them (a Ray Train worker has by the time its train function calls quiet_libraries)."""

NOT_NEWS = {
    "asyncio": ("LongPollClient._poll_next",),  # a Serve handle's poll that outlived the Ray it polled at exit
    "ray.serve": ("is larger than `max_ongoing_requests`",),
    "ray.tune.tune": ("Stop signal received", "Experiment has been interrupted, but the most recent state was saved"),
    "ray.tune.utils.util": ("which may be a performance bottleneck",),
}
"""Warnings dropped, by logger: asyncio's report of a Serve handle polling after `growpipe serve` shut its Ray
down (the answer to a stop, not a failure); Serve compares `max_batch_size` (rows for growpipe's replicas: serve.batch's
batch_size_fn counts them) with `max_ongoing_requests` (requests); Tune's lines on an interrupted sweep call
SIGTERM Ctrl+C and name Tuner.restore, where growpipe says it was interrupted and that the same command
resumes it (growpipe.tune.sweep); Tune's timing of its own steps ("took 0.768 s, which may be a performance
bottleneck") is a loaded machine's, not something a sweep file changes."""


class _DropNotNews(logging.Filter):
    def __init__(self, texts: tuple[str, ...]):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


def quiet_libraries() -> None:
    """Keep library lines a user cannot act on out of this process's output (and out of the processes it
    starts): MLflow at WARNING unless $MLFLOW_LOGGING_LEVEL says otherwise, the QUIET_LOGGERS at WARNING, the
    NOT_NEWS warnings dropped. Idempotent."""
    os.environ.setdefault(MLFLOW_LOGGING_LEVEL, "WARNING")
    level = logging.getLevelName(os.environ[MLFLOW_LOGGING_LEVEL].strip().upper())
    logging.getLogger("mlflow").setLevel(level if isinstance(level, int) else logging.WARNING)  # imported before
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for module in QUIET_FILE_LOGGERS:
        if (loaded := sys.modules.get(module)) is not None and loaded.__file__:
            logging.getLogger(loaded.__file__).setLevel(logging.WARNING)
    for name, texts in NOT_NEWS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotNews) for f in logger.filters):
            logger.addFilter(_DropNotNews(texts))


def drop_serve_teardown() -> None:
    """From here on, drop what Ray Serve says in this process: `growpipe serve` is stopping, and a handle's
    request still in flight failing as its replica goes ("temporarily unavailable"), or its callback finding
    Ray shut down (a traceback, from Serve's loggers or, for a long-poll update that lands after the shutdown,
    asyncio's "Exception in callback LongPollClient..."), is the stop itself."""
    logging.getLogger("ray.serve").addFilter(lambda _record: False)
    logging.getLogger("asyncio").addFilter(_DropNotNews(("LongPollClient.",)))


RAY_JOB_ACTORS = ("JobSupervisor", "PlacementGroupCleaner")
"""Ray's own bookkeeping actors: on a cluster with jobs (`ray job submit`) each job's supervisor says the job's
end at INFO, and Ray hands such lines (they belong to no job) to every driver on the cluster, another job's too;
Ray Train's placement-group cleaner warns every few seconds that it cannot reach the State API of a Ray that
runs no dashboard (the embedded one)."""


def quiet_ray_job_actors() -> None:
    """Keep the lines of RAY_JOB_ACTORS and the RAY_TRAIN_NOT_NEWS lines out of this driver's output (call once
    it has started or joined Ray with ray.init(log_to_driver=True): that registers the handler wrapped here).
    Idempotent."""
    # lazy: ray; tracking and local runs import this module
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    for name, handler in list(dispatcher.handlers):
        if name == "ray_print_logs" and not getattr(handler, "growpipe_quiet", False):
            dispatcher.remove_handler(name)
            dispatcher.add_handler(name, _without_job_actors(handler))


RAY_TRAIN_NOT_NEWS = (
    "Requesting resources:",  # the DDP trainer's controller, at every worker group it starts
    "Attempting to start training worker group",
    "Started training worker group",
    "- (ip=",  # one line per worker of that group
    "Setting up process group for",  # a Ray Train worker joining its group
    "has constructor arguments in the object store and max_restarts > 0",  # Ray's note on its own watcher actor
)
"""Lines of Ray Train's actors that say only that a worker group started (the run's lines say what it does);
a retry, a failure and every warning still show."""


def _without_job_actors(handler: Any) -> Any:
    def handle(data: dict[str, Any]) -> None:
        if data.get("actor_name") in RAY_JOB_ACTORS:
            return
        lines = [line for line in data.get("lines", []) if not any(t in line for t in RAY_TRAIN_NOT_NEWS)]
        if lines:
            handler({**data, "lines": lines})

    handle.growpipe_quiet = True  # type: ignore[attr-defined]
    return handle


def quiet_exit() -> None:
    """For a process Ray ends with SIGTERM (a Tune trial that Tune stopped): Ray's handler raises SystemExit
    wherever the main thread is, and where that is a weakref callback or a __del__, Python prints it as an
    ignored exception with its traceback, though the process is only being ended. Such SystemExits are not
    printed; any other ignored exception is, as before. Idempotent."""
    previous = sys.unraisablehook
    if getattr(previous, "growpipe_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, SystemExit):
            return
        previous(unraisable)

    hook.growpipe_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
