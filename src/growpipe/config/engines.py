"""How a run uses Ray: the runtime section and the sections of each engine (pipeline, bp_pipeline, ddp)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from growpipe.config.base import Strict


class PipelineSpec(Strict):
    """runtime.engine pipeline (the local rules al, scpl, dascpl): one actor per block, packets handed from
    actor to actor."""

    window: int = Field(4, ge=1, le=1024)
    """Packets a stage keeps in flight to the next stage before it waits (backpressure)."""
    packets_per_call: int = Field(1, ge=1, le=64)
    """Packets a stage hands to the next in one actor call: each call costs about 2 ms here, so grouping
    amortises it; a stage then starts a group only once the previous stage finished all of it."""
    transport: Literal["object_store", "auto", "compiled", "gloo", "nccl"] = "object_store"
    """How the stages hand their activations on: object_store (inside the actor call or through Ray's object
    store, the default); compiled (training and evaluation run as a Ray Compiled Graph over the stages,
    compiled again after each growth or recovery: the cheapest hand-off, but every waiting stage spins, so it
    pays only with a core to spare per stage); or by Ray Direct Transport straight from actor to actor over a
    collective group: gloo (tensors through host memory, tested on CPU), nccl (GPU to GPU, a whole GPU per
    stage, cupy on the GPU nodes; not tested here); auto: nccl when every stage has a whole GPU, else
    object_store. On one machine the default is faster (bench/RESULTS.md). See docs/running.md."""

    @model_validator(mode="after")
    def _group_fits_window(self) -> PipelineSpec:
        if self.packets_per_call > self.window:
            raise ValueError(
                f"packets_per_call ({self.packets_per_call}) is more than window ({self.window}); "
                "raise window or lower packets_per_call"
            )
        return self


class BPPipelineSpec(Strict):
    """runtime.engine gpipe or 1f1b (method bp): the blocks on stage actors, BP through them."""

    micro_batches: int = Field(4, ge=1, le=1024)
    """gpipe: micro-batches per mini-batch; each stage works on one while the next stage works on the one
    before."""
    spectrain: bool = False
    """1f1b: SpecTrain weight prediction instead of weight stashing."""


class DDPSpec(Strict):
    """runtime.engine ddp (method bp): replicas of the whole net on Ray Train workers."""

    workers: int | None = Field(None, ge=1)
    """Ray Train workers (default: net.blocks, the resources a pipeline would use)."""
    min_workers: int | None = Field(None, ge=1)
    """Elastic training: Ray Train runs with as few as this many workers while the cluster has no room for
    `workers` and scales up when it does (None: a fixed number). The global mini-batch stays data.batch_size,
    split over the workers there are."""
    start_timeout_s: float = Field(60.0, gt=0)
    """How long Ray Train waits for room for a worker group before it tries again with the room there is (with
    min_workers: fewer workers). After a node is lost, Ray Train may first ask for the old group's size again
    (its view of the cluster lags up to ~20 s); this bounds that wait. Ray Train's
    RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (default 60)."""


ENGINES = ("pipeline", "gpipe", "1f1b", "ddp")
"""The Ray engines: the local-learning pipeline, and for method bp GPipe, 1F1B or data-parallel Ray Train."""

MOVED_RUNTIME_FIELDS = {"window": "pipeline.window", "packets_per_call": "pipeline.packets_per_call",
                        "transport": "pipeline.transport", "micro_batches": "bp_pipeline.micro_batches",
                        "spectrain": "bp_pipeline.spectrain", "ddp_workers": "ddp.workers",
                        "bp_schedule": "runtime.engine"}  # fmt: skip
"""Settings that moved out of runtime into the section of the engine they belong to."""


class RuntimeSpec(Strict):
    """How the run uses Ray, whatever the engine."""

    engine: Literal["auto", "pipeline", "gpipe", "1f1b", "ddp"] = "auto"
    """The Ray engine: pipeline (the local rules al, scpl, dascpl: one stage actor per block, section
    `pipeline`), gpipe (method bp, synchronous, one update per mini-batch) or 1f1b (asynchronous, an update per
    mini-batch on each stage as soon as its backward is done; both section `bp_pipeline`), ddp (method bp
    data-parallel on Ray Train, section `ddp`); auto: pipeline for the local rules, gpipe for bp. A setting
    of another engine's section is refused. --runtime local (the reference trainer) ignores these sections."""
    inline_kb: int = Field(2048, ge=0)
    """Embedded Ray only: arguments up to this size travel inside the actor call instead of through the
    object store (Ray's max_direct_call_object_size; on a cluster set RAY_max_direct_call_object_size on
    `ray start`)."""
    cpus_per_stage: float = Field(1.0, gt=0)
    """CPUs each stage actor (or DDP worker) reserves (and torch threads it uses) when it runs without a GPU."""
    gpus_per_stage: float | None = Field(None, ge=0)
    """GPUs per stage actor or DDP worker; default: 1 when the cluster has GPUs, else 0."""
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Placement-group strategy for the stages across nodes."""
    num_cpus: int | None = Field(None, ge=1)
    """Embedded Ray only: logical CPUs to start it with (default: enough for every block the run will have)."""
    dashboard: bool = True
    """Embedded Ray only: start the Ray dashboard (on 127.0.0.1; its address is printed at the start). It also
    serves Ray's State API: without it Ray Train (engine ddp) keeps logging that it cannot reach it."""
    placement_timeout_s: float = Field(120.0, gt=0)
    """Longest wait for resources to place a stage (at the start and on growth) before failing."""
    stage_timeout_s: float = Field(300.0, gt=0)
    """Longest wait for one packet downstream or one control call before the run fails."""
    timeline_epoch: int = Field(1, ge=0)
    """Epoch whose per-stage timeline is recorded as a Chrome trace (0: none)."""
    on_lost_node: Literal["shrink", "wait", "fail"] = "shrink"
    """When a stage's node is lost and its bundle cannot be placed again within placement_timeout_s: shrink
    (its blocks run packed into the surviving stage actors; they spread out again at an epoch boundary once
    capacity returns), wait (for capacity, however long), or fail (the run ends; --resume goes on later)."""
    max_stage_restarts: int = Field(3, ge=0)
    """A stage actor that dies is replaced and the run rolls back to its last checkpoint, up to this many
    times per run (needs checkpoint.enabled); then the run fails. Engine ddp: the failures Ray Train
    recovers from on its own (FailureConfig.max_failures), from its newest checkpoint."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_RUNTIME_FIELDS.items():
                if old in data:
                    raise ValueError(f"{old} moved to {new}" + (" (gpipe, 1f1b or ddp)" if old == "bp_schedule"
                                                                 else "") + f"; set {new} instead")  # fmt: skip
        return data
