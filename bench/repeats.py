"""Repeated, interleaved measurements (bench pipeline, bench scale): the order the arms run in each repeat, and
every figure's median with its spread (min-max) over the repeats. Not a benchmark itself: no Ray, no torch."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def rotation(arms: Sequence[T], repeat: int) -> list[T]:
    """The arms in the order repeat `repeat` (0-based) runs them: shifted by one each repeat, so every arm runs
    first (on a cold machine) in turn instead of one arm always."""
    k = repeat % len(arms)
    return [*arms[k:], *arms[:k]]


def spread(values: Iterable[float | None]) -> dict[str, float | int] | None:
    """{median, min, max, n} of the numbers among `values` (None skipped); None when there are none."""
    nums = sorted(float(v) for v in values if v is not None)
    if not nums:
        return None
    return {"median": statistics.median(nums), "min": nums[0], "max": nums[-1], "n": len(nums)}


def summarize(runs: Sequence[dict[str, Any]], keys: Iterable[str]) -> dict[str, dict[str, float | int] | None]:
    """Per key of `keys`, the spread of its value over `runs` (one dict per repeat)."""
    return {k: spread(r.get(k) for r in runs) for k in keys}


def median_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One dict of the runs' medians, key by key: numbers give their median, lists of numbers (one per stage) and
    dicts of numbers their median element by element; a value every run shares (a width) and anything else (a
    name) the first run's value."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs]
        if all(v == first for v in values):
            out[key] = first
        elif _is_number(first) and all(_is_number(v) for v in values):
            out[key] = statistics.median(values)
        elif isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first) for v in values):
            columns = list(zip(*values, strict=True))
            out[key] = [statistics.median(c) if all(map(_is_number, c)) and len(set(c)) > 1 else c[0] for c in columns]
        elif isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
            out[key] = median_figures(values)
        else:
            out[key] = first
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def format_spread(s: dict[str, float | int] | None, digits: int = 2) -> str:
    """`median [min-max]` (`-` for no values), e.g. `1.67 [1.58-1.71]`; `[min to max]` when min is negative."""
    if s is None:
        return "-"
    dash = "-" if s["min"] >= 0 else " to "
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}{dash}{s['max']:.{digits}f}]"


def spread_table(summary: dict[str, dict[str, float | int] | None], rows: Sequence[tuple[str, str, int]]) -> str:
    """A compact table, one line per (key, label, digits) of `rows`: label, median, [min-max], n."""
    width = max(len(label) for _, label, _ in rows)
    lines = [f"   {'figure':<{width}}  median [min-max]  n"]
    for key, label, digits in rows:
        s = summary.get(key)
        lines.append(f"   {label:<{width}}  {format_spread(s, digits)}  {s['n'] if s else 0}")
    return "\n".join(lines)
