"""PNG plots of a run: accuracy vs compute, per exit and per threshold, exit depths, the stage timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from growpipe.outputs import write_png


def plot_accuracy_vs_compute(ev: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Accuracy vs multiply-accumulates per sample: the fixed exits (shortcuts, full path) as points and
    adaptive inference as a curve over the thresholds. Written atomically; returns the path."""
    full = ev["macs_per_exit"][-1]
    fig, ax = _figure(title or "accuracy vs compute", "multiply-accumulates per sample (fraction of the full path)",
                      "test accuracy")  # fmt: skip
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
    ax.legend(loc="lower right")
    return _save(fig, path)


def plot_accuracy_vs_time(
    curves: dict[str, list[tuple[float, float]]], path: str | Path, title: str = "", target: float | None = None
) -> Path:
    """Test accuracy after each epoch against cumulative training seconds, one line per method (and the
    target accuracy as a dashed line). Written atomically; returns the path."""
    fig, ax = _figure(title or "accuracy vs wall time", "training time (s, evaluation excluded)", "test accuracy")
    for label, points in curves.items():
        if points:
            ax.plot([t for t, _ in points], [a for _, a in points], "o-", markersize=3, label=label)
    if target is not None:
        ax.axhline(target, color="tab:gray", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    ax.legend(loc="lower right", fontsize=7)
    return _save(fig, path)


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        return write_png(path, fig)
    finally:
        plt.close(fig)


def plot_exit_accuracy(ev: dict[str, Any], path: str | Path) -> Path:
    """Test accuracy at every exit depth (bars)."""
    fig, ax = _figure("accuracy per exit", "exit depth", "test accuracy")
    ax.bar([str(d) for d in ev["exit_depths"]], ev["exit_accuracy"], color="tab:blue")
    for i, a in enumerate(ev["exit_accuracy"]):
        ax.annotate(f"{a:.3f}", (i, a), ha="center", textcoords="offset points", xytext=(0, 3), fontsize=8)
    ax.set_ylim(0, 1.05)
    return _save(fig, path)


def plot_accuracy_vs_threshold(ev: dict[str, Any], path: str | Path) -> Path:
    """Adaptive inference: accuracy and the share of MACs saved for every confidence threshold."""
    rows = sorted(ev["adaptive"], key=lambda r: r["threshold"])
    fig, ax = _figure(f"adaptive inference ({ev['confidence']})", "confidence threshold", "")
    ths = [r["threshold"] for r in rows]
    ax.plot(ths, [r["accuracy"] for r in rows], "o-", label="accuracy")
    ax.plot(ths, [r["macs_saved_fraction"] for r in rows], "s--", label="MACs saved (fraction)")
    ax.axhline(ev["exit_accuracy"][-1], color="tab:gray", lw=0.8, ls=":", label="full-path accuracy")
    ax.legend(loc="lower left")
    return _save(fig, path)


def plot_exit_histogram(ev: dict[str, Any], path: str | Path) -> Path:
    """For every threshold, the share of test samples leaving at each depth (stacked bars)."""
    rows = sorted(ev["adaptive"], key=lambda r: r["threshold"])
    fig, ax = _figure("where samples exit", "confidence threshold", "share of test samples")
    labels = [f"{r['threshold']:g}" for r in rows]
    bottom = [0.0] * len(rows)
    for i, d in enumerate(ev["exit_depths"]):
        share = [r["exit_fraction"][i] for r in rows]
        ax.bar(labels, share, bottom=bottom, label=f"depth {d}")
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_stage_timeline(trace: dict[str, Any], path: str | Path) -> Path:
    """The recorded epoch of a Ray run: per stage, when it trained and when it waited on the next stage."""
    events = trace.get("traceEvents", [])
    fig, ax = _figure("stage timeline (one epoch)", "seconds", "stage")
    t0 = min((e["ts"] for e in events), default=0.0)
    colors = {"train_step": "tab:blue", "blocked_downstream": "tab:red"}
    for e in events:
        ax.broken_barh([((e["ts"] - t0) / 1e6, e["dur"] / 1e6)], (e["tid"] - 0.4, 0.8),
                       color=colors.get(e["name"], "tab:gray"))  # fmt: skip
    stages = sorted({e["tid"] for e in events})
    ax.set_yticks(stages)
    ax.set_yticklabels([str(s) for s in stages])
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=n) for n, c in colors.items()], fontsize=7, loc="upper right")
    return _save(fig, path)


def plot_run(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Every plot a finished run has data for, into `out_dir`."""
    out = Path(out_dir)
    paths = [
        plot_exit_accuracy(summary, out / "exit_accuracy.png"),
        plot_accuracy_vs_compute(summary, out / "accuracy_vs_compute.png"),
    ]
    if len(summary["exit_depths"]) > 1 and summary["adaptive"]:
        paths += [
            plot_accuracy_vs_threshold(summary, out / "accuracy_vs_threshold.png"),
            plot_exit_histogram(summary, out / "exit_depth_histogram.png"),
        ]
    if summary.get("timeline", {}).get("traceEvents"):
        paths.append(plot_stage_timeline(summary["timeline"], out / "stage_timeline.png"))
    return paths
