"""Tables in memory (pandas frames, one per split) -> a text bundle (tokenised), an image bundle (number lists or
columns reshaped by data.image_shape) or a tabular one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from growpipe.config import DataSpec
from growpipe.data.assemble import image_bundle
from growpipe.data.bundle import DataBundle, Split
from growpipe.data.checks import Origin, check_columns, column_array, dropped_columns_note
from growpipe.data.labels import check_label_column, class_labels
from growpipe.data.moments import unit_float
from growpipe.data.text import Vocab, kept_length, tokenize
from growpipe.errors import DataError
from growpipe.text_recipe import choose

if TYPE_CHECKING:
    import pandas as pd


def frames_to_bundle(name: str, train: pd.DataFrame, test: pd.DataFrame, spec: DataSpec,
                     origins: dict[str, Origin] | None = None) -> DataBundle:  # fmt: skip
    """Turn train/test frames into a text bundle (when the text column exists), an image bundle (number
    lists or numeric columns reshaped by data.image_shape) or a tabular one. `origins` (each split's file)
    name the rows in messages."""
    import pandas as pd  # lazy: about 0.4 s, only for table data

    label = spec.label_column
    origins = origins or {s: Origin.of_split(name, s) for s in ("train", "test")}
    for split, df in (("train", train), ("test", test)):
        if len(df) == 0:
            raise DataError(f"{name}: the {split} split is empty; point data at files with rows")
        check_label_column(list(df.columns), label, origins[split], name)
    ytr, yte, class_names = class_labels(train, test, spec, name, origins)
    if spec.text_column in train.columns:
        check_columns([spec.text_column], list(test.columns), origins, name)
        _check_text(train[spec.text_column], spec.text_column, name)
        ttr, tte = (df[spec.text_column].astype(str).to_numpy(dtype=object) for df in (train, test))
        lengths: list[int] = []
        choice = choose(float(np.median([len(tokenize(t)) for t in ttr])), spec.ngrams) if spec.adapt else None
        ngrams = choice.ngrams if choice is not None else spec.ngrams
        vocab = Vocab.build(ttr, spec.vocab_size, spec.min_count, lengths, ngrams)
        max_len = kept_length(lengths, spec.max_len, spec.max_len_percentile)
        _check_token_memory(len(ttr) + len(tte), vocab.width(max_len), max_len, spec)
        ids_tr, ids_te = vocab.encode(ttr.tolist(), max_len), vocab.encode(tte.tolist(), max_len)
        return DataBundle(name, "text", Split(ids_tr, ytr, text=ttr), Split(ids_te, yte, text=tte), len(class_names),
                          class_names, vocab, text_choice=choice)  # fmt: skip
    others = [c for c in train.columns if c not in (label, "label_name")]
    vectors = [c for c in others if _is_vector_column(train[c])]
    feats = [c for c in others if c in vectors or pd.api.types.is_numeric_dtype(train[c])]
    if not feats:
        raise DataError(
            f"{name}: no text column {spec.text_column!r} and no numeric feature columns; set data.text_column"
        )
    check_columns(feats, list(test.columns), origins, name)
    notes = dropped_columns_note([str(c) for c in others if c not in feats])
    xtr = _feature_matrix(train, feats, vectors, origins["train"])
    xte = _feature_matrix(test, feats, vectors, origins["test"])
    if xtr.shape[1] != xte.shape[1]:
        raise DataError(f"{name}: train rows have {xtr.shape[1]} features but test rows {xte.shape[1]}; fix the data")
    if spec.image_shape is not None:
        shape = tuple(spec.image_shape)
        if int(np.prod(shape)) != xtr.shape[1]:
            raise DataError(f"data.image_shape: {list(shape)} holds {int(np.prod(shape))} values but {name}'s rows "
                            f"have {xtr.shape[1]}; give [channels, height, width] of that many")  # fmt: skip
        as_bytes = all(np.issubdtype(x.dtype, np.integer) and x.min() >= 0 and x.max() <= 255 for x in (xtr, xte))
        xtr, xte = (x.reshape(-1, *shape).astype(np.uint8 if as_bytes else np.float32) for x in (xtr, xte))
        return image_bundle(name, xtr, ytr.numpy(), xte, yte.numpy(), class_names, spec, notes)
    return DataBundle(
        name,
        "tabular",
        Split(unit_float(xtr.astype(np.float32)), ytr),
        Split(unit_float(xte.astype(np.float32)), yte),
        len(class_names),
        class_names,
        notes=notes,
    )


def _check_token_memory(rows: int, width: int, kept: int, spec: DataSpec) -> None:
    """DataError naming data.max_len when `rows` documents of `width` token ids (int64) cannot fit in this
    machine's memory."""
    need, have = 8 * rows * width, psutil.virtual_memory().total
    if need <= have:
        return
    raise DataError(
        f"data.max_len: {rows:,} documents of {width:,} token ids each ({kept:,} words kept per "
        f"document, at most data.max_len={spec.max_len:,}) need {need / 2**30:,.1f} GiB, more than this "
        f"machine's {have / 2**30:,.1f} GiB; lower data.max_len or set data.max_len_percentile (e.g. 95)"
    )


def _is_vector_column(column: pd.Series) -> bool:
    sample = column.dropna()
    return len(sample) > 0 and isinstance(sample.iloc[0], list | tuple | np.ndarray)


def _feature_matrix(df: pd.DataFrame, feats: list[str], vectors: list[str], origin: Origin) -> np.ndarray:
    """(rows, features): numeric columns as they are, number-list columns spread out, in column order; each
    checked by `column_array` as rows read from disk are."""
    parts = []
    for c in feats:
        column = df[c]
        values: list[Any] | np.ndarray
        if c in vectors:
            values = column.tolist()
        elif column.isna().any():  # nullable integers hold pd.NA: as NaN, refused as missing
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        else:
            values = column.to_numpy()
        parts.append(column_array(values, c, origin))
    return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def _check_text(column: pd.Series, col: str, name: str) -> None:
    """DataError unless the column holds text (not images, bytes, numbers or lists)."""
    present = column.dropna()
    sample = present.iloc[0] if len(present) else ""
    if not isinstance(sample, str):
        kind = (
            "images"
            if isinstance(sample, dict) and {"bytes", "path"} & set(sample)
            else f"{type(sample).__name__} values"
        )
        raise DataError(f"{name}: column {col!r} holds {kind}, not text; set data.text_column to a column of text "
                        "(a table without one trains on its numeric columns)")  # fmt: skip
