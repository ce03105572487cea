"""What a run measures and keeps: evaluation (exits, adaptive inference), checkpoints, MLflow tracking."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from growpipe.config.base import Strict


class EvalSpec(Strict):
    """Evaluation: exits and adaptive inference."""

    thresholds: list[float] = [0.5, 0.7, 0.8, 0.9, 0.95, 0.99]
    """Confidence thresholds of adaptive inference: a sample leaves at the first exit this confident."""
    confidence: Literal["max_prob", "entropy"] = "max_prob"
    """max_prob: highest softmax probability; entropy: 1 - normalised entropy."""
    restore_best: bool = True
    """Model selection with data.val_fraction: at the end the net goes back to the epoch with the best
    validation accuracy since the last growth (the latest of a tie; its checkpoint is kept until then; needs
    checkpoint.enabled) and the result is that net's (`selected_epoch`); false, or no validation split: the
    last epoch's net."""
    exit_threshold: float | None = Field(None, ge=0.0, le=1.0)
    """The threshold real early exit runs at when a run ends and in growpipe evaluate (a sample that
    confident leaves, the blocks above never compute it; its measured time per sample is reported beside
    the full path's); default: the lowest of `thresholds` that costs fewer MACs than the full path and whose
    accuracy is within 0.5 point of it, else none (the full path)."""
    baseline: bool = False
    """Draw the classical bar beside the run (growpipe baseline): TF-IDF + logistic regression for text,
    logistic regression on standardised features for tables and images, on the run's own train/test rows;
    seconds in the run's process once it finished, in the result JSON as `baseline` and in MLflow as
    final.baseline_accuracy. Data it cannot handle (sequence-feature groups, data read from disk per batch too
    big for memory) is said in one line and the run goes on without it."""

    @field_validator("thresholds")
    @classmethod
    def _in_unit_interval(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("give at least one threshold in [0, 1], e.g. [0.9, 0.99]")
        bad = [t for t in v if not 0.0 <= t <= 1.0]
        if bad:
            raise ValueError(f"thresholds {bad} are outside [0, 1]; confidences are probabilities")
        return v


class CheckpointSpec(Strict):
    """Run checkpoints (every engine): every block's modules and optimizer state plus a manifest, for resume
    and for recovering from a lost worker."""

    enabled: bool = True
    """Write run checkpoints (every engine)."""
    uri: str = "runs/checkpoints"
    """A local path (shared by every node on a cluster) or a pyarrow.fs URI such as s3://bucket/prefix;
    checkpoints go to URI/RUN_NAME/."""
    every_epochs: int = Field(1, ge=0)
    """Write one at the end of every N-th epoch (0: only at the start and at each growth)."""
    every_batches: int = Field(0, ge=0)
    """Also write one every N batches inside an epoch (0: never); the pipeline drains first."""
    keep: int = Field(2, ge=1)
    """How many complete checkpoints to keep (older ones are deleted after a new one is complete)."""
    asynchronous: bool = True
    """Write checkpoints in the background: the run waits only while every block's state is copied in memory,
    the shards and then the manifest are written while training goes on (one write at a time; a restore, the
    run's end and a run that reports each checkpoint with its epoch, a Tune trial, wait for it). false: the run
    waits until each checkpoint is complete."""
    overwrite: bool = False
    """A new run whose name already has checkpoints here replaces them (growpipe train --overwrite); without
    it such a run is refused, so an earlier run's restore points are never lost to a new run of its name."""


class TrackingSpec(Strict):
    """Where a run is recorded (MLflow)."""

    mlflow: bool = True
    """Record the run in MLflow."""
    uri: str | None = None
    """MLflow tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///<workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment of the run; default $MLFLOW_EXPERIMENT_NAME, else growpipe."""
    workdir: str = "runs"
    """Local directory for the default sqlite store and for tracking entries that could not be sent."""
    run_id: str | None = None
    """Log into this existing MLflow run instead of starting one (resuming: its params are not logged again)."""
    parent_run_id: str | None = None
    """Start the run as a child of this MLflow run (a sweep's trials under the sweep's run)."""
    system_metrics: bool = True
    """Record CPU, memory, disk and network (GPU when present) of the tracking process's machine as system/*
    metrics (every $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds, 10 by default)."""
    log_model: bool = True
    """Log the trained net as an MLflow model: a LoggedModel `model` of the run (a pyfunc running adaptive early
    exit), carrying the run's final metrics."""
    register_model: bool = False
    """Also register that model in the MLflow model registry under the run's name (a new version each run)."""
