"""The grow section (schedule, every N epochs, on a plateau; the frozen-prefix cache) and a request to grow a
running job."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from growpipe.config.base import Strict
from growpipe.config.problems import format_errors
from growpipe.errors import ConfigError


class _BlockAsk(Strict):
    """Which block to append: a layer on top, or a block that also reads a new feature group."""

    kind: Literal["layer", "feature"] = "layer"
    """layer: a block on top of the last one; feature: a block on top that also reads a new feature group."""
    group: str | None = None
    """Feature group the new block receives (kind=feature)."""
    width: int | None = Field(None, ge=1)
    """Width of the new block: MLP/LSTM/feature units (default net.width) or conv channels (default: the
    previous block's); a transformer block keeps the model size of the one below."""

    @model_validator(mode="after")
    def _group_for_feature(self) -> _BlockAsk:
        if self.kind == "feature" and not self.group:
            raise ValueError("kind=feature needs group: the name of a feature group, e.g. chunk1")
        if self.kind == "layer" and self.group:
            raise ValueError("group is only for kind=feature; drop it or set kind: feature")
        return self


class GrowStep(_BlockAsk):
    """One growth step of the schedule: append a block, then train it."""

    epochs: int = Field(1, ge=0)
    """Epochs to train after this block is appended, before the next step."""


class GrowRequest(_BlockAsk):
    """A request to grow a running job (`growpipe grow`), validated like a config."""

    input_size: int | None = Field(None, ge=1)
    """Features per sample the new block expects; checked against the last block's output when given."""

    def as_step(self) -> GrowStep:
        return GrowStep(kind=self.kind, group=self.group, width=self.width, epochs=0)


class PlateauSpec(Strict):
    """Grow when validation accuracy stops improving."""

    patience: int = Field(2, ge=1)
    """Epochs without an improvement of at least min_delta (since the last growth) before growing."""
    min_delta: float = Field(0.002, ge=0.0)
    """Smallest rise of validation accuracy that counts as an improvement."""


class JointSpec(Strict):
    """A short joint phase at the end of a growing run: every block learns again (the frozen ones too), at a
    lower learning rate, for `epochs` more epochs; nothing grows in it."""

    epochs: int = Field(1, ge=1)
    """Epochs of the joint phase, after the run's other epochs (train.epochs and the schedule's)."""
    lr_factor: float = Field(0.3, gt=0.0, le=1.0)
    """Every block's learning rate in the joint phase, as a share of its rate before (the schedule's warm-up
    and decay go on applying on top)."""


class CacheSpec(Strict):
    """The frozen-prefix cache (Ray runtime): after a growth with the earlier blocks frozen, their output
    for every training sample is computed once and the new block trains from it."""

    enabled: bool = True
    """Build the cache after a growth with the earlier blocks frozen."""
    max_memory_mb: float = Field(1024.0, gt=0)
    """Largest cache kept in the training stage's memory."""
    spill: bool = True
    """Past max_memory_mb keep the cache in memory-mapped files on the stage's local disk (else refuse)."""
    spill_dir: str | None = None
    """Directory for spilled caches (default: the system temp directory)."""


class GrowSpec(Strict):
    """When the net grows: an explicit schedule, every N epochs, or on a validation plateau.

    With `schedule`, train.epochs come first and each step adds its own epochs. With `every_epochs` or
    `on_plateau`, train.epochs is the whole run and `step` is the block appended each time, up to
    `max_blocks`. A running job also grows on request (`growpipe grow --run NAME`).
    """

    schedule: list[GrowStep] = []
    """Growth steps in order; train.epochs come first, then each step's own epochs."""
    every_epochs: int | None = Field(None, ge=1)
    """Append `step` every N epochs (up to max_blocks)."""
    on_plateau: PlateauSpec | None = None
    """Append `step` when validation accuracy stops improving (needs data.val_fraction)."""
    step: GrowStep = GrowStep()
    """The block every_epochs / on_plateau append (its epochs field is not used)."""
    max_blocks: int | None = Field(None, ge=1, le=64)
    """Most blocks the net may reach, by plan or by request (a planned step past it is skipped, a request
    refused); default: net.blocks + len(schedule), so set it for `growpipe grow` to add blocks beyond those."""
    freeze: bool = True
    """Freeze earlier blocks when a block is appended (only the new block trains)."""
    init: Literal["fresh", "preserve"] = "fresh"
    """How a new block starts: fresh (its own seeded initial weights), or preserve: where the net stands, so
    the accuracy does not drop at the moment of growth: its encoder gated to hand its input on (x + g * (f(x) -
    x), the learned g starting at 0) and its exit copied from the block below's (AL: the bridge, its decoder the
    identity). Needs a block whose output has its input's shape (a dense block as wide as the one below, a
    transformer block, a conv block on 1x1 maps); a plan that cannot is refused at the start (docs/growth.md)."""
    eval_at_growth: bool = False
    """Evaluate the net (test split, and the validation split when there is one) just after each growth, and
    just before one made within an epoch (at an epoch's end its evaluation is the net's before): the growth
    history's acc_just_before / acc_just_after (test) and val_just_before / val_just_after (validation). One
    more evaluation pass per growth (two mid-epoch), which a request's answer and the new block's first step
    wait for: off by default."""
    joint: JointSpec | None = None
    """A joint phase at the end (unfreeze every block, lower learning rate); its epochs come after all others
    and count in the run's cost. Needs no growth policy: without one it is a lower-rate phase of every block."""
    cache: CacheSpec = CacheSpec()
    """The frozen-prefix cache (local-learning pipeline on Ray)."""
    on_no_capacity: Literal["fail", "pack"] = "fail"
    """A new block whose stage cannot be placed within runtime.placement_timeout_s: fail the growth (a
    request is refused, a planned growth ends the run), or pack the block into the last stage's actor."""
    standby: Literal["auto", "always", "never"] = "auto"
    """Start the stage actor of the next block while the run can still grow (below max_blocks), so that a
    growth only builds the block (a stage's start-up is seconds of imports): a request is answered in about a
    second. It holds one stage's resources idle until then. auto: when a stage holds no GPU and the cluster
    has the room now; always: GPU stages too; never: start each grown block's actor on demand."""

    @model_validator(mode="after")
    def _one_policy(self) -> GrowSpec:
        policies = [n for n, v in (("schedule", self.schedule), ("every_epochs", self.every_epochs),
                                   ("on_plateau", self.on_plateau)) if v]  # fmt: skip
        if len(policies) > 1:
            raise ValueError(f"{' and '.join(policies)} are set; keep one way of growing")
        if (self.every_epochs or self.on_plateau) and self.max_blocks is None:
            raise ValueError("max_blocks is needed with every_epochs / on_plateau: the net stops growing there")
        if self.joint and self.schedule and self.schedule[-1].epochs == 0:
            raise ValueError("joint: the last schedule step has epochs: 0, so its block would train only in the joint "
                             "phase; give that step epochs: 1 or more")  # fmt: skip
        return self

    def policy(self) -> str:
        """schedule | every_epochs | on_plateau | none."""
        if self.every_epochs:
            return "every_epochs"
        if self.on_plateau:
            return "on_plateau"
        return "schedule" if self.schedule else "none"


def parse_grow_request(raw: dict[str, Any]) -> GrowRequest:
    """Validate a grow request; raise ConfigError listing every problem, like a config."""
    try:
        return GrowRequest.model_validate(raw or {})
    except ValidationError as err:
        raise ConfigError(format_errors(err, "grow request")) from None
