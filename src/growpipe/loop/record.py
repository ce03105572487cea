"""RunRecord: what a run has done so far, the part of its state a checkpoint keeps and a restore brings back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from growpipe.growth import FrozenWatch
from growpipe.loop.policies import better_epoch
from growpipe.loop.stats import StageStats


@dataclass
class RunRecord:
    """Epoch rows, growth events, planned steps skipped, prefix caches, the frozen blocks and their checksums at
    freezing, training time and samples, restarts, and the best epoch since the last growth (model selection:
    {epoch, val_accuracy, path})."""

    history: list[dict[str, Any]] = field(default_factory=list)
    growth: list[dict[str, Any]] = field(default_factory=list)
    growth_skipped: list[dict[str, Any]] = field(default_factory=list)  # planned steps grow.max_blocks stopped
    caches: list[dict[str, Any]] = field(default_factory=list)
    frozen: set[int] = field(default_factory=set)
    watch: FrozenWatch = field(default_factory=FrozenWatch)
    train_seconds: float = 0.0
    samples: int = 0
    restarts: int = 0
    best: dict[str, Any] | None = None
    joint: dict[str, Any] | None = None  # grow.joint's phase once it began: {epoch, lr_factor, thawed, ...}
    totals: dict[int, StageStats] = field(default_factory=dict)  # per stage, since this process (re)started it

    def add_epoch(
        self, stats: list[StageStats], samples: int, seconds: float
    ) -> tuple[dict[str, float], dict[str, int]]:
        """Count an epoch's stage statistics, samples and seconds; its losses and skipped batches by block."""
        losses: dict[str, float] = {}
        skipped: dict[str, int] = {}
        for s in stats:
            losses.update(s.losses)
            skipped.update(s.skipped)
            s.wall_s, s.events = seconds, []
            self.totals[s.stage] = self.totals[s.stage].merge(s) if s.stage in self.totals else s
        self.train_seconds += seconds
        self.samples += samples
        return losses, skipped

    def note_best(self, epoch: int) -> bool:
        """Model selection (eval.restore_best): whether epoch `epoch`'s row just beat the best validation
        accuracy since the last growth (then it becomes the best; its checkpoint is written and kept)."""
        if not self.history or self.history[-1]["epoch"] != epoch or not epoch:
            return False
        row = self.history[-1]
        if not better_epoch(self.best["val_accuracy"] if self.best else None, row):
            return False
        self.best = {"epoch": epoch, "val_accuracy": row["val_accuracy"], "path": None}
        return True

    def to_manifest(self) -> dict[str, Any]:
        """The fields of a checkpoint manifest this record fills."""
        return {
            "history": self.history,
            "growth": self.growth,
            "growth_skipped": self.growth_skipped,
            "frozen_checksums": {str(i): v for i, v in self.watch.at_freeze.items()},
            "train_seconds": self.train_seconds,
            "samples": self.samples,
            "caches": self.caches,
            "restarts": self.restarts,
            "best": self.best,
            "joint": self.joint,
        }

    def restore(self, manifest: dict[str, Any]) -> None:
        """Back to what `manifest` recorded (the restarts made since are kept: they are this process's)."""
        self.history, self.growth = list(manifest["history"]), list(manifest["growth"])
        self.growth_skipped = list(manifest.get("growth_skipped", []))
        self.watch = FrozenWatch()
        self.watch.note({int(i): v for i, v in manifest["frozen_checksums"].items()})
        self.frozen = {int(i) for i in manifest["frozen_checksums"]}
        self.train_seconds, self.samples = manifest["train_seconds"], manifest["samples"]
        self.caches = list(manifest.get("caches", []))
        self.best = manifest.get("best")
        self.joint = manifest.get("joint")
        self.totals = {}
