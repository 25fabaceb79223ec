"""Many one-event JSON records decoded as columns at once (``pyarrow.json``), for the common shape only.

Parsing and validating JSON events one by one is Python work per event (the
validator about half of it); Arrow's JSON reader parses a newline-joined batch
straight into columns at a fraction of that CPU (``streamrec bench ingest``),
and the checks below run once per column. This path is strict: it answers only when the batch has exactly the
shapes the contract's validator (``EventSchema.validate``) accepts and that map
one to one onto columns -- ``ts`` int64 without nulls, ``label`` a number in
[0, 1], ``labels`` an object of model tasks, each a number in [0, 1] or null (agreeing
with ``label`` where both are given), ``dense`` lists of ``dense_dim`` finite numbers,
``sparse`` an object of model fields, each an int64 or string id or a list of them,
``request_id`` a string, ``feedback`` one of the feedback kinds or null -- and returns the very batch the validator's path builds. Anything else
(one bad record, a float where an id goes, a key it does not know, ``user``/
``item`` given at the top level, ids beyond int64, a message holding two objects
or a newline, ...) returns None, and the caller decodes the batch record by
record, which names each bad record with its reason.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import xxhash

from streamrec.foundation import EventBatch, EventError, EventSchema, JaggedIds

from .label_columns import feedback_column

_TOP = frozenset({"ts", "label", "labels", "dense", "sparse", "request_id", "feedback"})


def _flat(col) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _hash_strings(values: pa.Array) -> np.ndarray:
    """xxh64 of each id's UTF-8 bytes, as int64 (``foundation.hash_id`` of a string). Each distinct string
    is hashed once (ids are skewed: a batch repeats its popular ones), from its bytes as Arrow holds them."""
    d = values.dictionary_encode()
    uniq = d.dictionary.cast(pa.binary()).to_pylist()
    h = np.fromiter(map(xxhash.xxh64_intdigest, uniq), dtype=np.uint64, count=len(uniq)).view(np.int64)
    return h[d.indices.to_numpy(zero_copy_only=False)]


def _ids(col: pa.Array, n: int) -> JaggedIds | None:
    """One sparse field's column as jagged ids; None when its shape is not one this path takes."""
    t = col.type
    if pa.types.is_null(t):  # every row left it out (or null): no ids
        return JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
    if pa.types.is_int64(t) or pa.types.is_string(t):  # one id per row; a null row holds none
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        present = col.drop_null()
        values = present.to_numpy() if pa.types.is_int64(t) else _hash_strings(present)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(valid, out=offsets[1:])
        return JaggedIds(np.ascontiguousarray(values, dtype=np.int64), offsets)
    if pa.types.is_list(t):
        vt = t.value_type
        if not (pa.types.is_int64(vt) or pa.types.is_string(vt) or pa.types.is_null(vt)):
            return None
        if col.null_count:  # a null row is no ids: fill it with an empty list first
            col = col.fill_null(pa.scalar([], type=t))
        flat = col.flatten()
        if flat.null_count:  # a null inside a list: the validator refuses it
            return None
        offsets = col.offsets.to_numpy().astype(np.int64)
        offsets = offsets - offsets[0]
        if pa.types.is_null(vt):
            values = np.zeros(0, np.int64)
        elif pa.types.is_int64(vt):
            values = flat.to_numpy()
        else:
            values = _hash_strings(flat)
        return JaggedIds(np.ascontiguousarray(values, dtype=np.int64), offsets)
    return None


def _labels(schema: EventSchema, lc: pa.Array | None, n: int) -> np.ndarray | None:
    """The ``label`` column as float32 (0.0 where absent, when labels are optional); None when refused."""
    if lc is None or pa.types.is_null(lc.type) or lc.null_count:
        if schema.require_label:
            return None
        if lc is not None and not pa.types.is_null(lc.type):
            if not (pa.types.is_int64(lc.type) or pa.types.is_float64(lc.type)):
                return None
            lc = lc.fill_null(0)
        else:
            lc = pa.array(np.zeros(n), pa.float64())
    if not (pa.types.is_int64(lc.type) or pa.types.is_float64(lc.type)):
        return None
    lab = lc.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if n and not (lab.min() >= 0.0 and lab.max() <= 1.0):  # NaN fails too
        return None
    labels = lab.astype(np.float32)
    return labels


def _task_labels(schema: EventSchema, lsc: pa.Array, lc: pa.Array | None,
                 n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The first task's labels (0.0 where missing) and the task-label matrix (NaN = missing) of the
    ``labels`` column and the ``label`` column (when given); None when refused."""
    if not pa.types.is_struct(lsc.type):
        return None
    index = {t: k for k, t in enumerate(schema.tasks)}
    names = [lsc.type.field(i).name for i in range(lsc.type.num_fields)]
    if len(set(names)) != len(names) or not set(names) <= set(index):
        return None
    matrix = np.full((n, len(schema.tasks)), np.nan, np.float32)
    # flatten(): each task with the struct's own nulls applied (a row without labels has none)
    for name, child in zip(names, lsc.flatten()):
        t = child.type
        if pa.types.is_null(t):
            continue
        if not (pa.types.is_int64(t) or pa.types.is_float64(t)):
            return None
        v = child.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        valid = child.is_valid().to_numpy(zero_copy_only=False)
        given = v[valid]
        if len(given) and not (given.min() >= 0.0 and given.max() <= 1.0):  # NaN fails too
            return None
        col = v.astype(np.float32)
        col[~valid] = np.nan
        matrix[:, index[name]] = col
    if lc is not None and not pa.types.is_null(lc.type):
        if not (pa.types.is_int64(lc.type) or pa.types.is_float64(lc.type)):
            return None
        lab = lc.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        given = lc.is_valid().to_numpy(zero_copy_only=False)
        g = lab[given]
        if len(g) and not (g.min() >= 0.0 and g.max() <= 1.0):  # NaN fails too
            return None
        first = matrix[:, 0]
        lab32 = lab.astype(np.float32)
        both = given & ~np.isnan(first)
        if (lab32[both] != first[both]).any():  # label and labels[first task] disagree: the validator names it
            return None
        fill = given & np.isnan(first)
        matrix[fill, 0] = lab32[fill]
    if schema.require_label and n and np.isnan(matrix).all(axis=1).any():
        return None
    if len(schema.tasks) == 1:  # as the validator's batch: a row without labels has its label, 0.0 when absent
        without = ~lsc.is_valid().to_numpy(zero_copy_only=False) & np.isnan(matrix[:, 0])
        matrix[without, 0] = 0.0
    return np.nan_to_num(matrix[:, 0], nan=0.0), matrix


class _NotColumnar(Exception):
    """The batch is not one this path takes: the caller decodes it record by record."""


def decode_json_columns(schema: EventSchema, values: Sequence[bytes]) -> EventBatch | None:
    """The batch of ``values`` (each one JSON object) when every record is valid and of the common shape;
    else None (the caller decodes record by record)."""
    n = len(values)
    table = _json_table(values)
    if table is None:
        return None
    col = {c: _flat(table.column(c)) for c in table.column_names}
    try:
        ts = _ts(col.get("ts"), n)
        labels, task_labels = _label_columns(schema, col.get("labels"), col.get("label"), n)
        dense = _dense(schema, col.get("dense"), n)
        sparse = _sparse(schema, col.get("sparse"), n)
        rids = _request_ids(col.get("request_id"), n)
        feedback = _feedback(col.get("feedback"))
    except _NotColumnar:
        return None
    return EventBatch(ts=ts, labels=labels, dense=dense, sparse=sparse, request_ids=rids,
                      task_labels=task_labels, task_names=schema.tasks if task_labels is not None else None,
                      feedback=feedback)


def _json_table(values: Sequence[bytes]) -> pa.Table | None:
    """``values`` read as one table by Arrow's JSON reader, one row per value; None when they are not one
    JSON object per value, on one line each, with only the contract's top-level keys."""
    n = len(values)
    if not n:
        return None
    if values[0][:1] != b"{":  # not a JSON object (an Arrow stream, say): no join of what cannot be columns
        return None
    try:
        joined = b"\n".join(values)
    except TypeError:  # None among them
        return None
    # one line per message, each starting with "{" (no blank, whitespace-led or multi-line message)
    if joined[:1] != b"{" or joined.count(b"\n") != n - 1 or joined.count(b"\n{") != n - 1 or b"\r" in joined:
        return None
    try:
        table = pj.read_json(pa.py_buffer(joined), read_options=pj.ReadOptions(
            use_threads=False, block_size=max(1 << 20, len(joined) + 1)))
    except (pa.ArrowInvalid, UnicodeDecodeError, ValueError):
        return None
    if table.num_rows != n:  # a record holding two objects
        return None
    if not set(table.column_names) <= _TOP:
        return None
    return table


def _absent(c: pa.Array | None) -> bool:
    """The key is in no record, or null in every one."""
    return c is None or pa.types.is_null(c.type)


def _ts(tc: pa.Array | None, n: int) -> np.ndarray:
    if tc is None:
        return np.zeros(n, np.int64)
    if not pa.types.is_int64(tc.type) or tc.null_count:  # null: ``"ts": null``, refused by the validator
        raise _NotColumnar
    return tc.to_numpy()


def _label_columns(schema: EventSchema, lsc: pa.Array | None, lc: pa.Array | None,
                   n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The first task's labels and, for a model with several tasks or records with ``labels``, the
    task-label matrix (NaN = missing)."""
    if not _absent(lsc):
        got = _task_labels(schema, lsc, lc, n)
        if got is None:
            raise _NotColumnar
        return got
    labels = _labels(schema, lc, n)
    if labels is None:
        raise _NotColumnar
    if len(schema.tasks) == 1:
        return labels, None
    # the first task's label alone: the others are missing
    task_labels = np.full((n, len(schema.tasks)), np.nan, np.float32)
    task_labels[:, 0] = labels
    if not _absent(lc) and lc.null_count:
        task_labels[~lc.is_valid().to_numpy(zero_copy_only=False), 0] = np.nan
    elif _absent(lc):
        task_labels[:, 0] = np.nan
    return labels, task_labels


def _dense(schema: EventSchema, dc: pa.Array | None, n: int) -> np.ndarray:
    dim = schema.dense_dim
    if _absent(dc):
        if dim:
            raise _NotColumnar
        return np.zeros((n, 0), np.float32)
    if not pa.types.is_list(dc.type) or dc.null_count:
        raise _NotColumnar
    vt = dc.type.value_type
    if not (pa.types.is_int64(vt) or pa.types.is_float64(vt) or (pa.types.is_null(vt) and not dim)):
        raise _NotColumnar
    offsets = dc.offsets.to_numpy()
    if n and not np.all(np.diff(offsets) == dim):
        raise _NotColumnar
    flat = dc.flatten()
    if flat.null_count:
        raise _NotColumnar
    vals = flat.to_numpy(zero_copy_only=False) if dim else np.zeros(0)
    bound = schema.dense_abs_max
    if len(vals) and not (vals.min() >= -bound and vals.max() <= bound):  # NaN fails too
        raise _NotColumnar
    return vals.astype(np.float32).reshape(n, dim)  # int64 straight to float32, as numpy does a Python int


def _sparse(schema: EventSchema, sc: pa.Array | None, n: int) -> dict[str, JaggedIds]:
    children: dict[str, pa.Array] = {}
    if not _absent(sc):
        if not pa.types.is_struct(sc.type):
            raise _NotColumnar
        field_names = [sc.type.field(i).name for i in range(sc.type.num_fields)]
        if len(set(field_names)) != len(field_names) or not set(field_names) <= set(schema.fields):
            raise _NotColumnar
        # flatten(): each field with the struct's own nulls applied (a row without sparse holds no ids)
        children = dict(zip(field_names, sc.flatten()))
    sparse: dict[str, JaggedIds] = {}
    empty = None
    for f in schema.fields:
        child = children.get(f)
        if child is None:
            if empty is None:
                empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
            sparse[f] = empty
            continue
        ids = _ids(child, n)
        if ids is None:
            raise _NotColumnar
        sparse[f] = ids
    return sparse


def _request_ids(rc: pa.Array | None, n: int) -> list | None:
    if _absent(rc):
        return None
    if not pa.types.is_string(rc.type):  # numbers become their text in the validator: left to it
        raise _NotColumnar
    return rc.to_pylist() if rc.null_count < n else None


def _feedback(fc: pa.Array | None) -> np.ndarray | None:
    if _absent(fc):
        return None
    if not pa.types.is_string(fc.type):  # a number, a list...: the validator names it
        raise _NotColumnar
    try:
        return feedback_column(fc)
    except EventError:  # a value that is not a feedback kind: the validator names the record
        raise _NotColumnar from None
