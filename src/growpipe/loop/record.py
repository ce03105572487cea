"""RunRecord: what a run has done so far, the part of its state a checkpoint keeps and a restore brings back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from growpipe.growth import FrozenWatch


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
