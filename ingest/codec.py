"""Wire forms of events: one JSON object per message, or an Arrow IPC stream of many.

The Arrow form is the fast path: a record batch with columns ``ts`` (int64),
``label`` (float32), ``dense`` (fixed-size list of float32; absent when the model has no dense features), one ``list<int64>``
column per sparse field, an optional ``request_id`` (string), an optional ``feedback`` (string or
dictionary of strings: the event's feedback kind, null = plain), and an optional ``labels``
(struct with one nullable float32 child per task, named as the task; null = missing, and
``label``, the first task's, may then be null or absent). Decoding sniffs the form from
the first byte, so one topic may carry both.

Whatever the bytes, decoding one record raises nothing but :class:`EventError`
(the dead-letter path's business): anything else going wrong inside is turned
into an EventError naming the exception's type, so no record can stop a
consumer. An Arrow stream is checked before any of its data is touched: its
column names and types as soon as its schema is read, then every record batch
in full (``validate(full=True)``: offsets, buffer sizes, UTF-8), as Arrow's
guidance for untrusted IPC data says; a crafted message cannot make the
reader, numpy or Python read outside its buffers, and a compressed record
batch may not decompress to more than 64 times its message (16 MiB at least).
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any, Callable, Iterable, Sequence, get_args

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from streamrec.foundation import FEEDBACK_NAMES, INT64_MAX, EventBatch, EventError, EventSchema, JaggedIds

from .ingest_types import Codec
from .json_columns import decode_json_columns
from .label_columns import (check_feedback_type, check_labels_type, feedback_column, is_number, show_type,
                            task_label_columns, with_nulls)

CODEC_HEADER = "streamrec-codec"
ARROW = "arrow"
JSON = "json"

_ARROW_MAGIC = b"\xff\xff\xff\xff"  # an IPC stream's first message starts with the continuation marker
_NEITHER = "message is neither a JSON object nor an Arrow IPC stream"
_MAX_SCHEMAS = 64  # schema messages already checked, remembered by their bytes
# a compressed (LZ4/ZSTD) record batch may declare at most this much once decompressed: zeros compress
# ~30,000:1, so a 1 MB message could otherwise make the reader allocate and fill ~30 GB
_MAX_INFLATE, _MIN_INFLATE_CAP = 64, 16 << 20  # x the message's size, but always 16 MiB
_COLUMNS_MIN = 32  # records from which decode_many tries the columnar JSON path first (json_columns.py)
_ISOLATE_FAILURES = 24  # refused pieces after which Decoder._isolate stops halving (not a few bad records)


def is_arrow(value: bytes | None) -> bool:
    """Whether a record value is in the Arrow form (starts as an IPC stream does), not one JSON object."""
    return bool(value) and value[:4] == _ARROW_MAGIC


def _why(e: BaseException) -> str:
    """An unexpected exception as a dead-letter reason: its type, then the start of its message."""
    try:
        msg = " ".join(str(e).split())
    except Exception:  # a message that cannot even be printed
        msg = ""
    if len(msg) > 200:
        msg = msg[:200] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _contained(what: str, fn: Callable, *args) -> Any:
    """``fn(*args)``, with any exception but an EventError turned into one naming its type."""
    try:
        return fn(*args)
    except EventError:
        raise
    except Exception as e:  # a library's own error, a bug, MemoryError, RecursionError: one record's failure
        raise EventError(f"{what} failed ({_why(e)})") from None


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


_U16, _U32, _I32, _I64, _BUFFER = (struct.Struct(f) for f in ("<H", "<I", "<i", "<q", "<qq"))


def _fb_field(buf, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` is, or None when absent."""
    vtable = table - _I32.unpack_from(buf, table)[0]
    slot = 4 + 2 * index
    if slot + 2 > _U16.unpack_from(buf, vtable)[0]:
        return None
    off = _U16.unpack_from(buf, vtable + slot)[0]
    return table + off if off else None


def _inflated_size(m: pa.ipc.Message) -> int | None:
    """Bytes a record batch message's compressed body declares once decompressed (None: not compressed).

    Read from the message's own metadata (Message.header -> RecordBatch.compression and .buffers, as
    in Arrow's Message.fbs; Arrow verified the flatbuffer when it read the message) and the int64
    length before each compressed buffer: pyarrow has no option to bound decompression.
    """
    meta = m.metadata
    header = _fb_field(meta, _U32.unpack_from(meta, 0)[0], 2)  # Message: version, header_type, header
    if header is None:
        return None
    batch = header + _U32.unpack_from(meta, header)[0]
    if _fb_field(meta, batch, 3) is None:  # RecordBatch: length, nodes, buffers, compression
        return None
    buffers = _fb_field(meta, batch, 2)
    if buffers is None:
        return None
    vec = buffers + _U32.unpack_from(meta, buffers)[0]
    body = m.body
    total = 0
    for k in range(_U32.unpack_from(meta, vec)[0]):
        offset, length = _BUFFER.unpack_from(meta, vec + 4 + 16 * k)
        if length > 0:  # an int64 uncompressed length first (-1: this buffer is stored as it is)
            total += max(0, _I64.unpack_from(body, offset)[0], length - 8)
    return total


def labels_type(schema: EventSchema) -> pa.StructType:
    """The ``labels`` column's type: one nullable float32 child per task, in task order."""
    return pa.struct([pa.field(t, pa.float32(), nullable=True) for t in schema.tasks])


def arrow_schema(schema: EventSchema, with_labels: bool | None = None, with_feedback: bool = False) -> pa.Schema:
    """The Arrow wire columns; ``labels`` (and a nullable ``label``) when ``with_labels``, by default when
    the model has several tasks; ``feedback`` (string, null = plain) when ``with_feedback``."""
    if with_labels is None:
        with_labels = len(schema.tasks) > 1
    cols = [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("label", pa.float32(), nullable=with_labels),
    ]
    if with_labels:
        cols.append(pa.field("labels", labels_type(schema)))
    if schema.dense_dim:  # no dense column when the model has no dense features
        cols.append(pa.field("dense", pa.list_(pa.float32(), schema.dense_dim)))
    cols += [pa.field(f, pa.list_(pa.int64())) for f in schema.fields]
    cols.append(pa.field("request_id", pa.string()))
    if with_feedback:
        cols.append(pa.field("feedback", pa.string()))
    return pa.schema(cols)


def batch_to_arrow(batch: EventBatch, schema: EventSchema, with_labels: bool | None = None) -> pa.RecordBatch:
    """The batch in the Arrow wire columns; with ``labels`` when ``with_labels``, by default when the batch
    has ``task_labels`` or the model several tasks (``label`` is then null where the first task's is missing);
    with ``feedback`` when the batch has it."""
    n = len(batch)
    if with_labels is None:
        with_labels = batch.task_labels is not None or len(schema.tasks) > 1
    if with_labels:
        matrix = batch.label_matrix(len(schema.tasks))
        missing = np.isnan(matrix)
        arrays = [
            pa.array(batch.ts, type=pa.int64()),
            pa.array(batch.labels, type=pa.float32(), mask=missing[:, 0]),
            pa.StructArray.from_arrays(
                [pa.array(matrix[:, k], type=pa.float32(), mask=missing[:, k]) for k in range(matrix.shape[1])],
                fields=list(labels_type(schema))),
        ]
    else:
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
    if batch.feedback is not None:
        names = np.array([None, *(FEEDBACK_NAMES[c] for c in range(1, len(FEEDBACK_NAMES) + 1))], dtype=object)
        arrays.append(pa.array(names[batch.feedback.astype(np.int64)], type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(schema, with_labels, batch.feedback is not None))


_LABEL_COLUMNS = ("label", "labels", "feedback")  # what an unlabelled event (an impression) never carries


def encode_arrow(batch: EventBatch, schema: EventSchema, labelled: bool = True) -> bytes:
    """One Arrow IPC stream (schema + one record batch) holding every event of ``batch``; with ``labelled``
    false the same columns without ``label``, ``labels`` and ``feedback`` (unlabelled events: the joiner's
    impressions, read by a ``Decoder(..., unlabelled=True)``)."""
    rb = batch_to_arrow(batch, schema)
    if not labelled:
        rb = rb.select([n for n in rb.schema.names if n not in _LABEL_COLUMNS])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


def _loads_json(value: bytes) -> Any:
    """Parse one record with orjson (a declared dependency): with string or integer ids it parses an event
    in about half the standard library's time and makes the dicts the validator reads fastest (msgspec
    parses as fast, but validation over its objects is slower; ``streamrec bench e2e`` shows the whole
    path). What orjson refuses is parsed again by the standard library, which is more lenient (NaN and
    Infinity literals, lone surrogates, a byte-order mark): the record is then refused (or taken) exactly as
    before orjson, by the validator, with a reason naming the field."""
    try:
        return orjson.loads(value)
    except Exception:  # the rare bad record: its reason (or acceptance) comes from the standard parser
        pass
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise EventError(f"bad JSON: {e}") from None
    except RecursionError:  # deeply nested arrays/objects: one record must not stop the consumer
        raise EventError("bad JSON: nested too deeply") from None
    except Exception as e:  # MemoryError, a parser's own error type...: still only this record's failure
        raise EventError(f"bad JSON ({_why(e)})") from None


def encode_json(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode("utf-8")


def encode_json_batch(batch: EventBatch, tasks: Sequence[str] | None = None) -> list[bytes]:
    """One JSON message per event (``tasks``: the names of ``task_labels``' columns, when the batch lacks them)."""
    return [encode_json(ev) for ev in batch.to_events(tasks)]


def _list_column(col: pa.Array, name: str) -> JaggedIds:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not _is_list(col.type):
        raise EventError(f"column {name!r} must be a list of int64 ids, got {col.type}")
    if col.null_count:
        raise EventError(f"column {name!r} has null id lists")
    if not pa.types.is_integer(col.type.value_type):
        raise EventError(f"column {name!r} must hold integer ids, got {col.type.value_type}")
    if col.values.null_count:  # before the conversion: nulls would come back as NaN, cast to garbage ids
        raise EventError(f"column {name!r} has null ids")
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    values = values[offsets[0] : offsets[-1]]
    if offsets[0]:
        offsets = offsets - offsets[0]
    return JaggedIds(values, offsets)


_Stream = tuple  # (pa.Schema, list[pa.RecordBatch]): one Arrow record, read and checked


def _as_table(stream: _Stream) -> pa.RecordBatch | pa.Table:
    schema, batches = stream
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches, schema)


class Decoder:
    """Turns Kafka record values into validated columnar batches or raises EventError.

    Nothing else ever comes out of :meth:`decode`, :meth:`decode_json`,
    :meth:`decode_arrow` or :meth:`batch_from_table` for a bad record, and
    :meth:`decode_many` reports each bad record by its index and reason.
    """

    def __init__(self, schema: EventSchema, unlabelled: bool = False):
        self.schema = schema
        self._columns = frozenset({"ts", "label", "labels", "dense", "request_id", "feedback", *schema.fields})
        # unlabelled events (the joiner's impressions): a label, labels or feedback column is refused by name
        self._refused = frozenset(_LABEL_COLUMNS) if unlabelled else frozenset()
        self._schemas_ok: dict[bytes, pa.Schema] = {}  # schema messages whose columns passed _check_columns
        self._columns_failed = False  # the last JSON batch was refused as columns, beyond a few bad records

    def decode(self, value: bytes | None) -> EventBatch:
        return _contained("decoding", self._decode, value)

    def _decode(self, value: bytes | None) -> EventBatch:
        if not value:
            raise EventError("empty message")
        if value.lstrip()[:1] == b"{":
            return self._decode_json(value)
        if value[:4] == _ARROW_MAGIC:
            return self._decode_arrow(value)
        raise EventError(_NEITHER)

    def decode_json(self, value: bytes) -> EventBatch:
        return _contained("decoding JSON", self._decode_json, value)

    def _decode_json(self, value: bytes) -> EventBatch:
        return self.schema.batch_from_parsed([self.schema.validate(_loads_json(value))])

    def decode_arrow(self, value: bytes) -> EventBatch:
        return _contained("decoding Arrow", self._decode_arrow, value)

    def _decode_arrow(self, value: bytes) -> EventBatch:
        return self._batch_from_table(_as_table(self._read_arrow(value)))

    def decode_many(self, values: Sequence[bytes | None]) -> tuple[EventBatch | None, list[tuple[int, str]]]:
        """Decode many record values into one batch, in order; bad ones come back as ``(index, reason)``.

        Many JSON records of the common shape, all valid, are parsed straight into
        columns (``json_columns.decode_json_columns``: Arrow's JSON reader, the
        validator's checks once per column), a fraction of the CPU of the path that
        follows (``streamrec bench ingest``); any other batch takes that path,
        so each bad record is named.
        There, JSON records are validated one by one but built into columns together
        (one numpy call per column instead of a 1-row batch per record), so the
        JSON path costs little more than the JSON parse itself. Consecutive Arrow
        records are read and checked one by one, then decoded as one table. When
        such a batched step fails, its records are done again one by one, so the
        bad record alone is reported, with its own reason. A JSON batch refused as
        columns right after one that was taken is halved to find its few bad records
        (:meth:`_isolate`) rather than sent record by record whole. Never raises for
        a record.
        """
        if len(values) >= _COLUMNS_MIN:  # the common case: many valid one-event JSON records, parsed as columns
            batch = self._as_columns(values)
            if batch is not None:
                self._columns_failed = False
                return batch, []
            if not self._columns_failed and len(values) >= 2 * _COLUMNS_MIN:
                return self._isolate(values)
            self._columns_failed = True
        return self._decode_records(values)

    def _as_columns(self, values: Sequence) -> EventBatch | None:
        try:
            return decode_json_columns(self.schema, values)
        except Exception:  # never the caller's problem: the record-by-record path decides
            return None

    def _isolate(self, values: Sequence) -> tuple[EventBatch | None, list[tuple[int, str]]]:
        """A batch the columnar path refused, after a batch it took: most likely a few bad records among
        good ones, so find them by halving (each half columnar again) and decode record by record only the
        pieces under ``2 * _COLUMNS_MIN`` records that hold them -- k bad records in n cost about
        ``2 k log2(n / 64)`` columnar passes over shrinking pieces instead of the whole batch record by
        record (several times the columnar CPU). At most ``_ISOLATE_FAILURES`` pieces may fail: past that the refusal
        is not a few records (a producer of another shape, say), what is left goes record by record, and
        later batches try the whole batch once until one decodes as columns again. The result
        is the record-by-record path's: the same events in order, the same errors, by index."""
        segments: list[EventBatch] = []
        errors: list[tuple[int, str]] = []
        failures = 0

        def records(lo: int, hi: int) -> None:
            b, errs = self._decode_records(values[lo:hi])
            if b is not None and len(b):
                segments.append(b)
            errors.extend((lo + i, why) for i, why in errs)

        def piece(lo: int, hi: int) -> None:  # values[lo:hi], refused by the columnar path
            nonlocal failures
            if hi - lo < 2 * _COLUMNS_MIN or failures >= _ISOLATE_FAILURES:
                records(lo, hi)
                return
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid, hi)):
                got = self._as_columns(values[a:b]) if failures < _ISOLATE_FAILURES else None
                if got is not None:
                    segments.append(got)
                    continue
                failures += 1
                piece(a, b)

        piece(0, len(values))
        if failures >= _ISOLATE_FAILURES:
            self._columns_failed = True
        return self._joined(segments, errors)

    def _decode_records(self, values: Sequence) -> tuple[EventBatch | None, list[tuple[int, str]]]:
        """Record by record (JSON rows validated one by one, built together; Arrow tables together)."""
        segments: list[EventBatch] = []
        rows: list = []
        row_at: list[int] = []  # the index of each of rows
        errors: list[tuple[int, str]] = []
        tables: list[tuple[int, _Stream]] = []  # consecutive Arrow records, decoded together
        validate = self.schema.validate
        for i, v in enumerate(values):
            try:
                if not v:
                    errors.append((i, "empty message"))
                    continue
                first = v[:1]
                if first == b"{" or (first in b" \t\r\n" and v.lstrip()[:1] == b"{"):
                    if tables:  # keep arrival order: Arrow records before this one first
                        self._flush_tables(tables, segments, errors)
                    rows.append(validate(_loads_json(v)))
                    row_at.append(i)
                elif v[:4] == _ARROW_MAGIC:
                    t = self._read_arrow(v)
                    if rows:
                        self._flush_rows(rows, row_at, segments, errors)
                    tables.append((i, t))
                else:
                    errors.append((i, _NEITHER))
            except EventError as e:
                errors.append((i, str(e)))
            except Exception as e:  # the flushes above never raise: this is record i's own failure
                errors.append((i, f"decoding failed ({_why(e)})"))
        if tables:
            self._flush_tables(tables, segments, errors)
        if rows:
            self._flush_rows(rows, row_at, segments, errors)
        return self._joined(segments, errors)

    def _joined(self, segments: list[EventBatch], errors: list[tuple[int, str]]) -> tuple[EventBatch | None, list]:
        """The decoded segments as one batch (None: none), and the errors in record order."""
        errors.sort()
        if not segments:
            return None, errors
        if len(segments) == 1:
            return segments[0], errors
        return EventBatch.concat(segments, self.schema.dense_dim, self.schema.fields), errors

    def _flush_rows(self, rows: list, row_at: list[int], segments: list, errors: list) -> None:
        """Build validated JSON rows into one batch; if that fails, row by row (each bad row named)."""
        build = self.schema.batch_from_parsed
        try:
            segments.append(build(rows))
        except Exception:
            for i, r in zip(row_at, rows):
                try:
                    segments.append(build([r]))
                except Exception as e:
                    errors.append((i, str(e) if isinstance(e, EventError) else f"decoding failed ({_why(e)})"))
        rows.clear()
        row_at.clear()

    def _flush_tables(self, tables: list, segments: list, errors: list) -> None:
        """Decode consecutive Arrow records as one table (one numpy pass per column);
        if that fails, decode them one by one so each bad record gets its own reason."""
        if len(tables) > 1:
            try:  # one table of every record batch: refused unless all schemas are the same
                joined = pa.Table.from_batches([b for _, (_, batches) in tables for b in batches], tables[0][1][0])
                segments.append(self._batch_from_table(joined))
                tables.clear()
                return
            except Exception:  # schemas that differ, one bad record among them, ...: one by one
                pass
        for i, t in tables:
            try:
                segments.append(self._batch_from_table(_as_table(t)))
            except EventError as e:
                errors.append((i, str(e)))
            except Exception as e:
                errors.append((i, f"decoding Arrow failed ({_why(e)})"))
        tables.clear()

    # -- Arrow --------------------------------------------------------------

    def _read_arrow(self, value: bytes) -> _Stream:
        """Read one IPC stream, checking it before any of its data is used: the columns (names, types)
        when the schema is read, then every record batch in full, right after it is read. Returns the
        schema and the record batches; raises EventError only.

        Message by message (what ``pa.ipc.open_stream`` does inside): so a schema already checked,
        remembered by its message's bytes, is neither parsed nor checked again (one per producer,
        usually), which pays for the full validation.
        """
        buf = pa.py_buffer(value)
        end = 8 + int.from_bytes(value[4:8], "little", signed=True)  # the schema message (no body)
        key = value[:end]
        schema = self._schemas_ok.get(key)
        try:
            if schema is None:
                messages = pa.ipc.MessageReader.open_stream(buf)
                first = messages.read_next_message()
                if first.type != "schema":
                    raise EventError(f"bad Arrow IPC stream: starts with a {first.type} message, not a schema")
                schema = pa.ipc.read_schema(first)
                self._check_columns(schema)
                if (first.body is None or first.body.size == 0) and end > 8:
                    if len(self._schemas_ok) >= _MAX_SCHEMAS:
                        self._schemas_ok.clear()
                    self._schemas_ok[key] = schema
            else:
                messages = pa.ipc.MessageReader.open_stream(buf.slice(end))
            batches = []
            room = len(value)  # bytes the data may take: the message, or what its compressed batches declare
            for m in messages:
                if m.type != "record batch":  # no dictionaries (refused columns), no second schema, tensors
                    raise EventError(f"bad Arrow IPC stream: unexpected {m.type} message")
                inflated = _inflated_size(m)
                if inflated is not None and inflated > max(_MAX_INFLATE * len(value), _MIN_INFLATE_CAP):
                    raise EventError(f"bad Arrow IPC stream: a compressed record batch would decompress to "
                                     f"{inflated} bytes, from a {len(value)}-byte message")
                room += inflated or 0
                b = pa.ipc.read_record_batch(m, schema)
                b.validate(full=True)  # offsets within bounds, buffers as large as claimed, valid UTF-8
                batches.append(b)
        except EventError:
            raise
        except Exception as e:
            raise EventError(f"bad Arrow IPC stream: {self._invalid(e, schema)}") from None
        rows = batches[0].num_rows if len(batches) == 1 else sum(b.num_rows for b in batches)
        if rows > room:  # no column holds the rows' data (only all-null ones, say)
            raise EventError(f"bad Arrow IPC stream: {rows} rows claimed in a {len(value)}-byte message")
        return schema, batches

    @staticmethod
    def _invalid(e: Exception, schema: pa.Schema | None) -> str:
        """Why a stream failed to read or validate, naming the column when Arrow gives its index."""
        why = _why(e)
        m = re.search(r"(?:In c|C)olumn (\d+): (?:In chunk \d+: )?(.*)", why)
        if m is None or schema is None or not int(m.group(1)) < len(schema):
            return why
        name, detail = schema.names[int(m.group(1))], m.group(2)
        if "UTF8" in detail or "UTF-8" in detail:
            return f"column {name!r} holds invalid UTF-8 string data ({detail})"
        return f"column {name!r}: {detail}"

    def _check_columns(self, schema: pa.Schema) -> None:
        """Names and types of an Arrow table's columns, before any of its buffers is read."""
        s = self.schema
        try:
            names = schema.names
        except UnicodeDecodeError:
            raise EventError("a column name is not valid UTF-8") from None
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise EventError(f"duplicate column {dup!r}")
        refused = [n for n in names if n in self._refused]
        if refused:
            raise EventError(f"column {refused[0]!r}: these events carry no label or feedback kind")
        extra = [n for n in names if n not in self._columns]
        if extra:
            raise EventError(f"unknown column {sorted(extra)[0]!r}; model fields: {', '.join(s.fields)}")
        for name, f in zip(names, schema):
            t = f.type
            if name == "ts":
                if not pa.types.is_integer(t):
                    raise EventError(f"ts must be non-null int64, got {show_type(t)}")
            elif name == "label":
                if not is_number(t):
                    raise EventError(f"label must be numeric, got {show_type(t)}")
            elif name == "labels":
                check_labels_type(t, self.schema.tasks)
            elif name == "dense":
                if not (_is_list(t) or pa.types.is_fixed_size_list(t)):
                    raise EventError(f"dense must be a list of float32, got {show_type(t)}")
                if not is_number(t.value_type):  # strings, structs, dictionaries...
                    raise EventError(f"dense must be a list of numbers, got {show_type(t)}")
            elif name == "request_id":
                if not (_is_text(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
                    raise EventError(f"request_id must be a string column, got {show_type(t)}")
            elif name == "feedback":
                check_feedback_type(t)
            elif not _is_list(t):
                raise EventError(f"column {name!r} must be a list of int64 ids, got {show_type(t)}")
            elif not pa.types.is_integer(t.value_type):
                raise EventError(f"column {name!r} must hold integer ids, got {show_type(t.value_type)}")

    def batch_from_table(self, table: pa.Table | pa.RecordBatch) -> EventBatch:
        """An EventBatch of a table or record batch (Parquet's, say); raises EventError only."""
        return _contained("decoding Arrow", self._checked_batch, table)

    def _checked_batch(self, table: pa.Table | pa.RecordBatch) -> EventBatch:
        self._check_columns(table.schema)
        try:
            table.validate(full=True)
        except Exception as e:
            raise EventError(f"invalid Arrow data: {self._invalid(e, table.schema)}") from None
        return self._batch_from_table(table)

    def _batch_from_table(self, table: pa.Table | pa.RecordBatch) -> EventBatch:
        """The columns' values; ``table`` passed :meth:`_check_columns` and full validation."""
        s = self.schema
        names = set(table.schema.names)
        n = table.num_rows

        def col(name: str) -> pa.Array | None:
            """The column as one array; None when the table has none of that name."""
            if name not in names:
                return None
            c = table.column(name)
            return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c

        labels, task_labels = _table_labels(s, col("labels"), col("label"), n)
        ts = _table_ts(col("ts"), n)
        dense = _table_dense(s, col("dense"), n)
        sparse = {}
        empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
        for f in s.fields:
            sparse[f] = _list_column(col(f), f) if f in names else empty
        rids = _table_request_ids(col("request_id"), n)
        feedback = feedback_column(col("feedback")) if "feedback" in names else None
        return EventBatch(ts=ts, labels=labels, dense=dense, sparse=sparse, request_ids=rids,
                          task_labels=task_labels, task_names=s.tasks if task_labels is not None else None,
                          feedback=feedback)


def _table_labels(s: EventSchema, lsc: pa.Array | None, lc: pa.Array | None,
                  n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The first task's labels (0.0 where missing) and, when the table has ``labels`` or the model several
    tasks, the task-label matrix (NaN = missing) of a table's ``labels`` and ``label`` columns (None: absent)."""
    if lsc is not None:
        return task_label_columns(s, lsc, lc, n)
    several = len(s.tasks) > 1
    if lc is None:
        if s.require_label:
            raise EventError("missing label column")
        # the first task's labels alone (none here): the others are missing
        return np.zeros(n, np.float32), np.full((n, len(s.tasks)), np.nan, np.float32) if several else None
    if lc.null_count and s.require_label:
        raise EventError("missing label (null) in label column")
    labels = lc.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    first = with_nulls(lc, labels) if several else None  # NaN where null: the first task's label is missing there
    labels = np.nan_to_num(labels, nan=0.0) if lc.null_count else labels
    if n and not (labels.min() >= 0 and labels.max() <= 1):  # written so that NaN fails too
        raise EventError("label must be in [0, 1]")
    if not several:
        return labels, None
    task_labels = np.full((n, len(s.tasks)), np.nan, np.float32)  # the first task's labels alone
    task_labels[:, 0] = first
    return labels, task_labels


def _table_ts(tc: pa.Array | None, n: int) -> np.ndarray:
    if tc is None:
        return np.zeros(n, np.int64)
    if tc.null_count:
        raise EventError(f"ts must be non-null int64, got {tc.type}")
    if pa.types.is_uint64(tc.type) and n and pc.max(tc).as_py() > INT64_MAX:
        # astype(int64) wrapped these to negative times; JSON refuses ts beyond int64 too
        raise EventError(f"ts must be an integer (ms since epoch) within int64, got {pc.max(tc).as_py()}")
    return tc.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _table_dense(s: EventSchema, dc: pa.Array | None, n: int) -> np.ndarray:
    """The ``dense`` column (None: absent) as an ``(n, dense_dim)`` float32 matrix of bounded values."""
    if not s.dense_dim:
        if dc is not None:  # tolerated when every row is empty
            if pa.types.is_fixed_size_list(dc.type):
                width = dc.type.list_size if n else 0
            else:
                width = int(pc.max(pc.list_value_length(dc)).as_py() or 0) if n else 0
            if width:
                raise EventError(f"dense has {width} values, the model expects 0")
        return np.zeros((n, 0), np.float32)
    if dc is None:
        raise EventError(f"missing dense column (model expects {s.dense_dim} values)")
    if dc.null_count:
        raise EventError("dense has null rows")
    if pa.types.is_fixed_size_list(dc.type):
        width = dc.type.list_size
        if width != s.dense_dim:
            raise EventError(f"dense has {width} values, the model expects {s.dense_dim}")
        flat = dc.values.to_numpy(zero_copy_only=False)
        flat = flat[dc.offset * width : (dc.offset + n) * width]
    else:  # list or large list (_check_columns)
        off = dc.offsets.to_numpy()
        lens = np.diff(off)
        if n and not np.all(lens == s.dense_dim):
            bad = int(lens[lens != s.dense_dim][0])
            raise EventError(f"dense has {bad} values, the model expects {s.dense_dim}")
        flat = dc.values.to_numpy(zero_copy_only=False)[off[0] : off[-1]]
    dense = np.asarray(flat, dtype=np.float32).reshape(n, s.dense_dim)
    bound = s.dense_abs_max
    if not (n == 0 or (dense.min() >= -bound and dense.max() <= bound)):  # NaN fails too
        # NaN/inf (null values read as NaN) or huge values would poison training
        bad_at = np.argwhere(~(np.abs(dense) <= bound))[0]
        row, x = int(bad_at[0]), float(dense[bad_at[0], bad_at[1]])
        raise EventError(f"dense values must be finite numbers within +-{bound:g} "
                         f"(ingest.dense_abs_max), got {x!r} (row {row})")
    return dense


def _table_request_ids(rc: pa.Array | None, n: int) -> list | None:
    if rc is None or rc.null_count >= n:
        return None
    rids = rc.to_pylist()  # valid UTF-8 (validated), so valid text
    if not _is_text(rc.type):
        # non-string ids (ints...) became str in JSON but stayed ints here: convert the same way
        rids = [None if r is None else str(r) for r in rids]
    return rids


def events_to_arrow_messages(
    batch: EventBatch, schema: EventSchema, events_per_message: int
) -> Iterable[bytes]:
    """Split a batch into Arrow IPC messages of at most ``events_per_message`` events."""
    n = len(batch)
    for start in range(0, n, events_per_message):
        rows = np.arange(start, min(n, start + events_per_message))
        yield encode_arrow(batch.take(rows) if (start or len(rows) < n) else batch, schema)


def encode_messages(batch: EventBatch, schema: EventSchema, codec: Codec, events_per_message: int) -> Sequence[bytes]:
    if codec == ARROW:
        return list(events_to_arrow_messages(batch, schema, events_per_message))
    if codec == JSON:
        return encode_json_batch(batch, schema.tasks if batch.task_labels is not None else None)
    raise ValueError(f"unknown codec {codec!r}; expected one of {', '.join(get_args(Codec))}")
