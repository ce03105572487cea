"""What every reader of table rows checks, in memory or a batch at a time from disk, and how its messages name
a row: as the user counts it, from 1 (the first data row), with the line of a CSV file (its header is line 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Number
from typing import Any

import numpy as np

from growpipe.errors import DataError


@dataclass(frozen=True)
class Origin:
    """Where a split's rows were read from: a file, or a dataset's split (a Hugging Face dataset)."""

    place: str
    split: str
    lines: bool = False
    """A CSV file: row N is line N + 1."""

    @classmethod
    def of_file(cls, path: str, split: str) -> Origin:
        return cls(path, split, lines=path.endswith(".csv"))

    @classmethod
    def of_split(cls, name: str, split: str) -> Origin:
        return cls(f"{name} ({split} split)", split)

    def row(self, position: int) -> str:
        """The row at 0-based `position`: 'FILE row 8 (line 9)' for a CSV file, else 'PLACE row 8 (counting
        from 1)'."""
        return f"{self.place} row {position + 1} ({f'line {position + 2}' if self.lines else 'counting from 1'})"


def column_array(
    values: Any, column: str, origin: Origin, positions: Sequence[int] | np.ndarray | None = None
) -> np.ndarray:
    """A feature column (numbers, or lists of numbers) as a (rows, values) array. DataError naming the column
    and the first bad row (`positions[i]` in the file for the i-th value; i itself without them) when rows
    hold lists of different lengths, something that is not a number, or a missing (NaN) or infinite value."""
    at = (lambda i: i) if positions is None else (lambda i: int(positions[i]))
    try:
        arr = np.asarray(values)
        if arr.dtype == object:  # None among numbers (a blank cell): NaN, refused below
            arr = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.dtype.kind not in "biuf" or (arr.ndim == 2 and arr.shape[1] == 0):
        i, what = _odd_row(list(values))
        raise DataError(f"{origin.row(at(i))}, column {column!r}: {what}; give every row as many numbers")
    arr = arr.reshape(len(arr), -1)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad.any(axis=1))[0])
            value = float(arr[i][bad[i]][0])
            what = "no value (blank, null or NaN)" if np.isnan(value) else f"{value:+}"
            raise DataError(f"{origin.row(at(i))}, column {column!r}: {what}; features must be finite numbers: "
                            "fill, clip or drop such rows first")  # fmt: skip
    return arr


def _odd_row(values: list[Any]) -> tuple[int, str]:
    """The first row unlike the others (a list of another length than most rows', or not a number) and what
    it holds."""
    lengths = [len(v) if isinstance(v, list | tuple | np.ndarray) else None for v in values]
    usual = Counter(lengths).most_common(1)[0][0]
    for i, n in enumerate(lengths):
        if n != usual:
            held = "no list of values" if n is None else f"{n} value(s)"
            return i, f"{held} where the other rows hold {'single values' if usual is None else usual}"
    for i, v in enumerate(values):
        items = list(v) if usual is not None else [v]
        odd = next((x for x in items if x is not None and not isinstance(x, Number)), None)
        if odd is not None:
            return i, f"{odd!r} is not a number"
    return 0, "values that are not numbers"


def dropped_columns_note(columns: Sequence[str]) -> list[str]:
    """The warning for columns left out because they do not hold numbers (empty when none were)."""
    return [f"dropped {len(columns)} non-numeric column(s): {', '.join(map(str, columns))}"] if columns else []


def check_columns(columns: Sequence[str], test_columns: Sequence[str], origins: dict[str, Origin], name: str) -> None:
    """DataError unless the test split has every column the model reads from the train split."""
    missing = [c for c in columns if c not in test_columns]
    if missing:
        raise DataError(f"{name}: column {missing[0]!r} is missing from {origins['test'].place} (it is in "
                        f"{origins['train'].place}{f' with {len(missing) - 1} more' if len(missing) > 1 else ''}); "
                        "add it to the test data or drop it from the train data")  # fmt: skip
