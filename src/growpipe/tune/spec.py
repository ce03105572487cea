"""Sweep files (tune_configs/*.yaml): what to sweep, how to schedule it, what each trial may use.

A sweep file is validated like a run config, and every point of its search space is checked as a run config
before any trial starts, so a misspelled field or a value out of range stops the sweep with one line.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from growpipe.config import (
    RunConfig,
    apply_overrides,
    build_config,
    format_errors,
    load_config,
    problem_lines,
    read_yaml_mapping,
    run_name_problem,
    set_dotted,
    yaml_key_lines,
)
from growpipe.envvars import extra_overrides, sweep_overrides
from growpipe.errors import ConfigError
from growpipe.workdir import absolute

THRESHOLD_KEYS = ("threshold", "eval.confidence")
"""What a `kind: thresholds` sweep may search: the exit threshold and the confidence measure."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Domain(_Strict):
    """One search dimension; exactly one of the fields is set."""

    grid: list[Any] | None = None
    """Every value, in every combination with the other grids (Tune's grid_search)."""
    choice: list[Any] | None = None
    """One value drawn per sample."""
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    """Integers in [low, high)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Domain:
        set_ = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"give exactly one of grid, choice, uniform, loguniform, randint (got {set_ or 'none'})")
        values = self.grid if self.grid is not None else self.choice
        if values is not None and not values:
            raise ValueError("an empty list: give at least one value")
        bounds = self.uniform or self.loguniform or self.randint
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"bounds {list(bounds)}: low must be below high")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError("loguniform bounds must be positive")
        return self

    def corners(self) -> list[Any]:
        """Values that bound the domain: every listed value, or both ends of a range (checked up front)."""
        if self.grid is not None:
            return list(self.grid)
        if self.choice is not None:
            return list(self.choice)
        if self.randint is not None:
            return [self.randint[0], self.randint[1] - 1]
        bounds = self.uniform or self.loguniform
        assert bounds is not None
        return list(bounds)

    def to_tune(self) -> Any:
        """The Ray Tune search domain."""
        from ray import tune

        if self.grid is not None:
            return tune.grid_search(list(self.grid))
        if self.choice is not None:
            return tune.choice(list(self.choice))
        if self.uniform is not None:
            return tune.uniform(*self.uniform)
        if self.loguniform is not None:
            return tune.loguniform(*self.loguniform)
        assert self.randint is not None
        return tune.randint(*self.randint)


class SchedulerSpec(_Strict):
    """Trial scheduler: ASHA stops poor trials early (by epoch); fifo runs every trial to its end; pbt
    (population-based training) replaces a poor trial's net by a copy of a good one's (its checkpoint:
    topology, weights and growth history) with mutated hyperparameters, every perturbation_interval epochs."""

    name: Literal["asha", "fifo", "pbt"] = "asha"
    """asha, fifo or pbt."""
    grace_period: int = Field(1, ge=1)
    """asha: epochs every trial runs before it may be stopped."""
    reduction_factor: float = Field(2.0, gt=1)
    """asha: the fraction 1/reduction_factor of trials goes on at each rung."""
    perturbation_interval: int = Field(2, ge=1)
    """pbt: epochs between two exploit/explore steps."""


class ResourcesSpec(_Strict):
    """What one trial reserves: a small bundle for its driver, then one bundle per stage (block)."""

    trial_cpus: float = Field(0.1, gt=0)
    """CPU of the trial's own driver (it only follows the controller; the stages do the work)."""
    cpus_per_stage: float | None = Field(None, gt=0)
    """Overrides runtime.cpus_per_stage of every trial."""
    gpus_per_stage: float | None = Field(None, ge=0)
    """Overrides runtime.gpus_per_stage (default: 1 when the cluster has GPUs)."""
    max_concurrent_trials: int | None = Field(None, ge=1)
    """Default: as many as the cluster fits."""


class SourceSpec(_Strict):
    """kind: thresholds: the trained model whose stored per-exit predictions every trial re-reads."""

    checkpoint: str
    """A checkpoint directory (growpipe train --save, or a training sweep's best trial)."""
    train_if_missing: bool = False
    """Train the sweep's `config` (+ `set`) on Ray and save it there first when the checkpoint is missing."""
    split: Literal["val", "test"] = "val"
    """Where thresholds are chosen: the validation split (needs data.val_fraction > 0) or the test split."""


SWEEP_NAME_MAX = 100
"""A sweep's name and a Tune trial id (NAME-abcd1234_00001) stay within a run name's 128 characters."""


class SweepSpec(_Strict):
    """A whole sweep file."""

    name: str
    """The sweep's name: its MLflow run, its output folder and the prefix of its trials' run names."""
    kind: Literal["train", "thresholds"] = "train"
    """train: each trial trains a net; thresholds: each trial re-reads one trained net's exit predictions."""
    config: str | None = None
    """Run config every trial starts from (a path from where you run, like --config); default: all defaults."""
    set: dict[str, Any] = {}
    """Fixed overrides of that config, as dotted keys (train.epochs: 3)."""
    search_space: dict[str, Domain]
    """Dotted config field -> domain; for kind thresholds: threshold and eval.confidence."""
    metric: str | None = None
    """What to optimise: a run metric (test_accuracy, val_accuracy, acc.exit1, ...) for kind train
    (default test_accuracy); accuracy, macs_saved or score for kind thresholds (default score)."""
    mode: Literal["max", "min"] = "max"
    num_samples: int = Field(1, ge=1)
    """Samples of the search space (each grid combination is run num_samples times)."""
    scheduler: SchedulerSpec = SchedulerSpec()
    search: Literal["random", "optuna"] = "random"
    """How trials are chosen: random (Tune's variant generator: grid domains in every combination, the others
    drawn) or optuna (Optuna's TPE sampler, learning from finished trials; no grid domains)."""
    seed: int = 0
    """Seeds the search: Tune's draws, or Optuna's sampler."""
    resources: ResourcesSpec = ResourcesSpec()
    source: SourceSpec | None = None
    cost_weight: float = Field(0.5, ge=0)
    """kind thresholds: score = accuracy - cost_weight * (fraction of the full path's MACs used)."""
    save_checkpoints: bool = True
    """kind train: each trial reports a run checkpoint every epoch (so an interrupted sweep resumes its trials and
    pbt can copy them; the best one's path is printed, growpipe evaluate reads it)."""
    output: str | None = None
    """Where the best config and the results table go (default runs/sweeps/NAME)."""

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        if problems := self._problems():
            raise ValueError("\n".join(problems))  # one line each (see config.format_errors)
        return self

    def _problems(self) -> list[str]:
        out = [f"name: {why}"] if (why := run_name_problem(self.name)) else []
        if len(self.name) > SWEEP_NAME_MAX:
            out.append(f"name: at most {SWEEP_NAME_MAX} characters (its trials' runs are named NAME-TRIAL_ID)")
        if not self.search_space:
            out.append("search_space is empty: name at least one config field and its values")
        if self.kind == "thresholds":
            if self.source is None:
                out.append("kind thresholds needs source: {checkpoint: DIR} (the trained net to re-read)")
            bad = [k for k in self.search_space if k not in THRESHOLD_KEYS]
            if bad:
                out.append(f"kind thresholds searches {' and '.join(THRESHOLD_KEYS)} only, not {bad}")
            if "threshold" not in self.search_space:
                out.append("kind thresholds needs a threshold domain in search_space (e.g. uniform: [0.5, 0.99])")
        elif self.source is not None:
            out.append("source is for kind thresholds; a train sweep trains its own nets")
        grids = [k for k, d in self.search_space.items() if d.grid is not None]
        if self.search == "optuna" and grids:
            out.append(f"search optuna samples its own values: use choice instead of grid for {grids}")
        if self.scheduler.name == "pbt":
            if self.kind != "train" or self.search != "random" or not self.save_checkpoints:
                out.append("scheduler pbt is for kind train with search random and save_checkpoints true")
            if self.search_space and len(grids) == len(self.search_space):
                out.append("scheduler pbt mutates choice/uniform/loguniform/randint domains; give at least one")
        return out

    @property
    def objective(self) -> str:
        return self.metric or ("score" if self.kind == "thresholds" else "test_accuracy")

    def out_dir(self) -> Path:
        return Path(absolute(self.output or f"runs/sweeps/{self.name}"))


def base_raw(spec: SweepSpec) -> dict[str, Any]:
    """The run config every trial starts from, as a raw mapping (sweep-level resources applied)."""
    raw = load_config(spec.config).model_dump(mode="json") if spec.config else {}
    for key, value in spec.set.items():
        set_dotted(raw, key, value)
    raw = apply_overrides(raw, extra_overrides())  # GROWPIPE_SET: after the sweep's own set
    runtime = raw.setdefault("runtime", {})
    if spec.resources.cpus_per_stage is not None:
        runtime["cpus_per_stage"] = spec.resources.cpus_per_stage
    if spec.resources.gpus_per_stage is not None:
        runtime["gpus_per_stage"] = spec.resources.gpus_per_stage
    return raw


def trial_raw(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The raw run config of one trial: `base` with the trial's `params` (dotted keys) set."""
    raw = copy.deepcopy(base)
    for key, value in params.items():
        set_dotted(raw, key, value)
    return raw


def trial_config(base: dict[str, Any], params: dict[str, Any], source: str = "trial") -> RunConfig:
    """The run config of one trial: `base` with the trial's `params` (dotted keys) set."""
    return build_config(trial_raw(base, params), source)


def check_search_space(spec: SweepSpec, base: dict[str, Any]) -> tuple[list[RunConfig], list[str]]:
    """Build a run config for every listed value / range end of the search space (one key varied at a time):
    the configs that are valid, and one line for each key and value that does not make a valid run."""
    if spec.kind == "thresholds":
        trials = [({"eval.thresholds": [v]} if key == "threshold" else {key: v}, f"search_space.{key}={v!r}")
                  for key, dom in spec.search_space.items() for v in dom.corners()]  # fmt: skip
    else:
        first = {k: d.corners()[0] for k, d in spec.search_space.items()}
        trials = [(first, "search_space (first values)")]
        trials += [({**first, key: v}, f"search_space.{key}={v!r}")
                   for key, dom in spec.search_space.items() for v in dom.corners()[1:]]  # fmt: skip
    cfgs, problems = [], []
    for params, source in trials:
        try:
            cfgs.append(RunConfig.model_validate(trial_raw(base, params)))
        except ValidationError as err:
            problems += [f"{source}: {line}" for line in problem_lines(err)]
    return cfgs, problems


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read and validate a sweep file (`overrides`: --set key=value on the sweep file itself); ConfigError
    listing every problem of its fields (with their lines), or else of its consistency."""
    p = Path(path)
    raw = read_yaml_mapping(p, "sweep file", "tune_configs/", "fields (name, config, search_space, ...)")
    raw = apply_overrides(raw, [*(overrides or []), *sweep_overrides()])  # GROWPIPE_SWEEP_SET: after --set
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as err:
        text = format_errors(err, str(p), yaml_key_lines(p.read_text()))
        raise ConfigError(text.replace("(see configs/", "(see tune_configs/")) from None
