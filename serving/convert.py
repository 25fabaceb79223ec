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


def events_to_request(events: Iterable[Mapping[str, Any]]) -> "pb.PredictRequest":
    req = pb.PredictRequest()
    req.events.extend(event_to_proto(e) for e in events)
    return req


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
