"""Events <-> protobuf, and a Predict request -> ``ingest.EventBatch``.

Validation reuses ``ingest.EventSchema`` rules (dense width, known fields, id
hashing) so serving accepts exactly what the trainer accepts; every error names
the offending field, e.g. ``events[3].dense``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from ingest import EventBatch, JaggedIds, hash_id

from .pb import pb


class RequestError(ValueError):
    """A request field is bad; the message starts with the field's path."""


def event_to_proto(ev: Mapping[str, Any]) -> "pb.Event":
    """A plain event dict (the JSON contract) as a proto Event; labels are dropped."""
    if not isinstance(ev, Mapping):
        raise RequestError(f"event must be an object, got {type(ev).__name__}")
    msg = pb.Event(ts=int(ev.get("ts", 0) or 0), request_id=str(ev.get("request_id") or ""))
    dense = ev.get("dense") or []
    if not isinstance(dense, list):
        raise RequestError("dense must be a list of numbers")
    msg.dense.extend(float(x) for x in dense)
    sparse = dict(ev.get("sparse") or {})
    for opt in ("user", "item"):
        if opt in ev and opt not in sparse:
            sparse[opt] = ev[opt]
    for name, v in sparse.items():
        ids = msg.sparse[name]
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str):
                ids.keys.append(x)
            elif isinstance(x, int) and not isinstance(x, bool):
                ids.ids.append(hash_id(x))
            else:
                raise RequestError(f"sparse.{name}: id {x!r} is not an integer or string")
    return msg


def events_to_request(events: Iterable[Mapping[str, Any]], columns: bool = True) -> "pb.PredictRequest":
    """A Predict request for plain event dicts: column-wise (fast path) or one message per event."""
    events = list(events)
    req = pb.PredictRequest()
    if not columns:
        req.events.extend(event_to_proto(e) for e in events)
        return req
    c = req.columns
    c.size = len(events)
    dense: list[float] = []
    rids: list[str] = []
    cols: dict[str, tuple[list[int], list[int]]] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, Mapping):
            raise RequestError(f"events[{i}]: must be an object, got {type(ev).__name__}")
        d = ev.get("dense") or []
        if not isinstance(d, list):
            raise RequestError(f"events[{i}].dense: must be a list of numbers")
        dense.extend(d)
        rids.append(str(ev.get("request_id") or ""))
        sparse = dict(ev.get("sparse") or {})
        for opt in ("user", "item"):
            if opt in ev and opt not in sparse:
                sparse[opt] = ev[opt]
        for name, v in sparse.items():
            vals, lens = cols.setdefault(name, ([], [0] * len(events)))
            vs = v if isinstance(v, list) else [v]
            try:
                vals.extend(hash_id(x) for x in vs)
            except ValueError as e:
                raise RequestError(f"events[{i}].sparse.{name}: {e}") from None
            lens[i] = len(vs)
    try:
        c.dense.extend(dense)
    except TypeError:
        raise RequestError("dense: values must be numbers") from None
    if any(rids):
        c.request_ids.extend(rids)
    for name, (vals, lens) in cols.items():
        col = c.sparse[name]
        col.values.extend(vals)
        col.lengths.extend(lens)
    return req


def _from_repeated(values, dtype) -> np.ndarray:
    return np.fromiter(values, dtype=dtype, count=len(values))


def columns_to_batch(c, fields: list[str], dense_dim: int, max_batch: int) -> tuple[EventBatch, list[str]]:
    n = int(c.size)
    if n == 0:
        raise RequestError("columns.size: 0; send at least one event")
    if n > max_batch:
        raise RequestError(f"columns.size: {n} events, the limit is {max_batch} per request")
    if len(c.dense) != n * dense_dim:
        raise RequestError(f"columns.dense: {len(c.dense)} values, expected size*dense_dim = {n * dense_dim}")
    dense = _from_repeated(c.dense, np.float32).reshape(n, dense_dim)
    if not np.all(np.isfinite(dense)):
        raise RequestError(f"columns.dense: values must be finite (event {int(np.argwhere(~np.isfinite(dense))[0][0])})")
    known = set(fields)
    for name in c.sparse:
        if name not in known:
            raise RequestError(f"columns.sparse: unknown field {name!r}; model fields: {', '.join(fields)}")
    sparse = {}
    for f in fields:
        if f in c.sparse:
            col = c.sparse[f]
            if len(col.lengths) != n:
                raise RequestError(f"columns.sparse[{f}].lengths: {len(col.lengths)} entries, expected {n}")
            lengths = _from_repeated(col.lengths, np.int64)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            if offsets[-1] != len(col.values):
                raise RequestError(f"columns.sparse[{f}].values: {len(col.values)} ids, lengths sum to {int(offsets[-1])}")
            sparse[f] = JaggedIds(_from_repeated(col.values, np.int64), offsets)
        else:
            sparse[f] = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
    if len(c.request_ids) not in (0, n):
        raise RequestError(f"columns.request_ids: {len(c.request_ids)} entries, expected 0 or {n}")
    if len(c.ts) not in (0, n):
        raise RequestError(f"columns.ts: {len(c.ts)} entries, expected 0 or {n}")
    ts = _from_repeated(c.ts, np.int64) if len(c.ts) else np.zeros(n, np.int64)
    rids = list(c.request_ids) if len(c.request_ids) else [""] * n
    return EventBatch(ts=ts, labels=np.zeros(n, np.float32), dense=dense, sparse=sparse), rids


def request_to_batch_ids(req, fields: list[str], dense_dim: int, max_batch: int) -> tuple[EventBatch, list[str]]:
    """The batch of a Predict request (either form) and the request ids to echo."""
    has_cols = req.HasField("columns")
    if has_cols and len(req.events):
        raise RequestError("events: send either events or columns, not both")
    if has_cols:
        return columns_to_batch(req.columns, fields, dense_dim, max_batch)
    batch = request_to_batch(req, fields, dense_dim, max_batch)
    return batch, [e.request_id for e in req.events]


def request_to_batch(req: "pb.PredictRequest", fields: list[str], dense_dim: int, max_batch: int) -> EventBatch:
    """Validate a Predict request against the served model and build its batch."""
    n = len(req.events)
    if n == 0:
        raise RequestError("events: empty; send at least one event")
    if n > max_batch:
        raise RequestError(f"events: {n} events, the limit is {max_batch} per request")
    known = set(fields)
    dense = np.empty((n, dense_dim), dtype=np.float32)
    ts = np.empty(n, dtype=np.int64)
    lists: dict[str, list] = {f: [None] * n for f in fields}
    for i, ev in enumerate(req.events):
        if len(ev.dense) != dense_dim:
            raise RequestError(f"events[{i}].dense: {len(ev.dense)} values, the model expects {dense_dim}")
        dense[i] = ev.dense
        ts[i] = ev.ts
        for name, ids in ev.sparse.items():
            if name not in known:
                raise RequestError(f"events[{i}].sparse: unknown field {name!r}; model fields: {', '.join(fields)}")
            vals = list(ids.ids)
            if ids.keys:
                vals.extend(hash_id(k) for k in ids.keys)
            lists[name][i] = vals
    if not np.all(np.isfinite(dense)):
        bad = int(np.argwhere(~np.isfinite(dense))[0][0])
        raise RequestError(f"events[{bad}].dense: values must be finite")
    sparse = {f: JaggedIds.from_lists([x if x is not None else () for x in lists[f]]) for f in fields}
    return EventBatch(ts=ts, labels=np.zeros(n, np.float32), dense=dense, sparse=sparse)
