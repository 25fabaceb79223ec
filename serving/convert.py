"""Events <-> protobuf, and a Predict request -> ``streamrec.ingest.EventBatch``.

Validation reuses ``streamrec.ingest.EventSchema`` rules (dense width, known fields, id
hashing) so serving accepts exactly what the trainer accepts; every error names
the offending field, e.g. ``events[3].dense``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from streamrec.foundation import INT64_MAX, INT64_MIN, EventBatch, JaggedIds, StreamrecError, hash_id

from .pb import pb

if TYPE_CHECKING:
    from streamrec.serving.serving_config import ServingConfig


class RequestError(StreamrecError, ValueError):
    """A request field is bad; the message starts with the field's path."""


@dataclass(frozen=True)
class Limits:
    """What one Predict request may hold (``serving.*`` and ``ingest.dense_abs_max``); each is checked
    before the work it bounds (ids are counted before they are copied, hashed or looked up)."""

    max_batch: int = 4096
    max_ids_per_event: int = 1 << 62
    max_ids_per_request: int = 1 << 62
    dense_abs_max: float = 3.4e38

    @classmethod
    def from_serving(cls, serving: "ServingConfig", dense_abs_max: float) -> "Limits":
        """The section's request limits, with ingest's bound on dense values (``ingest.dense_abs_max``)."""
        return cls(serving.max_batch, serving.max_ids_per_event, serving.max_ids_per_request, float(dense_abs_max))


def _limits(limits: "Limits | int") -> "Limits":
    return limits if isinstance(limits, Limits) else Limits(max_batch=int(limits))


def _check_dense(dense: np.ndarray, lim: Limits, where) -> None:
    """Finite and within +-``ingest.dense_abs_max`` (the ingest contract); ``where(event, value)`` names it."""
    ok = np.isfinite(dense) & (np.abs(dense) <= lim.dense_abs_max)
    if not ok.all():
        i, j = (int(x) for x in np.argwhere(~ok)[0])
        x = float(dense[i, j])
        why = "not finite" if not np.isfinite(x) else f"beyond +-ingest.dense_abs_max ({lim.dense_abs_max:g})"
        raise RequestError(f"{where(i, j)}: {x:g} is {why}")


def _event_parts(ev: Any, where: str) -> tuple[int, list, dict]:
    """An event dict's ts, dense list and sparse mapping, their JSON shapes checked (a wrong shape
    raised TypeError/ValueError out of the conversion, a traceback for `streamrec predict`)."""
    if not isinstance(ev, Mapping):
        raise RequestError(f"{where}: must be an object, got {type(ev).__name__}")
    ts = ev.get("ts", 0) or 0
    if type(ts) is not int or not INT64_MIN <= ts <= INT64_MAX:
        raise RequestError(f"{where}.ts: must be an integer (ms since epoch), got {ts!r}")
    dense = ev.get("dense") or []
    if not isinstance(dense, list):
        raise RequestError(f"{where}.dense: must be a list of numbers")
    sparse = ev.get("sparse") or {}
    if not isinstance(sparse, Mapping):
        raise RequestError(f"{where}.sparse: must be an object mapping field name to id or list of ids")
    sparse = dict(sparse)
    for opt in ("user", "item"):
        if opt in ev and opt not in sparse:
            sparse[opt] = ev[opt]
    return ts, dense, sparse


def _dense_f32(values: list, where: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype="<f4")
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.ndim != 1:  # nested lists made a 2-D array that went out flattened
        raise RequestError(f"{where}: values must be numbers")
    return arr


def event_to_proto(ev: Mapping[str, Any], where: str = "event") -> "pb.Event":
    """A plain event dict (the JSON contract) as a proto Event; labels are dropped."""
    ts, dense, sparse = _event_parts(ev, where)
    msg = pb.Event(ts=ts, request_id=str(ev.get("request_id") or ""))
    msg.dense.extend(_dense_f32(dense, f"{where}.dense").tolist())
    for name, v in sparse.items():
        ids = msg.sparse[name]
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str):
                ids.keys.append(x)
            elif isinstance(x, int) and not isinstance(x, bool):
                try:
                    ids.ids.append(hash_id(x))
                except ValueError as e:
                    raise RequestError(f"{where}.sparse.{name}: {e}") from None
            else:
                raise RequestError(f"{where}.sparse.{name}: id {x!r} is not an integer or string")
    return msg


def events_to_request(events: Iterable[Mapping[str, Any]], columns: bool = True) -> "pb.PredictRequest":
    """A Predict request for plain event dicts: column-wise (fast path) or one message per event."""
    events = list(events)
    req = pb.PredictRequest()
    if not columns:
        req.events.extend(event_to_proto(e, f"events[{i}]") for i, e in enumerate(events))
        return req
    c = req.columns
    c.size = len(events)
    dense: list[float] = []
    rids: list[str] = []
    cols: dict[str, tuple[list[int], list[int]]] = {}
    width = 0
    for i, ev in enumerate(events):
        _, d, sparse = _event_parts(ev, f"events[{i}]")
        if i == 0:
            width = len(d)
        elif len(d) != width:  # else values shift into the next event unnoticed
            raise RequestError(f"events[{i}].dense: {len(d)} values, events[0] has {width}")
        dense.extend(d)
        rids.append(str(ev.get("request_id") or ""))
        for name, v in sparse.items():
            vals, lens = cols.setdefault(name, ([], [0] * len(events)))
            vs = v if isinstance(v, list) else [v]
            try:
                vals.extend(hash_id(x) for x in vs)
            except ValueError as e:
                raise RequestError(f"events[{i}].sparse.{name}: {e}") from None
            lens[i] = len(vs)
    try:
        c.dense_f32 = _dense_f32(dense, "dense").tobytes()
    except RequestError:  # find the event (the fast path converts all events at once)
        for i, ev in enumerate(events):
            _dense_f32(ev.get("dense") or [], f"events[{i}].dense")
        raise
    if any(rids):
        c.request_ids.extend(rids)
    for name, (vals, lens) in cols.items():
        col = c.sparse[name]
        col.values_i64 = np.asarray(vals, dtype="<i8").tobytes()
        col.lengths_u32 = np.asarray(lens, dtype="<u4").tobytes()
    return req


def batch_to_request(batch, request_ids=None) -> "pb.PredictRequest":
    """A column-wise Predict request straight from an ``streamrec.ingest.EventBatch`` (no per-event Python)."""
    req = pb.PredictRequest()
    c = req.columns
    n = len(batch.ts)
    c.size = n
    c.dense_f32 = np.ascontiguousarray(batch.dense, dtype="<f4").tobytes()
    for name, j in batch.sparse.items():
        col = c.sparse[name]
        col.values_i64 = np.ascontiguousarray(j.values, dtype="<i8").tobytes()
        col.lengths_u32 = np.diff(j.offsets).astype("<u4").tobytes()
    rids = request_ids if request_ids is not None else getattr(batch, "request_ids", None)
    if rids is not None and any(rids):
        c.request_ids.extend(str(r or "") for r in rids)
    return req


def _from_repeated(values, dtype) -> np.ndarray:
    return np.fromiter(values, dtype=dtype, count=len(values))


def _column(msg, packed: str, raw: str, dtype: str, path: str) -> np.ndarray:
    """One column from its packed-repeated or its raw-bytes form (never both)."""
    blob = getattr(msg, raw)
    rep = getattr(msg, packed)
    if blob:
        if len(rep):
            raise RequestError(f"{path}.{raw}: send {packed} or {raw}, not both")
        size = np.dtype(dtype).itemsize
        if len(blob) % size:
            raise RequestError(f"{path}.{raw}: {len(blob)} bytes is not a whole number of {size}-byte values")
        return np.frombuffer(blob, dtype=dtype)
    return _from_repeated(rep, np.dtype(dtype).newbyteorder("="))


def _count(msg, packed: str, raw: str, size: int) -> int:
    """How many values a column holds, without decoding it."""
    blob = getattr(msg, raw)
    return len(blob) // size if blob else len(getattr(msg, packed))


def _dense_in_bounds(flat: np.ndarray, bound: float) -> bool:
    """All finite and within +-bound, in two reductions and no temporaries (a NaN fails both tests)."""
    return not len(flat) or bool(flat.max() <= bound) and bool(flat.min() >= -bound)


def columns_to_batch(c, fields: list[str], dense_dim: int, limits: "Limits | int") -> tuple[EventBatch, list[str]]:
    """The batch of a column-wise request: each raw-bytes column is read in place (``np.frombuffer`` over
    the one copy the protobuf runtime makes), and every field's offsets come from one ``cumsum`` over all
    fields' lengths at once; no per-event Python object is made (request ids excepted, when sent)."""
    lim = _limits(limits)
    n = int(c.size)
    if n == 0:
        raise RequestError("columns.size: 0; send at least one event")
    if n > lim.max_batch:
        raise RequestError(f"columns.size: {n} events, serving.max_batch allows {lim.max_batch} per request")
    cols = dict(c.sparse)  # one pass over the map: name -> column
    known = set(fields)
    for name in cols:
        if name not in known:
            raise RequestError(f"columns.sparse: unknown field {name!r}; model fields: {', '.join(fields)}")
    total = sum(_count(col, "values", "values_i64", 8) for col in cols.values())
    if total > lim.max_ids_per_request:
        raise RequestError(f"columns.sparse: {total} ids, serving.max_ids_per_request allows {lim.max_ids_per_request}")
    flat = _column(c, "dense", "dense_f32", "<f4", "columns")
    if len(flat) != n * dense_dim:
        name = "dense_f32" if c.dense_f32 else "dense"
        raise RequestError(f"columns.{name}: {len(flat)} values, expected size*dense_dim = {n * dense_dim}")
    if not _dense_in_bounds(flat, lim.dense_abs_max):
        _check_dense(flat.reshape(n, dense_dim), lim, lambda i, j: f"columns.dense: event {i}, value {j}")
    dense = flat.astype(np.float32).reshape(n, dense_dim)  # a writable native copy
    present = [f for f in fields if f in cols]
    # every present field's lengths in one [fields, n + 1] table: one cumsum gives all offsets
    offsets = np.zeros((len(present), n + 1), dtype=np.int64)
    values = []
    for k, f in enumerate(present):
        col = cols[f]
        path = f"columns.sparse[{f}]"
        lengths = _column(col, "lengths", "lengths_u32", "<u4", path)
        if len(lengths) != n:
            raise RequestError(f"{path}.lengths: {len(lengths)} entries, expected {n}")
        offsets[k, 1:] = lengths
        values.append(_column(col, "values", "values_i64", "<i8", path).astype(np.int64, copy=False))
    if present:
        per_event = offsets.sum(axis=0)  # ids of each event over all fields (offsets[:, 0] is 0)
        if int(per_event.max()) > lim.max_ids_per_event:
            i = int(np.argmax(per_event)) - 1
            raise RequestError(f"columns.sparse: event {i} has {int(per_event[i + 1])} ids, serving.max_ids_per_event "
                               f"allows {lim.max_ids_per_event}")
        np.cumsum(offsets, axis=1, out=offsets)
    sparse = {}
    for k, f in enumerate(present):
        if offsets[k, -1] != len(values[k]):
            raise RequestError(f"columns.sparse[{f}].values: {len(values[k])} ids, lengths sum to {int(offsets[k, -1])}")
        sparse[f] = JaggedIds(values[k], offsets[k])
    if len(present) < len(fields):
        empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
        for f in fields:
            sparse.setdefault(f, empty)
    sparse = {f: sparse[f] for f in fields}
    if len(c.request_ids) not in (0, n):
        raise RequestError(f"columns.request_ids: {len(c.request_ids)} entries, expected 0 or {n}")
    if len(c.ts) not in (0, n):
        raise RequestError(f"columns.ts: {len(c.ts)} entries, expected 0 or {n}")
    ts = _from_repeated(c.ts, np.int64) if len(c.ts) else np.zeros(n, np.int64)
    rids = list(c.request_ids) if len(c.request_ids) else []
    return EventBatch(ts=ts, labels=np.zeros(n, np.float32), dense=dense, sparse=sparse), rids


def request_cost(req, fields: list[str], limits: "Limits | int") -> int:
    """Events + ids of a Predict request, counted without copying, hashing or looking up an id; raises
    RequestError for a request over a count limit. Cheap: what a server decides before the real work."""
    lim = _limits(limits)
    if req.HasField("columns"):
        c = req.columns
        n = int(c.size)
        if n > lim.max_batch:
            raise RequestError(f"columns.size: {n} events, serving.max_batch allows {lim.max_batch} per request")
        total = sum(_count(c.sparse[f], "values", "values_i64", 8) for f in c.sparse)
        if total > lim.max_ids_per_request:
            raise RequestError(f"columns.sparse: {total} ids, serving.max_ids_per_request allows {lim.max_ids_per_request}")
        return n + total
    n = len(req.events)
    if n > lim.max_batch:
        raise RequestError(f"events: {n} events, serving.max_batch allows {lim.max_batch} per request")
    total = 0
    for i, ev in enumerate(req.events):
        in_event = 0
        for ids in ev.sparse.values():
            in_event += len(ids.ids) + len(ids.keys)
        if in_event > lim.max_ids_per_event:
            raise RequestError(f"events[{i}].sparse: more than {lim.max_ids_per_event} ids in one event "
                               f"(serving.max_ids_per_event)")
        total += in_event
        if total > lim.max_ids_per_request:
            raise RequestError(f"events: more than {lim.max_ids_per_request} ids by events[{i}] "
                               f"(serving.max_ids_per_request)")
    return n + total


def request_to_batch_ids(req, fields: list[str], dense_dim: int,
                         limits: "Limits | int") -> tuple[EventBatch, list[str]]:
    """The batch of a Predict request (either form) and the request ids to echo ([] when none was given).

    ``limits``: a :class:`Limits` (or just ``max_batch``, the other limits off)."""
    has_cols = req.HasField("columns")
    if has_cols and len(req.events):
        raise RequestError("events: send either events or columns, not both")
    if has_cols:
        return columns_to_batch(req.columns, fields, dense_dim, limits)
    batch = request_to_batch(req, fields, dense_dim, limits)
    rids = [e.request_id for e in req.events]
    return batch, rids if any(rids) else []


def request_to_batch(req: "pb.PredictRequest", fields: list[str], dense_dim: int, limits: "Limits | int") -> EventBatch:
    """Validate a Predict request against the served model and build its batch."""
    lim = _limits(limits)
    n = len(req.events)
    if n == 0:
        raise RequestError("events: empty; send at least one event")
    if n > lim.max_batch:
        raise RequestError(f"events: {n} events, serving.max_batch allows {lim.max_batch} per request")
    known = set(fields)
    dense = np.empty((n, dense_dim), dtype=np.float32)
    ts = np.empty(n, dtype=np.int64)
    lists: dict[str, list] = {f: [None] * n for f in fields}
    total = 0
    for i, ev in enumerate(req.events):
        if len(ev.dense) != dense_dim:
            raise RequestError(f"events[{i}].dense: {len(ev.dense)} values, the model expects {dense_dim}")
        dense[i] = ev.dense
        ts[i] = ev.ts
        in_event = 0
        for name, ids in ev.sparse.items():
            if name not in known:
                raise RequestError(f"events[{i}].sparse: unknown field {name!r}; model fields: {', '.join(fields)}")
            in_event += len(ids.ids) + len(ids.keys)  # counted before they are copied or hashed
            if in_event > lim.max_ids_per_event:
                raise RequestError(f"events[{i}].sparse: more than {lim.max_ids_per_event} ids in one event "
                                   f"(serving.max_ids_per_event)")
            if total + in_event > lim.max_ids_per_request:
                raise RequestError(f"events: more than {lim.max_ids_per_request} ids by events[{i}] "
                                   f"(serving.max_ids_per_request)")
            vals = list(ids.ids)
            if ids.keys:
                vals.extend(hash_id(k) for k in ids.keys)
            lists[name][i] = vals
        total += in_event
    _check_dense(dense, lim, lambda i, j: f"events[{i}].dense[{j}]")
    sparse = {f: JaggedIds.from_lists([x if x is not None else () for x in lists[f]]) for f in fields}
    return EventBatch(ts=ts, labels=np.zeros(n, np.float32), dense=dense, sparse=sparse)
