"""Result JSON and the human-readable lines printed during and after a run (shared by every runtime)."""

from __future__ import annotations

from typing import Any

from growpipe.config import RunConfig
from growpipe.fsutil import atomic_write_json


def epoch_row(
    epoch: int, cfg: RunConfig, blocks: int, training: int, losses: dict[str, float], ev: dict[str, Any],
    samples: int, seconds: float, skipped: dict[str, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One entry of the run history (`skipped_batches`: per block `b{i}`, the batches whose update it skipped
    under train.on_nonfinite: skip_batch)."""
    return {
        "epoch": epoch,
        "of": cfg.total_epochs(),
        "blocks": blocks,
        "training": training,
        "loss": losses,
        "exit_depths": ev["exit_depths"],
        "exit_accuracy": ev["exit_accuracy"],
        "test_accuracy": ev["full_accuracy"],
        "val_accuracy": ev.get("val_accuracy"),
        "samples_per_second": samples / seconds if seconds else 0.0,
        "seconds": seconds,
        "skipped_batches": dict(sorted((skipped or {}).items())),
    }


def summarize(
    cfg: RunConfig, blocks: int, history: list[dict[str, Any]], growth: list[dict[str, Any]], ev: dict[str, Any],
    train_seconds: float, samples_seen: int,
) -> dict[str, Any]:  # fmt: skip
    """The result JSON: method, dataset, blocks, accuracy per exit, speed, history, growth, adaptive."""
    return {
        "method": cfg.method,
        "dataset": cfg.data.name,
        "backbone": cfg.net.backbone,
        "blocks": blocks,
        "epochs": len(history),
        "test_accuracy": ev["full_accuracy"],
        "exit_depths": ev["exit_depths"],
        "exit_accuracy": ev["exit_accuracy"],
        "macs_per_exit": ev["macs_per_exit"],
        "adaptive": ev["adaptive"],
        "confidence": ev["confidence"],
        "early_exit": ev.get("early_exit"),
        "train_seconds": round(train_seconds, 3),
        "samples_per_second": round(samples_seen / train_seconds, 1) if train_seconds else 0.0,
        "seconds_per_epoch": round(train_seconds / max(len(history), 1), 3),
        "skipped_batches": skipped_total(history),
        "history": history,
        "growth": growth,
        "config": cfg.model_dump(mode="json"),
    }


def skipped_total(history: list[dict[str, Any]]) -> dict[str, int]:
    """Batches each block skipped over the whole run (train.on_nonfinite: skip_batch), by block `b{i}`."""
    out: dict[str, int] = {}
    for row in history:
        for k, n in row.get("skipped_batches", {}).items():
            out[k] = out.get(k, 0) + n
    return dict(sorted(out.items()))


def format_epoch(row: dict[str, Any]) -> str:
    """One progress line for an epoch row."""
    losses = " ".join(f"{k}={v:.3f}" for k, v in row["loss"].items())
    accs = " ".join(f"@{d}={a:.4f}" for d, a in zip(row["exit_depths"], row["exit_accuracy"], strict=True))
    if row.get("val_accuracy") is not None:
        accs += f" (val {row['val_accuracy']:.4f})"
    skipped = " ".join(f"{k}={n}" for k, n in row.get("skipped_batches", {}).items())
    return (
        f"epoch {row['epoch']:>3}/{row['of']} | blocks {row['blocks']} (training {row['training']}) | "
        f"loss {losses} | acc {accs} | {row['samples_per_second']:.0f} samples/s | {row['seconds']:.1f}s"
        + (f" | skipped batches {skipped}" if skipped else "")
    )


def format_exits(ev: dict[str, Any]) -> str:
    """Accuracy and MACs per exit, then the adaptive trade-off per threshold (when there are several exits)."""
    lines = ["  exit depth  accuracy  MACs/sample"]
    for d, a, m in zip(ev["exit_depths"], ev["exit_accuracy"], ev["macs_per_exit"], strict=True):
        lines.append(f"  {d:>10}  {a:8.4f}  {m:>11,}")
    if len(ev["exit_depths"]) > 1:
        lines.append(f"  adaptive ({ev['confidence']}): threshold  accuracy  mean depth  MACs saved")
        for r in ev["adaptive"]:
            lines.append(
                f"  {r['threshold']:>29.2f}  {r['accuracy']:8.4f}  {r['mean_depth']:10.2f}  "
                f"{100 * r['macs_saved_fraction']:9.1f}%"
            )
    if (e := ev.get("early_exit")) and e["threshold"] is None:
        lines.append(
            "  early exit: no threshold of the table both costs less than the full path and keeps its accuracy "
            f"within 0.5 points; the full path answers ({e['accuracy']:.4f}, "
            f"{1e6 * e['full_path_seconds_per_sample']:.1f} us/sample); eval.exit_threshold sets one"
        )
    elif e:
        lines.append(
            f"  early exit at {e['threshold']:.2f} (measured, samples leave): accuracy {e['accuracy']:.4f}, mean depth "
            f"{e['mean_depth']:.2f}, {1e6 * e['seconds_per_sample']:.1f} us/sample vs "
            f"{1e6 * e['full_path_seconds_per_sample']:.1f} full path ({100 * e['time_saved_fraction']:.1f}% time "
            f"saved, {100 * e['macs_saved_fraction']:.1f}% MACs)"
        )
    return "\n".join(lines)


def format_report(summary: dict[str, Any]) -> str:
    """A short human-readable table of the result JSON."""
    lines = [
        f"{summary['method']} on {summary['dataset']} ({summary['backbone']}, {summary['blocks']} blocks, "
        f"{summary['epochs']} epochs): test accuracy {summary['test_accuracy']:.4f}, "
        f"{summary['samples_per_second']:.0f} samples/s, {summary['train_seconds']:.1f}s training",
        format_exits(summary),
    ]
    if (bar := summary.get("baseline")) and "skipped" not in bar:  # a skipped one was said as the run ended
        lines.insert(1, "  " + format_bar(bar))
    for g in summary["growth"]:
        before = "n/a" if g["acc_before"] is None else f"{g['acc_before']:.4f}"
        after = "n/a" if g["acc_after"] is None else f"{g['acc_after']:.4f}"
        line = f"  growth at epoch {g['epoch']}: +{g['kind']} -> {g['blocks']} blocks, acc {before} -> {after}"
        if (just := g.get("acc_just_before")) is not None and g.get("acc_just_after") is not None:
            line += f" (at growth {just:.4f} -> {g['acc_just_after']:.4f})"  # grow.eval_at_growth
        lines.append(line)
    return "\n".join(lines)


def format_bar(bar: dict[str, Any]) -> str:
    """The one line a classical bar (growpipe.baseline.classical_bar) is printed as (`baseline skipped: why`
    when it was not drawn)."""
    if "skipped" in bar:
        return f"baseline skipped: {bar['skipped']}"
    return (f"baseline {bar['kind']}: test accuracy {bar['accuracy']:.4f} ({bar['train_rows']:,} train / "
            f"{bar['test_rows']:,} test rows, {bar['seconds']:.1f}s fit and test, {bar['load_seconds']:.1f}s "
            "loading)")  # fmt: skip


def format_stage_table(stages: list[dict[str, Any]]) -> str:
    """The per-stage profile of a pipeline run as a short table."""
    lines = ["  stage  block         samples/s   busy s  wait-in s  blocked s   util  hop ms  max in flight"
             "  node      device"]  # fmt: skip
    for r in stages:
        hop = "-" if r["hop_ms_median"] is None else f"{r['hop_ms_median']:.2f}"
        lines.append(
            f"  {r['stage']:>5}  {r['block']:<12}  {r['samples_per_second']:>9.0f}  {r['busy_s']:>7.1f}  "
            f"{r['wait_input_s']:>9.1f}  {r['blocked_s']:>9.1f}  {100 * r['utilisation']:>4.0f}%  {hop:>6}  "
            f"{r['max_inflight']:>13}  {(r.get('node') or '-')[:8]:<8}  {r.get('device') or '-'}"
        )
    return "\n".join(lines)


def format_topology_changes(changes: list[dict[str, Any]]) -> str:
    """One line per topology change of a run (replace, shrink, expand): when, why, how many actors after."""
    return "\n".join(f"  epoch {c['epoch']} batch {c['batch']}: {c['change']} ({c['why']}); {c['actors']} stage "
                     "actor(s)" for c in changes)  # fmt: skip


def end_bench(out: dict[str, Any], json_out: str | None) -> int:
    """A benchmark's last lines: its wall time (out["seconds"]) and, with --json-out, where its JSON went
    (written whole or not at all); the exit code, 0."""
    print(f"done in {out['seconds']} s")
    if json_out:
        print(f"JSON: {atomic_write_json(json_out, out)}")
    return 0
