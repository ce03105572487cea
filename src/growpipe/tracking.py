"""MLflow tracking of a run, as a run callback (the Ray controller and the reference trainer both call it).

Everything to log is queued first and sent in order; when the tracking server cannot be reached the run
goes on (one warning), the queue is retried at every epoch, and whatever is still unsent at the end is
written to a local JSON-lines file next to the run's outputs. A run never fails because of tracking.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from growpipe.config import RunConfig
from growpipe.errors import ConfigError
from growpipe.loop.callbacks import RunCallback
from growpipe.plots import plot_run
from growpipe.quiet import quiet_libraries
from growpipe.report import format_exits
from growpipe.serving import quiet_mlflow, save_model

MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
MODEL_NAME = "model"
"""The name of a run's LoggedModel (as `mlflow.pyfunc.log_model(name="model")` would call it)."""
TUNE_STOP = "stopped early by the Tune scheduler"
"""The reason a run stopped by Tune is given (growpipe.runtime.pipeline: Tune's report raised SystemExit)."""
STOPPED_EARLY = "stopped_early"
"""growpipe.end_reason of a trial a Tune scheduler stopped before its last epoch (the run ends FINISHED)."""


def default_tracking_uri(workdir: str | Path) -> str:
    """$MLFLOW_TRACKING_URI, else a sqlite store in `workdir` (MLflow 3.17 refuses plain-path file stores)."""
    env = os.environ.get(MLFLOW_TRACKING_URI)
    if env:
        return env
    return f"sqlite:///{(Path(workdir) / 'mlflow.db').resolve()}"


def ui_command(uri: str) -> str:
    """How to open the MLflow UI on `uri`."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f".venv/bin/mlflow ui --backend-store-uri {uri}  (then http://127.0.0.1:5000)"


def run_url(uri: str, experiment: str | None, run_id: str) -> str:
    """Where to see a run: its page on an MLflow server, or the store plus the page path for `mlflow ui`."""
    page = f"#/experiments/{experiment}/runs/{run_id}"
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}"
    return f"{run_id} in {uri} (mlflow ui, then http://127.0.0.1:5000/{page})"


def artifact_root(uri: str) -> str | None:
    """Where the artifacts of a new experiment in the store at `uri` go: for a sqlite file, `mlartifacts/`
    beside it (MLflow's own default, ./mlruns, is relative to whichever process creates the experiment: a
    Ray worker's, e.g. a job's temporary copy of the checkout); for a server, its own choice (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    return str(Path(uri.removeprefix("sqlite:///").split("?")[0]).parent / "mlartifacts")


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The id of MLflow experiment `name` in the store at `uri`, created when missing."""
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name, artifact_location=artifact_root(uri))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> {"data.name": "digits", ...}; lists as JSON; values cut to MLflow's 6000 chars."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = (json.dumps(v) if isinstance(v, list | tuple) else str(v))[:6000]
    return out


def epoch_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of one epoch row, under MLflow-friendly names."""
    m = {f"loss.{k}": v for k, v in row["loss"].items()}
    m.update({f"acc.exit{d}": a for d, a in zip(row["exit_depths"], row["exit_accuracy"], strict=True)})
    m["test_accuracy"] = row["test_accuracy"]
    if row.get("val_accuracy") is not None:
        m["val_accuracy"] = row["val_accuracy"]
    m["samples_per_second"] = row["samples_per_second"]
    m["blocks"] = row["blocks"]
    m.update({f"skipped_batches.{k}": n for k, n in row.get("skipped_batches", {}).items()})
    return m


class MlflowTracker(RunCallback):
    """Logs params, per-epoch metrics, growth events and the run's artifacts to one MLflow run."""

    def __init__(self, cfg: RunConfig, run_name: str, say: Any = print):
        self.cfg = cfg
        self.run_name = run_name
        self.uri = cfg.tracking.uri or default_tracking_uri(cfg.tracking.workdir)
        self.say = say
        self.run_id: str | None = cfg.tracking.run_id
        self.queue: list[dict[str, Any]] = []
        self.staging = Path(tempfile.mkdtemp(prefix="growpipe-mlflow-"))
        self.warned = False
        self.staged = 0
        self.status = "FINISHED"
        self.ended = False  # the run's end is sent (or spilled): nothing is logged after it
        self._lock = threading.RLock()  # on_stop comes from another thread than the run's
        self._monitor: Any = None  # the system-metrics thread
        self._client: Any = None
        self.experiment_id: str | None = None
        self.example: list[Any] | None = None  # a few raw test rows: the model's input example
        quiet_libraries()  # MLflow's INFO lines (tables, monitor, validation): also in a controller actor
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast; the queue retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

    # ---- the callback ----------------------------------------------------------------------------------
    def on_data(self, data: dict[str, Any]) -> None:
        data = dict(data)
        self.example = data.pop("example_rows", None)
        if not self.ended:
            self.queue.append({"op": "inputs", "data": data})

    def on_start(self) -> None:
        if self.ended:
            return
        if not self.cfg.tracking.run_id:  # an existing (resumed) run has its params already
            self.queue.append({"op": "params", "params": flatten(self.cfg.model_dump(mode="json"))})
        else:  # running again: how it ended before (status, tags) describes that end, not this run
            self.queue.append({"op": "resume"})
        self.artifact_text("config.yaml", _yaml(self.cfg.model_dump(mode="json")))
        self.flush()
        if self.run_id:
            self.say(f"mlflow run {run_url(self.uri, self.experiment_id, self.run_id)}")
            self._start_system_metrics()

    def _start_system_metrics(self) -> None:
        """CPU, memory, disk and network of this process's machine (GPU too when there is one) as system/*
        metrics, every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL (10) s, while the run lasts."""
        if not self.cfg.tracking.system_metrics or self._monitor is not None:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, resume_logging=bool(self.cfg.tracking.run_id),
                                                 tracking_uri=self.uri)  # fmt: skip
            self._monitor.start()
        except Exception as e:  # psutil missing, or the store refuses: the run goes on without them
            self.say(f"warn   MLflow system metrics not recorded ({type(e).__name__}: {str(e)[:160]})")
            self._monitor = None

    def after_epoch(self, row: dict[str, Any]) -> None:
        if self.ended:
            return
        self.queue.append({"op": "metrics", "metrics": epoch_metrics(row), "step": row["epoch"]})
        self.flush()

    def on_topology(self, event: dict[str, Any]) -> None:
        """A topology change (replace, shrink, expand): the stage actors it left, and why."""
        if self.ended:
            return
        self.queue.append({"op": "metrics", "step": event["epoch"], "metrics": {"topology.actors": event["actors"]}})
        self.queue.append({"op": "tags", "tags": {"growpipe.topology.last": f"{event['change']}: {event['why']}"}})

    def on_growth(self, event: dict[str, Any]) -> None:
        if self.ended:
            return
        metrics = {"growth.blocks": event["blocks"], "growth.block_added": event.get("block", event["blocks"] - 1)}
        self.queue.append({"op": "metrics", "step": event["epoch"], "metrics": metrics})

    def on_finish(self, summary: dict[str, Any]) -> None:
        if self.ended:
            return
        final = {
            "final.test_accuracy": summary["test_accuracy"],
            "final.samples_per_second": summary["samples_per_second"],
        }
        if summary.get("selected_epoch") is not None:  # model selection on the validation split
            final["final.selected_epoch"] = summary["selected_epoch"]
        if "accuracy" in (bar := summary.get("baseline") or {}):  # eval.baseline: the classical bar beside it
            final["final.baseline_accuracy"] = bar["accuracy"]
        for s in summary.get("stages", []):
            final[f"stage{s['stage']}.utilisation"] = s["utilisation"]
            final[f"stage{s['stage']}.samples_per_second"] = s["samples_per_second"]
        for r in summary["adaptive"]:
            final[f"adaptive.{r['threshold']:g}.accuracy"] = r["accuracy"]
            final[f"adaptive.{r['threshold']:g}.macs_saved"] = r["macs_saved_fraction"]
        self.queue.append({"op": "metrics", "metrics": final, "step": summary["epochs"]})
        self.artifact_text("evaluation.txt", format_exits(summary) + "\n")
        self.artifact_text("growth_history.json", json.dumps(summary["growth"], indent=2))
        with tempfile.TemporaryDirectory() as tmp:
            plot_run(summary, tmp)
            self.artifact_file(tmp, "plots")
        self.artifact_text("result.json", json.dumps({k: v for k, v in summary.items() if k != "timeline"}, indent=2))
        if summary.get("timeline"):
            self.artifact_text("pipeline_trace.json", json.dumps(summary["timeline"]))

    def on_final_net(self, net: Any, summary: dict[str, Any]) -> None:
        """The trained net: a checkpoint artifact and, with tracking.log_model, an MLflow model: a LoggedModel
        `model` of the run (a pyfunc with adaptive early exit; growpipe.serving) carrying the run's final
        metrics, registered under the run's name with tracking.register_model."""
        if self.ended:
            return
        from growpipe.checkpoint import save_net  # lazy: torch, which growpipe mlflow ui and replay never need

        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = save_net(Path(tmp) / "checkpoint", net, self.cfg, summary, self.run_id)
            self.artifact_file(checkpoint, "checkpoint")
            if self.cfg.tracking.log_model:
                model = self._stage(save_model(Path(tmp) / MODEL_NAME, checkpoint, net, self.example))
                register = self.run_name if self.cfg.tracking.register_model else None
                self.queue.append({"op": "model", "path": str(model), "name": MODEL_NAME, "step": summary["epochs"],
                                   "register": register})  # fmt: skip

    def close(self) -> Path | None:
        """Mark the run finished (or failed), make a last try to send; what is still unsent goes to a
        local JSON-lines file (returned). Staged files are removed once sent."""
        with self._lock:
            if not self.ended and self.status == "FINISHED":
                self.queue.append({"op": "tags", "tags": {"growpipe.end_reason": "finished"}})
        return self._end(self.status)

    def on_stop(self, reason: str) -> None:
        """Stopped from outside: end the MLflow run as KILLED with the reason, now (the process may be
        killed seconds later); nothing is logged after. Stopped by Tune (a scheduler, PBT, the sweep
        interrupted: the trial cannot tell which), a sweep's trial leaves its end to the sweep's process, which
        knows why (growpipe.tune.ends); a trial without a sweep run ends FINISHED, stopped_early."""
        if reason.startswith(TUNE_STOP):
            if self.cfg.tracking.parent_run_id:
                self._end(None)
                return
            tags = {"growpipe.end_reason": STOPPED_EARLY, "growpipe.stopped_early": "true"}
            status = "FINISHED"
        else:
            tags, status = {"growpipe.end_reason": reason}, "KILLED"
        with self._lock:
            if not self.ended:
                self.queue.append({"op": "tags", "tags": tags})
        self._end(status)

    def _end(self, status: str | None) -> Path | None:
        """No more logging: the system metrics' last samples, the run ended as `status` (None: left as it
        is, for someone else to end), the queue sent or spilled."""
        with self._lock:
            if self.ended:
                return None
            self.ended = True
            if self._monitor is not None:  # its last samples before the run ends
                with contextlib.suppress(Exception):
                    finish_system_metrics(self._monitor)
                self._monitor = None
            if status is not None:
                self.queue.append({"op": "end", "status": status})
            return self._drain()

    def on_error(self, message: str) -> None:
        """The run failed: it ends FAILED with the reason as growpipe.end_reason and in error.txt."""
        if self.ended:
            return
        self.queue.append({"op": "tags", "tags": {"growpipe.end_reason": message[:5000]}})
        self.artifact_text("error.txt", message + "\n")
        self.status = "FAILED"

    # ---- artifacts -------------------------------------------------------------------------------------
    def artifact_text(self, name: str, text: str, subdir: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            self.artifact_file(path, subdir)

    def artifact_file(self, path: str | Path, subdir: str | None = None) -> None:
        """Queue a file (copied now, so it may change or vanish afterwards) or a directory."""
        self.queue.append({"op": "artifact", "path": str(self._stage(path)), "subdir": subdir})

    def _stage(self, path: str | Path) -> Path:
        """A copy of a file or directory in the staging folder, kept until sent (or spilled for replay)."""
        src = Path(path)
        slot = self.staging / f"a{self.staged}"  # one folder per entry: same names never collide
        self.staged += 1
        slot.mkdir()
        dst = slot / src.name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        return dst

    # ---- sending ---------------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Send the queue in order; on failure keep the rest for later. True when everything is sent."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        try:
            client = self._client_or_connect()
            assert self.run_id is not None, "connecting starts the run"
            while self.queue:
                send_entry(client, self.run_id, self.queue[0])
                if line := registered_line(self.queue.pop(0)):
                    self.say(line)
            return True
        except Exception as e:  # the tracking store is down or refuses: training goes on
            if not self.warned:
                self.say(f"warn   MLflow at {self.uri} not reachable ({type(e).__name__}: {str(e)[:160]}); "
                         "training goes on, metrics are kept and retried")  # fmt: skip
                self.warned = True
            return False

    def _drain(self) -> Path | None:
        spill = None
        if not self.flush():
            name = f"mlflow-unsent-{self.run_name}-{int(time.time())}.jsonl"
            spill = Path(self.cfg.tracking.workdir).resolve() / name
            spill.parent.mkdir(parents=True, exist_ok=True)
            head = {"op": "run", "run_id": self.run_id, "run_name": self.run_name, "uri": self.uri,
                    "experiment": self.cfg.tracking.experiment, "tags": self._tags()}  # fmt: skip
            with spill.open("w") as f:
                f.write(json.dumps(head) + "\n")
                for entry in self.queue:
                    f.write(json.dumps(entry) + "\n")
            self.say(f"warn   MLflow unreachable to the end: {len(self.queue)} entries written to {spill}")
        else:
            shutil.rmtree(self.staging, ignore_errors=True)
        return spill

    def _tags(self) -> dict[str, str]:
        tags = {"growpipe.method": self.cfg.method, "growpipe.dataset": self.cfg.data.name}
        if self.cfg.tracking.parent_run_id:
            tags["mlflow.parentRunId"] = self.cfg.tracking.parent_run_id
        return tags

    def _client_or_connect(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.uri)
            if self.run_id is None:
                assert self.cfg.tracking.experiment is not None, "resolve_paths names the experiment"
                exp_id = experiment_id(client, self.cfg.tracking.experiment, self.uri)
                self.run_id = client.create_run(exp_id, run_name=self.run_name, tags=self._tags()).info.run_id
            self.experiment_id = client.get_run(self.run_id).info.experiment_id
            self._client = client
        return self._client


def finish_system_metrics(monitor: Any) -> None:
    """Stop MLflow's SystemMetricsMonitor and log the samples of its last, unfinished interval too: MLflow drops
    them, so a run shorter than one interval (10 s by default) would record no system metrics at all."""
    monitor.finish()
    if any(m.metrics for m in monitor.monitors):
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()


def send_entry(client: Any, run_id: str, entry: dict[str, Any]) -> None:
    """Send one queued entry (params, metrics, artifact, tags, inputs, model, end, resume) to MLflow run
    `run_id`."""
    from mlflow.entities import Metric, Param

    op = entry["op"]
    if op == "params":
        params = [Param(k, v) for k, v in entry["params"].items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run_id, params=params[i : i + 100])
    elif op == "metrics":
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(entry["step"])) for k, v in entry["metrics"].items()]
        client.log_batch(run_id, metrics=metrics)
    elif op == "artifact":
        src = Path(entry["path"])
        if src.is_dir():
            client.log_artifacts(run_id, str(src), artifact_path=entry["subdir"] or src.name)
        else:
            client.log_artifact(run_id, str(src), artifact_path=entry["subdir"])
    elif op == "tags":
        for k, v in entry["tags"].items():
            client.set_tag(run_id, k, v)
    elif op == "inputs":
        client.log_inputs(run_id, datasets=dataset_inputs(entry["data"]))
    elif op == "model":
        log_model(client, run_id, entry)
    elif op == "end":
        client.set_terminated(run_id, status=entry["status"])
    elif op == "resume":
        client.update_run(run_id, status="RUNNING")
        client.set_tag(run_id, "growpipe.end_reason", "running (resumed)")
        if "growpipe.stopped_early" in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, "growpipe.stopped_early")


def dataset_inputs(data: dict[str, Any]) -> list[Any]:
    """MLflow dataset inputs for a run's data (DataBundle.describe): one per split, with its digest."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    out = []
    for split, info in data["splits"].items():
        ds = Dataset(name=f"{data['name']}-{split}", digest=info["digest"], source_type="growpipe",
                     source=json.dumps({"source": data["source"], "split": split}),
                     profile=json.dumps({"num_rows": info["rows"], "kind": data.get("kind")}))  # fmt: skip
        context = "training" if split == "train" else "validation" if split == "val" else "evaluation"
        out.append(DatasetInput(ds, tags=[InputTag("mlflow.data.context", context)]))
    return out


def log_model(client: Any, run_id: str, entry: dict[str, Any]) -> None:
    """Send a staged MLflow model directory (entry: path, name, step, register) as a LoggedModel of run
    `run_id`, in the steps `mlflow.pyfunc.log_model(name=..., step=...)` takes: the model created with the
    run's params, an output of the run at `step`, the run's metrics of that step linked to it, its files
    uploaded, READY; then registered as a new version of `register` when set. Those calls go through
    `client`: MLflow's own log_model works on the process's current run and tracking URI, which belong to
    whoever else runs in this process (a Tune trial, a user's notebook). Sent again after a failure midway,
    it goes on where it stopped (the entry records the model and the steps done)."""
    from mlflow.entities import LoggedModelOutput

    model_id = _existing_model(client, entry.get("model_id"))
    if model_id is None:
        run = client.get_run(run_id)
        params = {k: str(v) for k, v in run.data.params.items()}
        model = client.create_logged_model(run.info.experiment_id, name=entry["name"], source_run_id=run_id,
                                           params=params)  # fmt: skip
        model_id = entry["model_id"] = model.model_id
        entry["done"] = []
    step = int(entry["step"])
    steps = {
        "output": lambda: client.log_outputs(run_id, [LoggedModelOutput(model_id, step=step)]),
        "metrics": lambda: link_metrics(client, run_id, model_id, step),
        "files": lambda: _upload_model(client, run_id, model_id, Path(entry["path"])),
        "ready": lambda: client.finalize_logged_model(model_id, "READY"),
        "register": lambda: _register(client, run_id, model_id, entry) if entry.get("register") else None,
    }
    done = entry.setdefault("done", [])
    for name, send in steps.items():
        if name not in done:
            send()
            done.append(name)


def _upload_model(client: Any, run_id: str, model_id: str, path: Path) -> None:
    """Upload a model directory as LoggedModel `model_id`'s files, its MLmodel saying where it lives (as
    MLflow's log_model writes it)."""
    from mlflow.models import Model

    mlmodel = Model.load(str(path / "MLmodel"))
    mlmodel.artifact_path = client.get_logged_model(model_id).artifact_location
    mlmodel.model_uuid = mlmodel.model_id = model_id
    mlmodel.run_id = run_id
    mlmodel.save(str(path / "MLmodel"))
    with quiet_mlflow():
        client.log_model_artifacts(model_id, str(path))


def _existing_model(client: Any, model_id: str | None) -> str | None:
    """`model_id` when the tracking store has that LoggedModel (a retry), else None (a first try, or a replay
    into another store)."""
    from mlflow.exceptions import MlflowException

    if model_id is None:
        return None
    try:
        return client.get_logged_model(model_id).model_id
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def link_metrics(client: Any, run_id: str, model_id: str, step: int) -> None:
    """Link the run's metrics logged at `step` (the machine's system/* ones aside) to LoggedModel `model_id`:
    the model's metrics, as MLflow's log_model links those of its step."""
    from mlflow.entities import Metric

    linked = []
    for key in client.get_run(run_id).data.metrics:
        if key.startswith("system/"):
            continue
        at_step = [m for m in client.get_metric_history(run_id, key) if m.step == step and m.model_id is None]
        linked += [Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id) for m in at_step]
    for i in range(0, len(linked), 1000):  # MLflow takes at most 1000 metrics per batch
        client.log_batch(run_id, metrics=linked[i : i + 1000])


def _register(client: Any, run_id: str, model_id: str, entry: dict[str, Any]) -> None:
    """The model entry's register step: the version is recorded in the entry once made, so a retry after a
    failure in between does not make a second one."""
    if entry.get("version") is None:
        entry["version"] = register_model(client, run_id, entry["register"], model_id)
    link_version(client, model_id, entry["register"], entry["version"])


def register_model(client: Any, run_id: str, name: str, model_id: str) -> str:
    """Register LoggedModel `model_id` of run `run_id` as a new version of registered model `name`; the version.
    Its source is `models:/MODEL_ID`, as `mlflow.register_model` gives it, so MLflow links the version to the
    LoggedModel. MLflow 3.17's database registry resolves that URI (to the files it serves) through the
    process's global tracking URI, not this client's: it is this client's for the call."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name)
    with _global_tracking_uri(client.tracking_uri):
        version = client.create_model_version(name, f"models:/{model_id}", run_id=run_id, model_id=model_id)
    return str(version.version)


def link_version(client: Any, model_id: str, name: str, version: str) -> None:
    """List version `version` of `name` in the LoggedModel's `mlflow.modelVersions` tag (what MLflow's
    register_model and its tracking server write; the model's page shows its registered versions from it)."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    tags = client.get_logged_model(model_id).tags
    versions = json.loads(tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    if not any(v.get("name") == name and str(v.get("version")) == str(version) for v in versions):
        versions.append({"name": name, "version": int(version)})
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(versions)})


_GLOBAL_URI = threading.Lock()


@contextlib.contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to `uri` for the duration, as it was afterwards (the variable
    MLflow keeps it in: its public setter would also rewrite $MLFLOW_TRACKING_URI)."""
    from mlflow.tracking._tracking_service import utils

    with _GLOBAL_URI:
        before = utils._tracking_uri
        utils._tracking_uri = uri  # type: ignore[assignment]  # MLflow's private variable is typed as its None default
        try:
            yield
        finally:
            utils._tracking_uri = before


def registered_line(entry: dict[str, Any]) -> str | None:
    """The line a run prints once its model is registered (None: the entry registered nothing)."""
    if entry.get("op") != "model" or entry.get("version") is None or "register" not in entry.get("done", []):
        return None
    name, version = entry["register"], entry["version"]
    return f"mlflow model {name} version {version} registered (LoggedModel models:/{entry['model_id']})"


def replay(path: str | Path, uri: str | None = None, say: Any = print) -> str:
    """Send a spilled `mlflow-unsent-*.jsonl` to MLflow (`uri`, else the one the run had): into its run when
    the server has it, else into a new run of the same name and experiment. Returns the run id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("op") != "run":
        raise ConfigError(f"{path}: not a growpipe mlflow-unsent file (its first line names the run)")
    head, entries = lines[0], lines[1:]
    uri = uri or head["uri"]
    client = MlflowClient(tracking_uri=uri)
    run_id = head.get("run_id")
    try:
        client.get_run(run_id) if run_id else None
    except MlflowException:
        run_id = None
    if run_id is None:
        exp = experiment_id(client, head["experiment"], uri)
        run_id = client.create_run(exp, run_name=head["run_name"], tags=head.get("tags") or {}).info.run_id
    skipped = 0
    for entry in entries:
        if entry["op"] in ("artifact", "model") and not Path(entry["path"]).exists():
            skipped += 1  # its staged copy is gone (another machine, or cleaned up)
            continue
        send_entry(client, run_id, entry)
        if line := registered_line(entry):
            say(line)
    say(f"replayed {len(entries) - skipped} entries into run {run_id}" + (f" ({skipped} missing artifacts skipped)"
        if skipped else ""))  # fmt: skip
    return run_id


def _yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False)
