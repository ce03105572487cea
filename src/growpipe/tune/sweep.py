"""Run a sweep file with Ray Tune: check it, reserve resources per trial, record it in MLflow, write the
best config.

Every trial of a `kind: train` sweep gets one placement group: a small bundle for the trial's own driver
and one bundle per block it may grow to, so its stage actors never compete with another trial's. A
`kind: thresholds` sweep computes a trained net's per-exit predictions once and every trial re-reads them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from growpipe import faults
from growpipe.api import train
from growpipe.checkpoint import open_checkpoint, save_net
from growpipe.config import RunConfig, build_config, dump_config
from growpipe.errors import ConfigError, GrowpipeError
from growpipe.fsutil import atomic_write_text
from growpipe.prepare import logical_cpus_needed, resolve_paths, run_problems
from growpipe.runtime.pipeline import connect
from growpipe.runtime.placement import stage_bundle
from growpipe.serving import environment
from growpipe.tracking import STOPPED_EARLY, default_tracking_uri, experiment_id, flatten, run_url
from growpipe.tune.predictions import StoredExits, compute_exits, save_exits
from growpipe.tune.spec import SweepSpec, base_raw, check_search_space, trial_config
from growpipe.tune.trials import threshold_trial, train_trial, trial_run_name
from growpipe.workdir import storage_note

QUIET_TUNE = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # the result loggers are growpipe's choice: see _callbacks
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",  # "may become a bottleneck": a trial
    # checkpoints every epoch (its epochs take seconds on small data) and Tune keeps the newest two
}
"""Tune's settings while a sweep runs (a variable already set is kept)."""
TRAIN_METRICS = ("test_accuracy", "val_accuracy", "samples_per_second", "blocks")
TRAIN_METRIC_PREFIXES = ("acc.exit", "loss.")
THRESHOLD_METRICS = ("score", "accuracy", "macs_saved", "mean_depth", "macs_per_sample")


def trial_bundles(spec: SweepSpec, cfg: RunConfig, cluster_has_gpus: bool) -> list[dict[str, float]]:
    """The placement group of one trial: its driver's bundle, then one per block it may grow to."""
    head = {"CPU": spec.resources.trial_cpus}
    if spec.kind == "thresholds":
        return [head]
    return [head] + [stage_bundle(cfg, cluster_has_gpus)] * cfg.max_blocks()


def _total(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def grace_problem(spec: SweepSpec, epochs: int) -> str | None:
    """Why ASHA cannot run over trials of at most `epochs` epochs (None: it can): its grace period is longer."""
    if spec.kind != "train" or spec.scheduler.name != "asha" or spec.scheduler.grace_period <= epochs:
        return None
    return (
        f"scheduler.grace_period: {spec.scheduler.grace_period} epochs is more than the trials' {epochs}; ASHA stops "
        f"a trial only after its grace period: lower it to at most {epochs}, or train longer (train.epochs)"
    )


def metric_problem(spec: SweepSpec, cfgs: list[RunConfig]) -> str | None:
    """Why the metric is not one every trial reports (None: it is)."""
    m = spec.objective
    if spec.kind == "thresholds":
        if m not in THRESHOLD_METRICS:
            return f"metric: {m!r} is not reported by threshold trials; use {list(THRESHOLD_METRICS)}"
        return None
    if m not in TRAIN_METRICS and not m.startswith(TRAIN_METRIC_PREFIXES):
        return (
            f"metric: {m!r} is not reported by training trials; use one of {list(TRAIN_METRICS)} or acc.exitN / loss.*"
        )
    if m == "val_accuracy" and any(c.data.val_fraction <= 0 for c in cfgs):
        return "metric: val_accuracy needs a validation split; set data.val_fraction (e.g. 0.1) in set:"
    return None


def check_fits(spec: SweepSpec, cfgs: list[RunConfig], cluster: dict[str, float]) -> dict[str, float]:
    """The largest trial's resources; ConfigError when even one such trial cannot fit the cluster."""
    gpus = cluster.get("GPU", 0) > 0
    need = max((_total(trial_bundles(spec, c, gpus)) for c in cfgs), key=lambda t: (t.get("GPU", 0), t["CPU"]))
    short = [k for k, v in need.items() if v > cluster.get(k, 0) + 1e-9]
    if short:
        have = ", ".join(f"{k} {cluster.get(k, 0):g}" for k in need)
        want = ", ".join(f"{k} {v:g}" for k, v in need.items())
        blocks = max(c.max_blocks() for c in cfgs)
        raise ConfigError(
            f"resources: one trial needs {want} (resources.trial_cpus plus one bundle per block, up to {blocks} "
            f"blocks) but the cluster has {have}; lower resources.cpus_per_stage / gpus_per_stage or the block "
            "counts, or add nodes"
        )
    return need


def trials_at_once(need: dict[str, float], cluster: dict[str, float], max_concurrent: int | None) -> int:
    """How many trials that each reserve `need` run at the same time on a cluster of `cluster` resources
    (at most `max_concurrent`)."""
    fits = min((math.floor(cluster.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0), default=1)
    return min(fits, max_concurrent) if max_concurrent else fits


def scheduler_problem(spec: SweepSpec, at_once: int, need: dict[str, float], cluster: dict[str, float]) -> str | None:
    """Why the sweep's scheduler cannot work with `at_once` trials running together (None: it can): PBT
    copies a running trial's checkpoint into another, so with one trial at a time it never exploits."""
    if spec.scheduler.name != "pbt" or at_once > 1:
        return None
    why = "resources.max_concurrent_trials is 1"
    if spec.resources.max_concurrent_trials != 1:
        why = f"the cluster has CPU {cluster.get('CPU', 0):g} and a trial reserves CPU {need.get('CPU', 0):g}"
    return (f"scheduler pbt: only {at_once} trial runs at a time ({why}), so no trial ever has another's checkpoint "
            "to copy and PBT would skip every exploit; give Ray more CPUs (set: {runtime.num_cpus: N} for the "
            "embedded Ray, or --address a bigger cluster), lower the block counts or resources.cpus_per_stage, "
            "or use scheduler asha or fifo")  # fmt: skip


def prepare(spec: SweepSpec, address: str | None = None,
            say: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[RunConfig]]:  # fmt: skip
    """Everything that can be checked without Ray: the base config and every corner of the search space, and
    what the preparation step of a run checks of the base config (where results go, the tracking URI, the
    data, BP's needs; see growpipe.prepare.run_problems; `address`: the cluster, None for an embedded Ray);
    ConfigError listing every problem found."""
    base = base_raw(spec)
    cfgs, problems = check_search_space(spec, base)
    if why := metric_problem(spec, cfgs):
        problems.append(why)
    if cfgs and (why := grace_problem(spec, max(c.total_epochs() for c in cfgs))):
        problems.append(why)
    if spec.kind == "train" and any(c.engine() == "ddp" for c in cfgs):
        problems.append("runtime.engine: ddp places Ray Train workers outside a trial's placement group; "
                        "sweep bp with gpipe or 1f1b")  # fmt: skip
    if cfgs:  # each trial has its own checkpoint folder (see trials.train_trial): the base's is not used
        first = resolve_paths(cfgs[0])
        first = first.model_copy(update={"checkpoint": first.checkpoint.model_copy(update={"enabled": False})})
        embedded = not (address or os.environ.get("RAY_ADDRESS"))
        problems += run_problems(first, warn=say, on_ray=True, data_here=embedded)
    if problems:
        raise ConfigError(f"sweep {spec.name}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))
    return base, cfgs


class SweepRecord:
    """The sweep's parent MLflow run (trials become its children); never fails the sweep."""

    def __init__(self, cfg: RunConfig, spec: SweepSpec, say: Callable[[str], None], run_id: str | None = None):
        """`run_id`: the run of an interrupted sweep being resumed (else a new run is made)."""
        self.say = say
        self.uri = cfg.tracking.uri or default_tracking_uri(cfg.tracking.workdir)
        self.enabled = cfg.tracking.mlflow
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        if not self.enabled:
            return
        try:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.uri)
            assert cfg.tracking.experiment is not None, "resolve_paths names the experiment"
            self.experiment_id = experiment_id(self.client, cfg.tracking.experiment, self.uri)
            if run_id is not None:
                self.client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
                say(f"mlflow sweep run {run_url(self.uri, self.experiment_id, run_id)} (resumed)")
                return
            tags = {"growpipe.sweep": spec.name, "growpipe.kind": spec.kind}
            self.run_id = self.client.create_run(self.experiment_id, run_name=spec.name, tags=tags).info.run_id
            params = flatten(spec.model_dump(mode="json", exclude_none=True))
            for k, v in list(params.items())[:100]:
                self.client.log_param(self.run_id, k, v)
            say(f"mlflow sweep run {run_url(self.uri, self.experiment_id, self.run_id)}")
        except Exception as e:  # tracking must not stop the sweep
            say(f"warn   MLflow at {self.uri} not usable ({type(e).__name__}: {str(e)[:160]}); sweeping without it")
            self.run_id = None

    def finish(self, metrics: dict[str, float], files: list[Path], status: str) -> None:
        if self.run_id is None:
            return
        try:
            for k, v in metrics.items():
                self.client.log_metric(self.run_id, k, v)
            for f in files:
                self.client.log_artifact(self.run_id, str(f))
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            self.say(f"warn   MLflow: could not finish the sweep run ({type(e).__name__}: {str(e)[:160]})")

    def close_children(self, outcomes: dict[str, tuple[str, str]], others: str) -> None:
        """End the MLflow runs of the sweep's trials: each run named in `outcomes` as (status, end reason) it
        gives (see end_trial_run), any other still RUNNING as KILLED with the end reason `others` (its
        process was killed, e.g. with an interrupted sweep)."""
        if self.run_id is None:
            return
        from growpipe.tune.ends import end_trial_run, trial_runs  # lazy: it imports ray.tune (about 2 s)

        assert self.experiment_id is not None, "found before the sweep run was made"
        try:
            for run in trial_runs(self.client, self.experiment_id, self.run_id):
                status, reason = outcomes.get(run.info.run_name, ("KILLED", others))
                end_trial_run(self.client, run, status, reason)
        except Exception as e:
            self.say(f"warn   MLflow: could not close the trial runs ({type(e).__name__}: {str(e)[:160]})")

    def child_tracking(self, spec: SweepSpec) -> dict[str, Any] | None:
        if self.run_id is None:
            return None
        return {"uri": self.uri, "parent_run_id": self.run_id, "experiment_id": self.experiment_id, "sweep": spec.name}


def _scheduler(spec: SweepSpec, cfgs: list[RunConfig]) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    if spec.kind == "thresholds" or spec.scheduler.name == "fifo":
        return FIFOScheduler()
    if spec.scheduler.name == "pbt":
        mutations = {k: d.to_tune() for k, d in spec.search_space.items() if d.grid is None}
        return PopulationBasedTraining(time_attr="training_iteration", hyperparam_mutations=mutations,
                                       perturbation_interval=spec.scheduler.perturbation_interval)  # fmt: skip
    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=max(c.total_epochs() for c in cfgs),
        grace_period=spec.scheduler.grace_period,
        reduction_factor=spec.scheduler.reduction_factor,
    )


def _stop(spec: SweepSpec, cfgs: list[RunConfig]) -> dict[str, int] | None:
    """A trial ends once it has reported its last epoch (PBT would otherwise copy a finished trial on)."""
    return {"training_iteration": max(c.total_epochs() for c in cfgs)} if spec.kind == "train" else None


def _search(spec: SweepSpec) -> Any:
    """Tune's variant generator (grid and random draws; it limits the trials at once itself: Tune ignores
    TuneConfig.max_concurrent_trials for it) or Optuna's TPE sampler, seeded."""
    if spec.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=spec.seed))
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(random_state=spec.seed, max_concurrent=spec.resources.max_concurrent_trials or 0)


def _callbacks(spec: SweepSpec, base: dict[str, Any], record: SweepRecord,
               stop_at: tuple[int, str] | None) -> list[Any]:  # fmt: skip
    """Tune's result files (CSV and JSON, what ExperimentAnalysis reads; not TensorBoard's, whose command
    Tune would print though this environment has no tensorboard), the trials' MLflow ends, and a test's stop at
    an exact point (`stop_at`, GROWPIPE_STOP_SWEEP_AT)."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from growpipe.tune.ends import TrialEnds  # lazy: as in close_children
    from growpipe.tune.gates import SweepGates  # lazy: it imports ray.tune too

    ends = [TrialEnds(tracking, base, spec.kind)] if (tracking := record.child_tracking(spec)) else []
    gates = [SweepGates(*stop_at)] if stop_at else []
    return [CSVLoggerCallback(), JsonLoggerCallback(), *ends, *gates]


def _source_exits(
    spec: SweepSpec, base: dict[str, Any], address: str | None, say: Callable[[str], None]
) -> StoredExits:
    """The predictions every threshold trial re-reads (training the source net first when asked)."""
    assert spec.source is not None
    ck = Path(spec.source.checkpoint)
    if not (ck / "manifest.json").is_file():
        if not spec.source.train_if_missing:
            raise ConfigError(
                f"source.checkpoint: {ck} is not a checkpoint; train one (growpipe train --save {ck}) "
                "or set source.train_if_missing: true"
            )
        cfg = build_config(base, "the source net's config")
        say(f"source {ck} is missing: training {cfg.method} on {cfg.data.name} first")
        run = train(cfg, "ray", address, say, keep_net=True)
        save_net(ck, run.net, cfg, run.result)
    stored = compute_exits(ck, spec.source.split)
    say(f"source {ck}: {len(stored.preds.labels)} {spec.source.split} samples, exits {stored.preds.depths}, "
        f"full-path accuracy {stored.preds.accuracy(stored.preds.depths[-1]):.4f}")  # fmt: skip
    return stored


def run_sweep(spec: SweepSpec, address: str | None = None, say: Callable[[str], None] = print,
              resume: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the sweep to the end; return its summary (best params, metric, best-config path, trials).

    An interrupted sweep (its directory says so) is resumed with Tuner.restore when `resume` is None or
    True: finished trials are kept, unfinished ones go on from their last checkpoint, in the same MLflow
    parent run; `resume` False starts over. Interrupting it (Ctrl-C, SIGTERM) records the sweep as
    KILLED, says how to resume, and raises KeyboardInterrupt."""
    from ray import tune

    addr = address or os.environ.get("RAY_ADDRESS")
    try:
        stop_at = faults.stop_sweep_at()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    base, cfgs = prepare(spec, addr, say)
    if note := storage_note():
        say(note)
    base_cfg = resolve_paths(build_config(base, "base config"))
    base = {**base, "tracking": base_cfg.tracking.model_dump(mode="json")}
    out = spec.out_dir()
    owns = False
    if not ray.is_initialized():
        need = _total(trial_bundles(spec, max(cfgs, key=lambda c: c.max_blocks()), False))["CPU"]
        if spec.kind == "thresholds":  # room to train the source net when it is missing
            need = max(need, logical_cpus_needed(base_cfg))
        cpus = None if addr else max(base_cfg.runtime.num_cpus or os.cpu_count() or 1, math.ceil(need))
        owns, dashboard = connect(base_cfg, addr, cpus=cpus)
        if dashboard:
            say(f"ray    dashboard {dashboard}")
    try:
        cluster = ray.cluster_resources()
        need_one = check_fits(spec, cfgs, cluster)
        if why := scheduler_problem(spec, trials_at_once(need_one, cluster, spec.resources.max_concurrent_trials),
                                    need_one, cluster):  # fmt: skip
            raise ConfigError(why)
        say(f"sweep  {spec.name}: {spec.kind}, metric {spec.objective} ({spec.mode}), {spec.num_samples} sample(s) "
            f"x grid, each trial reserves {', '.join(f'{k} {v:g}' for k, v in need_one.items())}")  # fmt: skip
        gpus = cluster.get("GPU", 0) > 0
        space = {k: d.to_tune() for k, d in spec.search_space.items()}
        stored = _source_exits(spec, base, address, say) if spec.kind == "thresholds" else None
        state = SweepState(out)
        restoring = resume is not False and state.unfinished() and tune.Tuner.can_restore(str(out / "trials"))
        if resume and not restoring:
            raise ConfigError(f"--resume: no interrupted sweep in {out}; run it without --resume to start it")
        if not restoring:
            state.clear()
        record = SweepRecord(base_cfg, spec, say, run_id=state.get("parent_run_id") if restoring else None)
        state.write(status="running", parent_run_id=record.run_id)
        if stored is not None:
            save_exits(out / "exits.npz", stored)
            trainable = tune.with_parameters(
                growpipe_thresholds,
                stored=stored,
                cost_weight=spec.cost_weight,
                confidence=base_cfg.eval.confidence,
                tracking=record.child_tracking(spec),
                sweep=spec.name,
            )
            trainable = tune.with_resources(trainable, {"CPU": spec.resources.trial_cpus})
        else:
            trainable = tune.with_parameters(
                growpipe_train, base=base, sweep=spec.name, metric=spec.objective, parent_run_id=record.run_id,
                save_checkpoint=spec.save_checkpoints, runs_dir=str(out / "trial-runs"),
                reported=_reported_epochs(out) if restoring else {},
            )  # fmt: skip
            trainable = tune.with_resources(
                trainable,
                lambda params: tune.PlacementGroupFactory(
                    trial_bundles(spec, trial_config(base, params), gpus), strategy=base_cfg.runtime.placement
                ),
            )
        if restoring:
            say(f"sweep  resuming the interrupted sweep in {out} (finished trials kept; --fresh starts over)")
            tuner = tune.Tuner.restore(str(out / "trials"), trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space=space,
                tune_config=tune.TuneConfig(
                    metric=spec.objective, mode=spec.mode, num_samples=spec.num_samples, search_alg=_search(spec),
                    scheduler=_scheduler(spec, cfgs),
                    max_concurrent_trials=spec.resources.max_concurrent_trials if spec.search == "optuna" else None,
                ),
                run_config=tune.RunConfig(
                    name="trials", storage_path=str(out), verbose=1 if spec.kind == "train" else 0,
                    failure_config=tune.FailureConfig(max_failures=0),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=4 if spec.scheduler.name == "pbt" else 2),
                    stop=_stop(spec, cfgs), callbacks=_callbacks(spec, base, record, stop_at),
                ),
            )  # fmt: skip
        try:
            with environment({k: v for k, v in QUIET_TUNE.items() if k not in os.environ}):
                grid = tuner.fit()
        except BaseException:
            _interrupted(record, state, spec, say)
            raise
        if _unfinished(spec, out):  # Tune caught the Ctrl-C itself, saved its state and returned
            _interrupted(record, state, spec, say)
            raise KeyboardInterrupt
        summary = _finish(spec, base, grid, record, out, say)
        state.write(status="finished", parent_run_id=record.run_id)
        return summary
    finally:
        if owns:
            ray.shutdown()


class SweepState:
    """`OUT/sweep.json`: whether the sweep in OUT finished, and its MLflow parent run (for a resume)."""

    def __init__(self, out: Path):
        self.path = out / "sweep.json"
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def unfinished(self) -> bool:
        return self.data.get("status") in ("running", "interrupted")

    def write(self, **fields: Any) -> None:
        self.data.update(fields)
        atomic_write_text(self.path, json.dumps(self.data, indent=1))

    def clear(self) -> None:
        """A fresh start: the old experiment's trials go (Tune would otherwise mix them in)."""
        for sub in ("trials", "trial-runs"):
            shutil.rmtree(self.path.parent / sub, ignore_errors=True)
        self.path.unlink(missing_ok=True)
        self.data = {}


def _unfinished(spec: SweepSpec, out: Path) -> bool:
    """Whether the sweep's saved experiment has trials still to run (fewer than asked for, or not ended)."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(out / "trials")).trials
    expected = spec.num_samples * math.prod(len(d.grid) for d in spec.search_space.values() if d.grid is not None)
    return len(trials) < expected or any(t.status not in ("TERMINATED", "ERROR") for t in trials)


def _reported_epochs(out: Path) -> dict[str, int]:
    """The last epoch (training_iteration) of each trial in the result rows of the sweep saved in `out`: what
    Tune has of it, which a resumed trial must not report again. Tune's saved state may be older in its
    checkpoint (a stop between recording a report and registering its checkpoint) and Tune resets a trial it
    restores from a checkpoint to that checkpoint's result, so the rows are the record."""
    from ray.tune import ExperimentAnalysis

    frames = ExperimentAnalysis(str(out / "trials")).trial_dataframes
    return {t: int(df["training_iteration"].iloc[-1]) for t, df in frames.items() if "training_iteration" in df}


def _interrupted(record: SweepRecord, state: SweepState, spec: SweepSpec, say: Callable[[str], None]) -> None:
    record.close_children({}, "killed: the sweep was interrupted")  # KILLED like the sweep; a resume reopens them
    record.finish({}, [], "KILLED")
    state.write(status="interrupted")
    say(f"sweep  {spec.name} interrupted; run the same growpipe sweep command again to resume it "
        "(finished trials are kept, the others go on from their last checkpoint)")  # fmt: skip


def growpipe_train(params: dict[str, Any], **kw: Any) -> None:
    train_trial(params, **kw)


def growpipe_thresholds(params: dict[str, Any], **kw: Any) -> None:
    threshold_trial(params, **kw)


def _finish(
    spec: SweepSpec, base: dict[str, Any], grid: Any, record: SweepRecord, out: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Results table, best config YAML, parent-run metrics."""
    trials: list[dict[str, Any]] = []
    for r in grid:
        trials.append({
            "trial": (r.metrics or {}).get("trial_id") or (r.path.rsplit("/", 1)[-1] if r.path else "?"),
            "params": dict(r.config or {}),
            "metric": (r.metrics or {}).get(spec.objective),
            "epochs": (r.metrics or {}).get("training_iteration"),
            "error": str(r.error).splitlines()[0] if r.error else None,
            "checkpoint": r.checkpoint.path if r.checkpoint else None,
        })  # fmt: skip
    from growpipe.tune.ends import trial_outcome  # lazy: as in close_children

    outcomes = {}
    for t in trials:
        planned = trial_config(base, t["params"]).total_epochs() if spec.kind == "train" else None
        outcomes[trial_run_name(spec.name, t["trial"])] = outcome = trial_outcome(t["error"], t["epochs"], planned)
        t["stopped_early"] = outcome[1] == STOPPED_EARLY
    record.close_children(outcomes, "killed: its trial ended without recording it")  # what TrialEnds left
    ok = [t for t in trials if t["metric"] is not None and not t["error"]]
    if not ok:
        errors = "; ".join(t["error"] for t in trials if t["error"]) or "no trial reported the metric"
        record.finish({}, [], "FAILED")
        raise GrowpipeError(f"sweep {spec.name}: no trial finished ({errors[:400]})")
    best = (max if spec.mode == "max" else min)(ok, key=lambda t: t["metric"])
    best_cfg = _best_config(spec, base, best["params"])
    out.mkdir(parents=True, exist_ok=True)
    best_path = atomic_write_text(out / "best.yaml", dump_config(best_cfg))
    table = format_trials(spec, trials)
    table_path = atomic_write_text(out / "trials.md", table + "\n")
    say(table)
    say(f"best   {spec.objective} {best['metric']:.4f} with {best['params']}")
    say(f"best config: {best_path}  (growpipe train --config {best_path})")
    if best["checkpoint"]:
        say(f"best checkpoint: {best['checkpoint']}")
    metrics = {f"best.{spec.objective}": float(best["metric"]), "trials": len(trials), "trials_ok": len(ok)}
    record.finish(metrics, [best_path, table_path], "FINISHED")
    return {
        "sweep": spec.name,
        "kind": spec.kind,
        "metric": spec.objective,
        "mode": spec.mode,
        "best": best,
        "best_config": str(best_path),
        "trials": trials,
        "mlflow_run_id": record.run_id,
    }


def _best_config(spec: SweepSpec, base: dict[str, Any], params: dict[str, Any]) -> RunConfig:
    """A run config `growpipe train --config` accepts: the trial's config, tracking fields of the sweep cleared
    and no run name (each run of it gets its own, as with the shipped configs)."""
    if spec.kind == "thresholds":
        assert spec.source is not None
        raw = open_checkpoint(spec.source.checkpoint)[2]["config"]
        p = {"eval.thresholds": [float(params["threshold"])]}
        if "eval.confidence" in params:
            p["eval.confidence"] = params["eval.confidence"]
    else:
        raw, p = base, dict(params)
    cfg = trial_config(raw, p, "best config")
    tracking = cfg.tracking.model_copy(update={"run_id": None, "parent_run_id": None, "uri": None})
    return cfg.model_copy(update={"name": None, "tracking": tracking})


def format_trials(spec: SweepSpec, trials: list[dict[str, Any]]) -> str:
    """A Markdown table of every trial, best first."""
    keys = list(spec.search_space)
    sign = -1 if spec.mode == "max" else 1
    rows = sorted(trials, key=lambda t: (t["metric"] is None, sign * (t["metric"] or 0)))
    lines = [
        "| trial | " + " | ".join(keys) + f" | {spec.objective} | epochs | note |",
        "|" + " --- |" * (len(keys) + 4),
    ]
    for t in rows:
        vals = [_fmt(t["params"].get(k)) for k in keys]
        metric = "-" if t["metric"] is None else f"{t['metric']:.4f}"
        note = t["error"] or ("stopped early (ASHA)" if t.get("stopped_early") else "")
        cells = [t["trial"][:40], *vals, metric, str(t["epochs"] or "-"), note[:80]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
