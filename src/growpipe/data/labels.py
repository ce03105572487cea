"""A label column -> class ids and class names, the same way for every table source (parquet, CSV, JSON, Hugging
Face); a blank label, or one unlike the rest of its column, named by file, row and column."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from growpipe.config import DataSpec
from growpipe.data.bundle import check_labels
from growpipe.data.checks import Origin
from growpipe.errors import DataError

if TYPE_CHECKING:
    import pandas as pd


def columns_frame(ds: Any, columns: list[str]) -> pd.DataFrame:
    """The `columns` of a Hugging Face dataset as a frame, converted by Arrow in one go (indexing a column
    formats it row by row: seconds per 100,000 rows at load)."""
    return ds.select_columns(columns).to_pandas()


def check_label_column(columns: list[str], label: str, origin: Origin, name: str) -> None:
    """DataError naming the file and data.label_column when `columns` lack the label column."""
    if label not in columns:
        raise DataError(f"{name}: no label column {label!r} in {origin.place} (columns: {', '.join(map(str, columns))}"
                        "); set data.label_column")  # fmt: skip


def class_labels(train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec, name: str, origins: dict[str, Origin]):
    """Both splits' labels as class ids, and the class names: integers (or whole numbers) are the ids, text
    labels are names, numbered in sorted order. DataError naming the file, row and column of a blank label or
    one unlike the rest of its column (see `_class_ids`)."""
    col = spec.label_column
    ytr, yte = (_class_ids(df[col], col, origins[s]) for s, df in (("train", train), ("test", test)))
    if ytr is None or yte is None:  # class names
        names = sorted(set(train[col].astype(str)))
        index = {n: i for i, n in enumerate(names)}
        text = test[col].astype(str)
        unseen = np.flatnonzero(~text.isin(names).to_numpy())
        if len(unseen):
            row = int(unseen[0])
            raise DataError(f"{origins['test'].row(row)}, column {col!r}: label {text.iloc[row]!r} never appears in "
                            f"{origins['train'].place}; fix the label or add training rows of that class")  # fmt: skip
        ytr = np.array([index[v] for v in train[col].astype(str)], dtype=np.int64)
        yte = np.array([index[v] for v in text], dtype=np.int64)
        return torch.from_numpy(ytr), torch.from_numpy(yte), names
    classes = check_labels(ytr, yte, spec.num_classes, f"{name} column {col!r}", origins)
    if "label_name" in train.columns:
        pairs = dict(zip(ytr.tolist(), train["label_name"].astype(str), strict=True))
        names = [pairs.get(i, str(i)) for i in range(classes)]
    else:
        names = [str(i) for i in range(classes)]
    return torch.from_numpy(ytr), torch.from_numpy(yte), names


def _class_ids(values: pd.Series, col: str, origin: Origin) -> np.ndarray | None:
    """A label column as class ids (integers, whole numbers, or text that is all integers), or None for class
    names (text). DataError naming the row of a blank label, a number that is not whole, or a label unlike
    the rest (a word among class ids, or an integer among names)."""
    import pandas as pd  # lazy: about 0.4 s, only for table data

    text = values.astype(str).str.strip() if values.dtype == object or pd.api.types.is_string_dtype(values) else None
    blank = values.isna().to_numpy() | (text.eq("").to_numpy(dtype=bool) if text is not None else False)
    if blank.any():
        raise DataError(f"{origin.row(int(np.flatnonzero(blank)[0]))}, column {col!r}: no label; give every row its "
                        "class, or drop the row")  # fmt: skip
    if pd.api.types.is_bool_dtype(values):
        return None
    if pd.api.types.is_integer_dtype(values):
        return values.to_numpy(np.int64, copy=True)
    if pd.api.types.is_float_dtype(values):
        arr = values.to_numpy(np.float64)
        odd = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if len(odd):
            raise DataError(f"{origin.row(int(odd[0]))}, column {col!r}: label {arr[odd[0]]:g} is not a class id (a "
                            "whole number 0, 1, ...); fix it, or give the classes as names (text)")  # fmt: skip
        return arr.astype(np.int64)
    if text is None:
        return None
    is_id = text.str.fullmatch(r"[+-]?\d+").to_numpy(dtype=bool)
    if is_id.all():
        return text.astype(np.int64).to_numpy()
    if not is_id.any():
        return None
    mostly_ids = 2 * int(is_id.sum()) >= len(is_id)  # the fewer kind is the mistake
    row = int(np.flatnonzero(~is_id if mostly_ids else is_id)[0])
    among = "class ids (whole numbers)" if mostly_ids else "class names"
    raise DataError(f"{origin.row(row)}, column {col!r}: label {values.iloc[row]!r} among {among}; fix it, or give "
                    "every class by name")  # fmt: skip
