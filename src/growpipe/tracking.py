"""MLflow tracking of a run, as a run callback (the Ray controller and the reference trainer both call it).

Everything to log is queued first and sent in order; when the tracking server cannot be reached the run
goes on (one warning), the queue is retried at every epoch, and whatever is still unsent at the end is
written to a local JSON-lines file next to the run's outputs. A run never fails because of tracking.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from growpipe.config import RunConfig
from growpipe.loop.callbacks import RunCallback

MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"


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


def experiment_id(client: Any, name: str) -> str:
    """The id of MLflow experiment `name`, created when missing."""
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name)


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
        self._client: Any = None
        self.experiment_id: str | None = None
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast; the queue retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

    # ---- the callback ----------------------------------------------------------------------------------
    def on_start(self) -> None:
        if not self.cfg.tracking.run_id:  # an existing (resumed) run has its params already
            self.queue.append({"op": "params", "params": flatten(self.cfg.model_dump(mode="json"))})
        self.artifact_text("config.yaml", _yaml(self.cfg.model_dump(mode="json")))
        self.flush()
        if self.run_id:
            self.say(f"mlflow run {run_url(self.uri, self.experiment_id, self.run_id)}")

    def after_epoch(self, row: dict[str, Any]) -> None:
        self.queue.append({"op": "metrics", "metrics": epoch_metrics(row), "step": row["epoch"]})
        self.flush()

    def on_growth(self, event: dict[str, Any]) -> None:
        metrics = {"growth.blocks": event["blocks"], "growth.block_added": event.get("block", event["blocks"] - 1)}
        self.queue.append({"op": "metrics", "step": event["epoch"], "metrics": metrics})

    def on_finish(self, summary: dict[str, Any]) -> None:
        final = {
            "final.test_accuracy": summary["test_accuracy"],
            "final.samples_per_second": summary["samples_per_second"],
        }
        for s in summary.get("stages", []):
            final[f"stage{s['stage']}.utilisation"] = s["utilisation"]
            final[f"stage{s['stage']}.samples_per_second"] = s["samples_per_second"]
        for r in summary["adaptive"]:
            final[f"adaptive.{r['threshold']:g}.accuracy"] = r["accuracy"]
            final[f"adaptive.{r['threshold']:g}.macs_saved"] = r["macs_saved_fraction"]
        self.queue.append({"op": "metrics", "metrics": final, "step": summary["epochs"]})
        from growpipe.plots import plot_run
        from growpipe.report import format_exits

        self.artifact_text("evaluation.txt", format_exits(summary) + "\n")
        self.artifact_text("growth_history.json", json.dumps(summary["growth"], indent=2))
        with tempfile.TemporaryDirectory() as tmp:
            plot_run(summary, tmp)
            self.artifact_file(tmp, "plots")
        self.artifact_text("result.json", json.dumps({k: v for k, v in summary.items() if k != "timeline"}, indent=2))
        if summary.get("timeline"):
            self.artifact_text("pipeline_trace.json", json.dumps(summary["timeline"]))

    def on_final_net(self, net: Any, summary: dict[str, Any]) -> None:
        from growpipe.checkpoint import save_net

        with tempfile.TemporaryDirectory() as tmp:
            self.artifact_file(save_net(Path(tmp) / "checkpoint", net, self.cfg, summary, self.run_id), "checkpoint")

    def close(self) -> Path | None:
        """Mark the run finished (or failed), make a last try to send; what is still unsent goes to a
        local JSON-lines file (returned). Staged files are removed once sent."""
        self.queue.append({"op": "end", "status": self.status})
        return self._drain()

    def on_error(self, message: str) -> None:
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
        src = Path(path)
        slot = self.staging / f"a{self.staged}"  # one folder per entry: same names never collide
        self.staged += 1
        slot.mkdir()
        dst = slot / src.name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        self.queue.append({"op": "artifact", "path": str(dst), "subdir": subdir})

    # ---- sending ---------------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Send the queue in order; on failure keep the rest for later. True when everything is sent."""
        try:
            client = self._client_or_connect()
            while self.queue:
                self._send(client, self.queue[0])
                self.queue.pop(0)
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
            with spill.open("w") as f:
                for entry in self.queue:
                    f.write(json.dumps(entry) + "\n")
            self.say(f"warn   MLflow unreachable to the end: {len(self.queue)} entries written to {spill}")
        else:
            shutil.rmtree(self.staging, ignore_errors=True)
        return spill

    def _client_or_connect(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.uri)
            if self.run_id is None:
                tags = {"growpipe.method": self.cfg.method}
                if self.cfg.tracking.parent_run_id:
                    tags["mlflow.parentRunId"] = self.cfg.tracking.parent_run_id
                exp_id = experiment_id(client, self.cfg.tracking.experiment)
                self.run_id = client.create_run(exp_id, run_name=self.run_name, tags=tags).info.run_id
            self.experiment_id = client.get_run(self.run_id).info.experiment_id
            self._client = client
        return self._client

    def _send(self, client: Any, entry: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param

        op = entry["op"]
        if op == "params":
            params = [Param(k, v) for k, v in entry["params"].items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                client.log_batch(self.run_id, params=params[i : i + 100])
        elif op == "metrics":
            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, int(entry["step"])) for k, v in entry["metrics"].items()]
            client.log_batch(self.run_id, metrics=metrics)
        elif op == "artifact":
            src = Path(entry["path"])
            if src.is_dir():
                client.log_artifacts(self.run_id, str(src), artifact_path=entry["subdir"] or src.name)
            else:
                client.log_artifact(self.run_id, str(src), artifact_path=entry["subdir"])
        elif op == "end":
            client.set_terminated(self.run_id, status=entry["status"])


def _yaml(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False)
