"""Wire forms of events: one JSON object per message, or an Arrow IPC stream of many.

The Arrow form is the fast path: a record batch with columns ``ts`` (int64),
``label`` (float32), ``dense`` (fixed-size list of float32; absent when the model has no dense features), one ``list<int64>``
column per sparse field, and an optional ``request_id`` (string). Decoding
sniffs the form from the first byte, so one topic may carry both.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamrec.foundation import INT64_MAX, EventBatch, EventError, EventSchema, JaggedIds

try:  # orjson parses ~3x faster than the standard library; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

CODEC_HEADER = "streamrec-codec"
ARROW = "arrow"
JSON = "json"


def arrow_schema(schema: EventSchema) -> pa.Schema:
    cols = [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("label", pa.float32(), nullable=False),
    ]
    if schema.dense_dim:  # no dense column when the model has no dense features
        cols.append(pa.field("dense", pa.list_(pa.float32(), schema.dense_dim)))
    cols += [pa.field(f, pa.list_(pa.int64())) for f in schema.fields]
    cols.append(pa.field("request_id", pa.string()))
    return pa.schema(cols)


def batch_to_arrow(batch: EventBatch, schema: EventSchema) -> pa.RecordBatch:
    n = len(batch)
    arrays = [
        pa.array(batch.ts, type=pa.int64()),
        pa.array(batch.labels, type=pa.float32()),
    ]
    if schema.dense_dim:
        dense_flat = pa.array(np.ascontiguousarray(batch.dense, dtype=np.float32).reshape(-1), type=pa.float32())
        arrays.append(pa.FixedSizeListArray.from_arrays(dense_flat, schema.dense_dim))
    for f in schema.fields:
        j = batch.sparse[f]
        arrays.append(
            pa.ListArray.from_arrays(pa.array(j.offsets.astype(np.int32), pa.int32()), pa.array(j.values, pa.int64()))
        )
    rids = batch.request_ids if batch.request_ids is not None else [None] * n
    arrays.append(pa.array(rids, type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema))


def encode_arrow(batch: EventBatch, schema: EventSchema) -> bytes:
    """One Arrow IPC stream (schema + one record batch) holding every event of ``batch``."""
    rb = batch_to_arrow(batch, schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


def _loads_json(value: bytes) -> Any:
    try:
        if _orjson is not None:
            return _orjson.loads(value)
        return json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise EventError(f"bad JSON: {e}") from None
    except RecursionError:  # deeply nested arrays/objects: one record must not stop the consumer
        raise EventError("bad JSON: nested too deeply") from None


def encode_json(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode("utf-8")


def encode_json_batch(batch: EventBatch) -> list[bytes]:
    return [encode_json(ev) for ev in batch.to_events()]


def _list_column(col: pa.Array, name: str) -> JaggedIds:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_large_list(col.type) or pa.types.is_list(col.type):
        pass
    else:
        raise EventError(f"column {name!r} must be a list of int64 ids, got {col.type}")
    if col.null_count:
        raise EventError(f"column {name!r} has null id lists")
    if not pa.types.is_integer(col.type.value_type):
        raise EventError(f"column {name!r} must hold integer ids, got {col.type.value_type}")
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    values = values[offsets[0] : offsets[-1]]
    if offsets[0]:
        offsets = offsets - offsets[0]
    if col.values.null_count:
        raise EventError(f"column {name!r} has null ids")
    return JaggedIds(values, offsets)


class Decoder:
    """Turns Kafka record values into validated columnar batches or raises EventError."""

    def __init__(self, schema: EventSchema):
        self.schema = schema

    def decode(self, value: bytes | None) -> EventBatch:
        if not value:
            raise EventError("empty message")
        first = value.lstrip()[:1]
        if first == b"{":
            return self.decode_json(value)
        if value[:4] == b"\xff\xff\xff\xff":
            return self.decode_arrow(value)
        raise EventError("message is neither a JSON object nor an Arrow IPC stream")

    def decode_json(self, value: bytes) -> EventBatch:
        return self.schema.batch_from_parsed([self.schema.validate(_loads_json(value))])

    def decode_many(self, values: Sequence[bytes | None]) -> tuple[EventBatch | None, list[tuple[int, str]]]:
        """Decode many record values into one batch, in order; bad ones come back as ``(index, reason)``.

        JSON records are validated one by one but built into columns together
        (one numpy call per column instead of a 1-row batch per record), so the
        JSON path costs little more than the JSON parse itself.
        """
        segments: list[EventBatch] = []
        rows: list = []
        errors: list[tuple[int, str]] = []
        tables: list[tuple[int, pa.Table]] = []  # consecutive Arrow records, decoded together
        validate = self.schema.validate
        for i, v in enumerate(values):
            if not v:
                errors.append((i, "empty message"))
                continue
            first = v[:1]
            if first == b"{" or (first in b" \t\r\n" and v.lstrip()[:1] == b"{"):
                if tables:  # keep arrival order: Arrow records before this one first
                    self._flush_tables(tables, segments, errors)
                try:
                    rows.append(validate(_loads_json(v)))
                except EventError as e:
                    errors.append((i, str(e)))
            elif v[:4] == b"\xff\xff\xff\xff":
                try:
                    t = self._read_arrow(v)
                except EventError as e:
                    errors.append((i, str(e)))
                    continue
                if rows:
                    segments.append(self.schema.batch_from_parsed(rows))
                    rows = []
                tables.append((i, t))
                continue
            else:
                errors.append((i, "message is neither a JSON object nor an Arrow IPC stream"))
        if tables:
            self._flush_tables(tables, segments, errors)
        if rows:
            segments.append(self.schema.batch_from_parsed(rows))
        errors.sort()
        if not segments:
            return None, errors
        if len(segments) == 1:
            return segments[0], errors
        return EventBatch.concat(segments, self.schema.dense_dim, self.schema.fields), errors

    def _read_arrow(self, value: bytes) -> pa.Table:
        try:
            return pa.ipc.open_stream(pa.py_buffer(value)).read_all()
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            raise EventError(f"bad Arrow IPC stream: {e}") from None

    def decode_arrow(self, value: bytes) -> EventBatch:
        return self.batch_from_table(self._read_arrow(value))

    def _flush_tables(self, tables: list, segments: list, errors: list) -> None:
        """Decode consecutive Arrow records as one table (one numpy pass per column);
        if that fails, decode them one by one so each bad record gets its own reason."""
        if len(tables) > 1:
            try:
                segments.append(self.batch_from_table(pa.concat_tables([t for _, t in tables])))
                tables.clear()
                return
            except (EventError, pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        for i, t in tables:
            try:
                segments.append(self.batch_from_table(t))
            except EventError as e:
                errors.append((i, str(e)))
        tables.clear()

    def batch_from_table(self, table: pa.Table | pa.RecordBatch) -> EventBatch:
        s = self.schema
        names = set(table.schema.names)
        allowed = {"ts", "label", "dense", "request_id", *s.fields}
        extra = names - allowed
        if extra:
            raise EventError(f"unknown column {sorted(extra)[0]!r}; model fields: {', '.join(s.fields)}")
        n = table.num_rows

        def col(name: str) -> pa.Array:
            c = table.column(name)
            return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c

        if "label" not in names:
            if s.require_label:
                raise EventError("missing label column")
            labels = np.zeros(n, np.float32)
        else:
            lc = col("label")
            if lc.null_count and s.require_label:
                raise EventError("missing label (null) in label column")
            if not (pa.types.is_floating(lc.type) or pa.types.is_integer(lc.type)):
                raise EventError(f"label must be numeric, got {lc.type}")
            labels = lc.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            labels = np.nan_to_num(labels, nan=0.0) if lc.null_count else labels
            if n and not (labels.min() >= 0 and labels.max() <= 1):  # written so that NaN fails too
                raise EventError("label must be in [0, 1]")
        if "ts" in names:
            tc = col("ts")
            if not pa.types.is_integer(tc.type) or tc.null_count:
                raise EventError(f"ts must be non-null int64, got {tc.type}")
            if pa.types.is_uint64(tc.type) and n and pc.max(tc).as_py() > INT64_MAX:
                # astype(int64) wrapped these to negative times; JSON refuses ts beyond int64 too
                raise EventError(f"ts must be an integer (ms since epoch) within int64, got {pc.max(tc).as_py()}")
            ts = tc.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        else:
            ts = np.zeros(n, np.int64)
        if s.dense_dim:
            if "dense" not in names:
                raise EventError(f"missing dense column (model expects {s.dense_dim} values)")
            dc = col("dense")
            if dc.null_count:
                raise EventError("dense has null rows")
            vt = getattr(dc.type, "value_type", None)
            if vt is not None and not (pa.types.is_floating(vt) or pa.types.is_integer(vt)):
                # strings/structs made the float32 conversion below raise ValueError/TypeError
                raise EventError(f"dense must be a list of numbers, got {dc.type}")
            if pa.types.is_fixed_size_list(dc.type):
                width = dc.type.list_size
                flat = dc.values.to_numpy(zero_copy_only=False)
                flat = flat[dc.offset * width : (dc.offset + n) * width]
            elif pa.types.is_list(dc.type) or pa.types.is_large_list(dc.type):
                lens = np.diff(dc.offsets.to_numpy())
                if n and not np.all(lens == s.dense_dim):
                    bad = int(lens[lens != s.dense_dim][0])
                    raise EventError(f"dense has {bad} values, the model expects {s.dense_dim}")
                width = s.dense_dim
                off = dc.offsets.to_numpy()
                flat = dc.values.to_numpy(zero_copy_only=False)[off[0] : off[-1]]
            else:
                raise EventError(f"dense must be a list of float32, got {dc.type}")
            if width != s.dense_dim:
                raise EventError(f"dense has {width} values, the model expects {s.dense_dim}")
            dense = np.asarray(flat, dtype=np.float32).reshape(n, s.dense_dim)
            if not np.isfinite(dense).all():  # NaN/inf (null values read as NaN) would poison training
                row = int(np.argwhere(~np.isfinite(dense))[0][0])
                raise EventError(f"dense values must be finite float32 numbers (row {row})")
        else:
            if "dense" in names:  # tolerated when every row is empty
                dc = col("dense")
                if pa.types.is_fixed_size_list(dc.type):
                    width = dc.type.list_size if n else 0
                elif pa.types.is_list(dc.type) or pa.types.is_large_list(dc.type):
                    width = int(pc.max(pc.list_value_length(dc)).as_py() or 0) if n else 0
                else:
                    raise EventError(f"dense must be a list of float32, got {dc.type}")
                if width:
                    raise EventError(f"dense has {width} values, the model expects 0")
            dense = np.zeros((n, 0), np.float32)
        sparse = {}
        empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
        for f in s.fields:
            sparse[f] = _list_column(col(f), f) if f in names else empty
        rids = None
        if "request_id" in names:
            rc = col("request_id")
            if rc.null_count < n:
                rids = rc.to_pylist()
                if not (pa.types.is_string(rc.type) or pa.types.is_large_string(rc.type)):
                    # non-string ids (ints...) became str in JSON but stayed ints here: convert the same way
                    rids = [None if r is None else str(r) for r in rids]
        return EventBatch(ts=ts, labels=labels, dense=dense, sparse=sparse, request_ids=rids)


def events_to_arrow_messages(
    batch: EventBatch, schema: EventSchema, events_per_message: int
) -> Iterable[bytes]:
    """Split a batch into Arrow IPC messages of at most ``events_per_message`` events."""
    n = len(batch)
    for start in range(0, n, events_per_message):
        rows = np.arange(start, min(n, start + events_per_message))
        yield encode_arrow(batch.take(rows) if (start or len(rows) < n) else batch, schema)


def encode_messages(batch: EventBatch, schema: EventSchema, codec: str, events_per_message: int) -> Sequence[bytes]:
    if codec == ARROW:
        return list(events_to_arrow_messages(batch, schema, events_per_message))
    if codec == JSON:
        return encode_json_batch(batch)
    raise ValueError(f"unknown codec {codec!r}; expected 'arrow' or 'json'")
