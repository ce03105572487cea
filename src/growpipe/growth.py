"""When a net grows: the schedule / every-N-epochs / plateau policies, and the growth history.

Both runtimes ask the same `GrowthPlan` after every epoch, so the reference trainer and the Ray pipeline
grow at the same points. Growth asked for from outside a running job is recorded in the same history.
"""

from __future__ import annotations

from typing import Any

from growpipe.config import GrowStep, RunConfig


class GrowthPlan:
    """Which growth steps are due after a given number of finished epochs."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.policy = cfg.grow.policy()
        self.total_epochs = cfg.total_epochs()
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
        if self.policy == "none" or epoch in (0, self.total_epochs):
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


def grow_refusal(run: str, depth: int, pending: int, limit: int) -> str | None:
    """Why one more block may not be added under grow.max_blocks (`limit`, RunConfig.max_blocks(): its
    default is net.blocks + len(grow.schedule)), counting the blocks the net has and the requests accepted
    but not attached yet; None: it fits. The one limit of requests and planned steps alike."""
    if depth + pending < limit:
        return None
    counting = f" (counting {pending} request(s) not attached yet)" if pending else ""
    return f"run {run!r} is at grow.max_blocks={limit} blocks{counting}"


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


def growth_event(
    epoch: int, step: GrowStep, blocks: int, history: list[dict[str, Any]], source: str, batch: int | None = None
) -> dict[str, Any]:
    """One entry of the growth history; acc_after is filled in by `note_epoch` as training goes on."""
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
    }


def note_epoch(growth: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """After an epoch: the newest growth's acc_after becomes this epoch's accuracy (so at the end of its
    phase it holds the accuracy the grown net reached before the next growth)."""
    if growth and growth[-1]["epoch"] < row["epoch"]:
        growth[-1]["acc_after"] = row["test_accuracy"]
