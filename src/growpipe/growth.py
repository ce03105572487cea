"""When a net grows: the schedule / every-N-epochs / plateau policies, and the growth history.

Both runtimes ask the same `GrowthPlan` after every epoch, so the reference trainer and the Ray pipeline
grow at the same points. Growth asked for from outside a running job is recorded in the same history.
"""

from __future__ import annotations

from typing import Any

import torch

from growpipe.config import GrowStep, RunConfig
from growpipe.data.presence import KNOWN_INPUTS, planned_input
from growpipe.errors import ConfigError
from growpipe.nn.backbones import IMAGE_BACKBONES
from growpipe.nn.net import plan_blocks, plan_growth_block
from growpipe.nn.specs import BlockSpec, InputInfo


class GrowthPlan:
    """Which growth steps are due after a given number of finished epochs."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.policy = cfg.grow.policy()
        self.total_epochs = cfg.total_epochs()
        self.growing_until = self.total_epochs - (cfg.grow.joint.epochs if cfg.grow.joint else 0)
        """The net grows by plan or request only before this many finished epochs: grow.joint's phase follows."""
        self.last_growth_epoch = 0
        self._scheduled: dict[int, list[GrowStep]] = {}
        at = cfg.train.epochs
        for step in cfg.grow.schedule:
            self._scheduled.setdefault(at, []).append(step)
            at += step.epochs

    def due(self, epoch: int, history: list[dict[str, Any]], depth: int) -> list[GrowStep]:
        """Steps to apply now, after `epoch` finished epochs (0: before training) at the current depth."""
        if self.policy == "schedule":  # every step, even past the limit: the loop says which it skips
            return list(self._scheduled.get(epoch, []))
        if self.policy == "none" or epoch == 0 or epoch >= self.growing_until:
            return []
        if grow_refusal("", depth, 0, self.cfg.max_blocks()):  # the policy's growth ends at the limit
            return []
        since = epoch - self.last_growth_epoch
        if self.policy == "every_epochs":
            return [self.cfg.grow.step] if since >= (self.cfg.grow.every_epochs or 0) else []
        plateau = self.cfg.grow.on_plateau
        assert plateau is not None
        vals = [h["val_accuracy"] for h in history[len(history) - since :] if h.get("val_accuracy") is not None]
        if len(vals) <= plateau.patience:
            return []
        best_before = max(vals[: -plateau.patience])
        return [self.cfg.grow.step] if max(vals[-plateau.patience :]) < best_before + plateau.min_delta else []

    def grew(self, epoch: int) -> None:
        """Note a growth (from the plan or from outside) after `epoch` finished epochs."""
        self.last_growth_epoch = epoch

    def in_joint(self, epoch: int) -> bool:
        """Whether epoch `epoch` + 1, the one to train after `epoch` finished epochs, is in grow.joint's phase."""
        return self.cfg.grow.joint is not None and epoch >= self.growing_until


def grow_refusal(run: str, depth: int, pending: int, limit: int) -> str | None:
    """Why one more block may not be added under grow.max_blocks (`limit`, RunConfig.max_blocks(): its
    default is net.blocks + len(grow.schedule)), counting the blocks the net has and the requests accepted
    but not attached yet; None: it fits. The one limit of requests and planned steps alike."""
    if depth + pending < limit:
        return None
    counting = f" (counting {pending} request(s) not attached yet)" if pending else ""
    return f"run {run!r} is at grow.max_blocks={limit} blocks{counting}"


def planned_steps(cfg: RunConfig) -> list[tuple[str, GrowStep]]:
    """The steps the growth plan may take, in order, each with the field that asks for it: the schedule's, or
    grow.step up to grow.max_blocks (every_epochs, on_plateau)."""
    if cfg.grow.policy() in ("every_epochs", "on_plateau"):
        return [("grow.step", cfg.grow.step)] * max(0, cfg.max_blocks() - cfg.net.blocks)
    return [(f"grow.schedule[{i}]", step) for i, step in enumerate(cfg.grow.schedule)]


def preserve_plan_problem(cfg: RunConfig, info: InputInfo, specs: list[BlockSpec]) -> str | None:
    """With grow.init: preserve, why a planned step not taken yet (the net has `specs`) cannot start where the
    net stands, naming the step and the fix; None: every one can (or grow.init is fresh)."""
    if cfg.grow.init != "preserve":
        return None
    specs = list(specs)
    for where, step in planned_steps(cfg)[max(0, len(specs) - cfg.net.blocks) :]:
        try:
            specs.append(plan_growth_block(cfg.net, info, specs[-1], step, preserve=True))
        except ConfigError as e:
            return f"{where}: {e}"
    return None


def preserve_config_problem(cfg: RunConfig) -> str | None:
    """preserve_plan_problem before the run starts, on the input the config tells without reading the data
    (growpipe.data.presence.planned_input) where that input fixes the blocks' shapes: every backbone but the
    image ones, whose maps' sizes count when the data is a named set or data.image_shape / image_size says them.
    Feature steps wait for the data's groups. None: fine, or left to the run's start (RunLoop, on its data)."""
    data = cfg.data
    sized = data.name in KNOWN_INPUTS or data.image_shape is not None or data.image_size is not None
    if cfg.grow.init != "preserve" or (cfg.net.backbone in IMAGE_BACKBONES and not sized):
        return None
    if any(step.kind == "feature" for _, step in planned_steps(cfg)):
        return None
    shape, dtype, classes, vocab, _ = planned_input(data, cfg.net.backbone)
    info = InputInfo(shape, dtype, classes, vocab)
    try:
        with torch.device("meta"):  # shapes only: no weights in the driver (the first meta pass costs ~1 s)
            return _planned_problem(cfg, info)
    except NotImplementedError:  # a forward that reads its data (a packed LSTM's lengths) cannot run on meta
        return _planned_problem(cfg, info)


def _planned_problem(cfg: RunConfig, info: InputInfo) -> str | None:
    try:
        return preserve_plan_problem(cfg, info, plan_blocks(cfg.net, cfg.rule(), info))
    except ConfigError:  # a net the planned input cannot build: the data's checks say so
        return None


class FrozenWatch:
    """Checksums of blocks taken when they were frozen, compared at the end: did they stay bit-identical?"""

    def __init__(self) -> None:
        self.at_freeze: dict[int, str] = {}

    def note(self, sums: dict[int, str]) -> None:
        """Record the checksums of blocks frozen now (the first checksum of a block is the one kept)."""
        for i, s in sums.items():
            self.at_freeze.setdefault(i, s)

    def unchanged(self, sums: dict[int, str]) -> bool | None:
        """True when every watched block still has its checksum; None when no block was frozen."""
        if not self.at_freeze:
            return None
        return all(sums.get(i) == s for i, s in self.at_freeze.items())

    def thawed(self, sums: dict[int, str]) -> bool | None:
        """The frozen blocks learn again (grow.joint): whether they stayed bit-identical until now (`unchanged`);
        nothing is watched from here on."""
        verdict = self.unchanged(sums)
        self.at_freeze = {}
        return verdict


def growth_event(
    epoch: int, step: GrowStep, blocks: int, history: list[dict[str, Any]], source: str, batch: int | None = None
) -> dict[str, Any]:
    """One entry of the growth history. acc_before is the newest epoch's test accuracy and acc_after is filled
    in by `note_epoch` as training goes on (the grown net at the end of its phase); acc_just_before /
    acc_just_after, the net's test accuracy at the moment of growth, and val_just_before / val_just_after, its
    validation accuracy then (with a validation split), by the loop (grow.eval_at_growth)."""
    return {
        "epoch": epoch,
        "batch": batch,
        "kind": step.kind,
        "group": step.group,
        "width": step.width,
        "blocks": blocks,
        "source": source,
        "acc_before": history[-1]["test_accuracy"] if history else None,
        "acc_after": None,
        "acc_just_before": None,
        "acc_just_after": None,
        "val_just_before": None,
        "val_just_after": None,
    }


def note_epoch(growth: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """After an epoch: the newest growth's acc_after becomes this epoch's accuracy (so at the end of its
    phase it holds the accuracy the grown net reached before the next growth)."""
    if growth and growth[-1]["epoch"] < row["epoch"]:
        growth[-1]["acc_after"] = row["test_accuracy"]
