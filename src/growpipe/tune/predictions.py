"""Stored per-exit predictions of a trained net: computed once, then every threshold trial re-reads them
(adaptive inference is a function of the exits' probabilities, so no trial retrains or re-runs the net)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from growpipe.evaluation import load_for_evaluation, split_predictions
from growpipe.fsutil import atomic_write_bytes
from growpipe.nn.inference import ExitPredictions, evaluate_exits


@dataclass
class StoredExits:
    """Per-exit probabilities on one split, the labels, and each exit's MAC cost (encoders, head)."""

    preds: ExitPredictions
    costs: dict[int, tuple[int, int]]
    split: str

    def trade_off(self, threshold: float, confidence: str, cost_weight: float) -> dict[str, float]:
        """Adaptive inference at one threshold: accuracy, mean depth, MACs saved, and the sweep's score
        (accuracy - cost_weight * fraction of the full path's MACs used)."""
        ev = evaluate_exits(self.preds, [threshold], confidence, self.costs)
        row = ev["adaptive"][0]
        used = 1.0 - row["macs_saved_fraction"]
        return {
            "accuracy": row["accuracy"],
            "mean_depth": row["mean_depth"],
            "macs_per_sample": row["macs_per_sample"],
            "macs_saved": row["macs_saved_fraction"],
            "full_accuracy": ev["full_accuracy"],
            "score": row["accuracy"] - cost_weight * used,
        }


def compute_exits(checkpoint: str | Path, split: str) -> StoredExits:
    """Run a checkpoint's net once over `split` (val or test) and keep every exit's probabilities."""
    net, bundle, _ = load_for_evaluation(checkpoint)
    return StoredExits(split_predictions(net, bundle, split), net.exit_costs(), split)


def save_exits(path: str | Path, stored: StoredExits) -> Path:
    """Write the predictions as one .npz (atomically)."""
    arrays: dict[str, Any] = {
        "depths": np.array(stored.preds.depths),
        "labels": stored.preds.labels.numpy(),
        "costs": np.array([stored.costs[d] for d in stored.preds.depths], dtype=np.int64),
        "split": np.array(stored.split),
    }
    for d in stored.preds.depths:
        arrays[f"probs{d}"] = stored.preds.probs[d].numpy()
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


def load_exits(path: str | Path) -> StoredExits:
    """Read predictions written by save_exits (plain arrays: nothing is unpickled)."""
    with np.load(path, allow_pickle=False) as z:
        depths = [int(d) for d in z["depths"]]
        probs = {d: torch.from_numpy(z[f"probs{d}"]) for d in depths}
        costs = {d: (int(c[0]), int(c[1])) for d, c in zip(depths, z["costs"], strict=True)}
        preds = ExitPredictions(depths, probs, torch.from_numpy(z["labels"]))
        return StoredExits(preds, costs, str(z["split"]))
