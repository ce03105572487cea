"""PNG plots of an evaluation: accuracy against compute for every exit and adaptive threshold."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from growpipe.fsutil import atomic_write_bytes


def plot_accuracy_vs_compute(ev: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Accuracy vs multiply-accumulates per sample: the fixed exits (shortcuts, full path) as points and
    adaptive inference as a curve over the thresholds. Written atomically; returns the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    full = ev["macs_per_exit"][-1]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot([m / full for m in ev["macs_per_exit"]], ev["exit_accuracy"], "o--", color="tab:gray", label="fixed exit")
    for d, m, a in zip(ev["exit_depths"], ev["macs_per_exit"], ev["exit_accuracy"], strict=True):
        ax.annotate(f"depth {d}", (m / full, a), textcoords="offset points", xytext=(4, -10), fontsize=7)
    if len(ev["exit_depths"]) > 1 and ev["adaptive"]:
        rows = sorted(ev["adaptive"], key=lambda r: r["macs_per_sample"])
        ax.plot(
            [r["macs_per_sample"] / full for r in rows],
            [r["accuracy"] for r in rows],
            "s-",
            color="tab:blue",
            label=f"adaptive ({ev['confidence']})",
        )
        for r in rows:
            ax.annotate(f"{r['threshold']:g}", (r["macs_per_sample"] / full, r["accuracy"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7, color="tab:blue")  # fmt: skip
    ax.set_xlabel("multiply-accumulates per sample (fraction of the full path)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title or "accuracy vs compute")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
