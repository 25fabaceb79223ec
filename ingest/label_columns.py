"""The ``labels`` struct column of Arrow IPC and Parquet events: one float32 child per task, null =
missing, checked and read into the task-label matrix (NaN = missing) beside the ``label`` column;
and the optional ``feedback`` column (a string or dictionary-of-strings column: ``negative``,
``fake_negative``, ``positive``, null = a plain event), read into ``EventBatch.feedback`` codes."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from streamrec.foundation import FEEDBACK_CODES, EventError, EventSchema


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def show_type(t: pa.DataType) -> str:
    """An Arrow type for an error message (a nested field's name may not be valid UTF-8)."""
    try:
        return str(t)
    except Exception:
        return f"<a {type(t).__name__} type that cannot be printed>"


def check_labels_type(t: pa.DataType, tasks: Sequence[str]) -> None:
    """``labels``: a struct of numeric (or all-null) children, each named as one of the model's tasks."""
    if not pa.types.is_struct(t):
        raise EventError(f"labels must be a struct with one float32 child per task ({', '.join(tasks)}), "
                         f"got {show_type(t)}")
    seen = set()
    for k in range(t.num_fields):
        child = t.field(k)
        try:
            name = child.name
        except UnicodeDecodeError:
            raise EventError("labels: a child name is not valid UTF-8") from None
        if name not in tasks:
            raise EventError(f"labels: unknown task {name!r}; model tasks: {', '.join(tasks)}")
        if name in seen:
            raise EventError(f"labels: duplicate task {name!r}")
        seen.add(name)
        if not (is_number(child.type) or pa.types.is_null(child.type)):
            raise EventError(f"labels: {name!r} must be float32 (a number in [0, 1] or null), "
                             f"got {show_type(child.type)}")


def task_label_columns(s: EventSchema, lsc: pa.Array, lc: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` (and ``label``, when the table has it) as the first task's labels (0.0 where missing)
    and the task-label matrix (NaN = missing); the type passed :func:`check_labels_type`."""
    matrix = np.full((n, len(s.tasks)), np.nan, np.float32)
    index = {t: k for k, t in enumerate(s.tasks)}
    # flatten(): each child with the struct's own nulls applied (a row without labels has none)
    for child_field, child in zip(lsc.type, lsc.flatten()):
        if pa.types.is_null(child.type) or child.null_count == n:
            continue
        v = child.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        given = v[child.is_valid().to_numpy(zero_copy_only=False)] if child.null_count else v
        if len(given) and not (given.min() >= 0 and given.max() <= 1):  # a NaN value (not a null) fails too
            raise EventError(f"labels: {child_field.name!r} must be a number in [0, 1] or null")
        matrix[:, index[child_field.name]] = with_nulls(child, v)
    if lc is not None:
        lab = lc.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        if lc.null_count:
            lab = with_nulls(lc, lab)
            given = lc.is_valid().to_numpy(zero_copy_only=False)
        else:
            given = np.ones(n, bool)
        g = lab[given]
        if len(g) and not (g.min() >= 0 and g.max() <= 1):  # NaN fails too
            raise EventError("label must be in [0, 1]")
        first = matrix[:, 0]
        both = given & ~np.isnan(first)
        if (lab[both] != first[both]).any():
            row = int(np.flatnonzero(both & (lab != first))[0])
            raise EventError(f"label ({float(lab[row])!r}) and labels[{s.tasks[0]!r}] ({float(first[row])!r}) "
                             f"disagree (row {row}); label is the first task's label")
        fill = given & np.isnan(first)
        matrix[fill, 0] = lab[fill]
    if s.require_label and n:
        none = np.isnan(matrix).all(axis=1)
        if none.any():
            raise EventError(f"missing label: no task has one in row {int(np.flatnonzero(none)[0])} "
                             f"(model tasks: {', '.join(s.tasks)})")
    return np.nan_to_num(matrix[:, 0], nan=0.0), matrix



def with_nulls(col: pa.Array, values: np.ndarray) -> np.ndarray:
    """``values`` (a numeric column's, as float32) with NaN where ``col`` is null."""
    if not col.null_count:
        return values
    out = np.array(values, dtype=np.float32, copy=True)
    out[~col.is_valid().to_numpy(zero_copy_only=False)] = np.nan
    return out


def check_feedback_type(t: pa.DataType) -> None:
    """``feedback``: a string column, a dictionary of strings, or all null."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
        raise EventError(f"feedback must be a string column ({', '.join(FEEDBACK_CODES)} or null), "
                         f"got {show_type(t)}")


def feedback_column(col: pa.Array) -> np.ndarray | None:
    """A ``feedback`` column (its type passed :func:`check_feedback_type`) as int8 codes, 0 where null;
    None when every row is null. A value that is not a feedback kind raises EventError naming it."""
    n = len(col)
    if pa.types.is_null(col.type) or col.null_count == n:
        return None
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    d = col.dictionary_encode()
    kinds = d.dictionary.to_pylist()
    codes = np.zeros(len(kinds) + 1, np.int8)  # the last slot: null rows
    for k, kind in enumerate(kinds):
        code = FEEDBACK_CODES.get(kind)
        if code is None:
            raise EventError(f"feedback must be one of {', '.join(FEEDBACK_CODES)} or null, got {kind[:60]!r}")
        codes[k] = code
    idx = d.indices.fill_null(len(kinds)).to_numpy(zero_copy_only=False)
    return codes[idx]
