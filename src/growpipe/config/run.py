"""RunConfig: a whole run, its sections checked against each other, and the answers derived from them
(engine, rule settings, block and epoch counts)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from growpipe.config.base import Strict
from growpipe.config.data import DataSpec
from growpipe.config.engines import BPPipelineSpec, DDPSpec, PipelineSpec, RuntimeSpec
from growpipe.config.grow import GrowSpec, GrowStep
from growpipe.config.names import run_name_problem
from growpipe.config.net import ALSpec, NetSpec, OptimSpec, RuleSettings, SCPLSpec
from growpipe.config.records import CheckpointSpec, EvalSpec, TrackingSpec


class RunConfig(Strict):
    """A whole run: what to train, on what, how, and how it grows."""

    name: str | None = None
    """The run's name: its controller actor on the cluster, its MLflow run, its checkpoint folder; default
    METHOD-DATASET-TIME (e.g. al-digits-20261124-101500-3fa2), chosen when the run starts. Letters, digits,
    '_', '.' and '-', starting with a letter or digit, no '..', at most 128 characters."""
    method: Literal["al", "scpl", "dascpl", "bp"] = "al"
    """The learning rule: al, scpl, dascpl (local objectives per block) or bp (end to end)."""
    seed: int = 0
    """Seeds the data order and every block's weights and dropout."""
    device: str = "auto"
    """auto (CUDA when present), cpu, cuda, cuda:N."""
    threads: int = Field(0, ge=0)
    """torch threads for the reference trainer (0: torch's default)."""
    data: DataSpec = DataSpec()
    """The dataset and its batching."""
    net: NetSpec = NetSpec()
    """The backbone and how it is cut into blocks."""
    train: OptimSpec = OptimSpec()
    """Epochs and the optimizer."""
    al: ALSpec = ALSpec()
    """Associated Learning settings."""
    scpl: SCPLSpec = SCPLSpec()
    """SCPL / DASCPL settings."""
    grow: GrowSpec = GrowSpec()
    """When and how the net grows."""
    eval: EvalSpec = EvalSpec()
    """Evaluation: exits and adaptive inference."""
    runtime: RuntimeSpec = RuntimeSpec()
    """How the run uses Ray, and which engine."""
    pipeline: PipelineSpec = PipelineSpec()
    """The local-learning pipeline's settings (runtime.engine pipeline)."""
    bp_pipeline: BPPipelineSpec = BPPipelineSpec()
    """Pipelined BP's settings (runtime.engine gpipe or 1f1b)."""
    ddp: DDPSpec = DDPSpec()
    """Data-parallel BP's settings (runtime.engine ddp)."""
    tracking: TrackingSpec = TrackingSpec()
    """Where the run is recorded (MLflow)."""
    checkpoint: CheckpointSpec = CheckpointSpec()
    """Restore points for resume and recovery."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        if v is not None and (why := run_name_problem(v)):
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        for i, step in enumerate(self.grow.schedule):
            self.check_feature_group(step, f"grow.schedule[{i}].group")
        self.check_feature_group(self.grow.step, "grow.step.group")
        if self.grow.on_plateau and not self.data.val_fraction:
            raise ValueError("grow.on_plateau watches validation accuracy: set data.val_fraction (e.g. 0.1)")
        least = self.net.blocks + len(self.grow.schedule)
        if self.grow.max_blocks is not None and self.grow.max_blocks < least:
            raise ValueError(f"grow.max_blocks ({self.grow.max_blocks}) is below the {least} blocks the plan grows to "
                             f"(net.blocks {self.net.blocks} + {len(self.grow.schedule)} schedule step(s)); raise it "
                             f"to {least} or more, or plan fewer blocks")  # fmt: skip
        if why := self.engine_problem():
            raise ValueError(why)
        if self.grow.init == "preserve" and (why := self.preserve_problem()):
            raise ValueError(why)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: {self.device!r} is not auto, cpu, cuda or cuda:N")
        if self.data.ngrams > 1 and self.net.backbone != "embedding":
            raise ValueError(f"data.ngrams: word pairs make a bag of terms, which only net.backbone embedding reads "
                             f"(this net is {self.net.backbone}); set data.ngrams: 1")  # fmt: skip
        if self.data.adapt and self.net.backbone != "embedding":
            raise ValueError(f"data.adapt: it chooses word pairs and word dropout for a bag of terms, which only "
                             f"net.backbone embedding reads (this net is {self.net.backbone}); set data.adapt: "
                             f"false")  # fmt: skip
        if self.net.word_dropout and self.net.backbone != "embedding":
            raise ValueError(f"net.word_dropout: supported for the embedding backbone's bag only (an LSTM's packed "
                             f"lengths would cut at a dropped word; this net is {self.net.backbone}); set "
                             f"net.word_dropout: 0")  # fmt: skip
        if self.data.augment and self.data.feature_groups.scheme != "none":
            raise ValueError("data.augment: crops and flips would move pixels across data.feature_groups; choose one")
        if self.data.augment and self.grow.freeze and self.grow.cache.enabled and self.max_blocks() > self.net.blocks:
            raise ValueError(
                "data.augment: the frozen-prefix cache computes each sample's input to a new block once, so frozen "
                "blocks would not see augmented images; set grow.cache.enabled: false"
            )
        return self

    def check_feature_group(self, step: GrowStep, where: str) -> None:
        """Raise ValueError naming `where` when a feature step asks for a group the data does not declare."""
        known = self.data.feature_groups.side_names()
        if step.kind == "feature" and step.group not in known:
            hint = (
                f"this config declares {', '.join(known)}"
                if known
                else "set data.feature_groups (scheme, count, base) to declare groups"
            )
            raise ValueError(f"{where}: unknown feature group {step.group!r}; {hint}")

    def preserve_problem(self) -> str | None:
        """Why grow.init: preserve cannot hold for this config whatever the data (None: the blocks decide, when
        the run starts: growpipe.growth.preserve_plan_problem)."""
        if self.engine() == "ddp":
            return ("grow.init: preserve: runtime.engine ddp builds a grown block in its next trainer, without the "
                    "exit below it; use runtime.engine gpipe or 1f1b, or grow.init: fresh")  # fmt: skip
        if self.method == "al" and self.al.decoder_activation:
            return ("grow.init: preserve: al.decoder_activation ends a new block's decoder in an activation, which "
                    "cannot start as the identity; set al.decoder_activation: false, or grow.init: fresh")  # fmt: skip
        return None

    def rule(self) -> RuleSettings:
        """The settings nn/ builds blocks from."""
        return RuleSettings(method=self.method, seed=self.seed, optim=self.train, al=self.al, scpl=self.scpl)

    def engine(self) -> str:
        """The Ray engine this config runs on (runtime.engine; auto: pipeline for the local rules, gpipe for
        bp). The one place it is chosen."""
        if self.runtime.engine != "auto":
            return self.runtime.engine
        return "gpipe" if self.method == "bp" else "pipeline"

    def engine_problem(self) -> str | None:
        """Why the engine cannot run this method, or which other engine's section is set (None: fine)."""
        engine = self.engine()
        if (self.method == "bp") != (engine != "pipeline"):
            if self.method == "bp":
                return ("runtime.engine: pipeline trains the local rules (al, scpl, dascpl); method bp takes gpipe, "
                        "1f1b or ddp")  # fmt: skip
            return (f"runtime.engine: {engine} is BP on Ray (method bp); method {self.method} takes pipeline "
                    "(or auto)")  # fmt: skip
        owners = {"pipeline": ("pipeline",), "bp_pipeline": ("gpipe", "1f1b"), "ddp": ("ddp",)}
        for section, engines in owners.items():
            spec = getattr(self, section)
            changed = [k for k, v in spec if v != type(spec).model_fields[k].default]
            if changed and engine not in engines:
                return (f"{section}.{changed[0]}: applies to runtime.engine {' or '.join(engines)}, and this run's "
                        f"engine is {engine}; remove it")  # fmt: skip
        if self.bp_pipeline.spectrain and engine == "gpipe":
            return "bp_pipeline.spectrain: applies to runtime.engine 1f1b (GPipe has no stale weights); remove it"
        if self.ddp.min_workers is not None and self.ddp.min_workers > (self.ddp.workers or self.net.blocks):
            return (f"ddp.min_workers ({self.ddp.min_workers}) is more than ddp.workers "
                    f"({self.ddp.workers or self.net.blocks}); lower it")  # fmt: skip
        return None

    def max_blocks(self) -> int:
        """Most blocks the net may reach: grow.max_blocks, else once the whole schedule has run."""
        if self.grow.max_blocks is not None:
            return self.grow.max_blocks
        return self.net.blocks + len(self.grow.schedule)

    def total_epochs(self) -> int:
        """Epochs of the whole run (with a schedule: initial + every growth step; then grow.joint's)."""
        joint = self.grow.joint.epochs if self.grow.joint else 0
        return self.train.epochs + sum(s.epochs for s in self.grow.schedule) + joint
