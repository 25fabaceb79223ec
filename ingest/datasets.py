"""Event files: read CSV/TSV, JSON lines, Parquet, Criteo and Avazu as EventBatch chunks; write Parquet/JSON lines.

Layouts (what a reader expects; the model config's fields must match):

* ``csv`` / ``tsv`` -- a header row naming the columns: ``label`` (0/1 or a number in
  [0, 1]; required), ``ts`` (int ms, optional), ``dense_0 .. dense_{D-1}`` (exactly
  the model's ``dense_dim``), one column per sparse field named as the field (a
  cell holds one id, several ids separated by ``|``, or nothing = no id), and an
  optional ``request_id``. An id cell that is a decimal integer within 64 bits is
  that integer; any other text is hashed with :func:`hash_id`. Unknown columns
  are an error.
* ``jsonl`` -- one event object per line, exactly the JSON wire form.
* ``parquet`` -- the Arrow wire form's columns (``ts``, ``label``, ``dense``,
  one ``list<int64>`` per field, ``request_id``, and ``labels``, a struct of one
  nullable float32 per task, for a model with several tasks); plain integer or string
  columns are accepted for single-valued fields.
* ``criteo`` -- the Criteo display-advertising TSV: no header, ``label``, 13 integer
  columns ``I1..I13``, 26 hexadecimal categorical columns ``C1..C26``. Model:
  fields ``C1..C26``, ``dense_dim = 13`` (see :func:`criteo_config`). An empty
  integer cell is 0; dense values are ``log(1 + max(x, 0))`` as in the DLRM
  reference pre-processing (``dense="raw"`` keeps ``x``). A categorical cell is
  parsed as a hexadecimal integer (``"68fd1e64"`` -> ``0x68fd1e64``; reversible,
  no hashing needed since each field is its own table); an empty cell gives no
  id for that field.
* ``avazu`` -- the Avazu CTR CSV with its header ``id,click,hour,C1,banner_pos,
  site_id,...,C21``: label = ``click``, ``ts`` = ``hour`` (YYMMDDHH, UTC) in ms,
  ``request_id`` = ``id``, no dense features, 21 categorical fields (every other
  column, see :func:`avazu_config`). Hexadecimal columns (``site_id``, ``app_id``,
  ``device_ip``, ...) are parsed as hex integers, the others as decimal integers;
  an empty cell gives no id.

Formats are detected from the file name (``.csv``, ``.tsv``/``.txt``, ``.jsonl``/``.ndjson``,
``.parquet``/``.pq``; a ``.gz``/``.bz2``/``.zst`` suffix is read compressed),
then by sniffing: a CSV whose header starts ``id,click,hour`` is Avazu, a
tab-separated file without header with 40 columns is Criteo.
"""

from __future__ import annotations

import copy
import datetime as _dt
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from streamrec.foundation import StreamrecError
from .codec import Decoder, _loads_json, batch_to_arrow
from streamrec.foundation import INT64_MIN, EventBatch, EventError, EventSchema, JaggedIds, hash_id

if TYPE_CHECKING:
    from streamrec.foundation.model_config import ModelConfig

FORMATS = ("csv", "tsv", "jsonl", "parquet", "criteo", "avazu")
LAYOUTS = ("criteo", "avazu")

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_FIELDS = [f"C{i}" for i in range(1, 27)]
AVAZU_HEADER = [
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
    "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
    "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
]
AVAZU_FIELDS = AVAZU_HEADER[3:]
AVAZU_HEX = {"site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category",
             "device_id", "device_ip", "device_model"}

_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_BY_EXT = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


class DatasetError(StreamrecError, ValueError):
    """A file cannot be read as events; the message names the file and the problem."""


# -- layouts and configs ------------------------------------------------------------


def layout_model(layout: str) -> tuple[list[str], int]:
    """The sparse field names and dense width a layout produces."""
    if layout == "criteo":
        return list(CRITEO_FIELDS), len(CRITEO_DENSE)
    if layout == "avazu":
        return list(AVAZU_FIELDS), 0
    raise DatasetError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")


def layout_config(layout: str, model: ModelConfig | None = None) -> ModelConfig:
    """A copy of ``model`` (the ``[model]`` section; default: built-in defaults) whose fields and dense width
    fit ``layout``; a field of ``model`` that the layout also has keeps its settings."""
    from streamrec.foundation.model_config import FieldSpec, ModelConfig

    model = copy.deepcopy(model) if model is not None else ModelConfig()
    names, dense = layout_model(layout)
    old = {f.name: f for f in model.fields}
    model.fields = [old.get(n) or FieldSpec(n) for n in names]
    model.dense_dim = dense
    return model


def criteo_config(model: ModelConfig | None = None) -> ModelConfig:
    """The ``[model]`` section for the Criteo layout: fields C1..C26, dense_dim 13."""
    return layout_config("criteo", model)


def avazu_config(model: ModelConfig | None = None) -> ModelConfig:
    """The ``[model]`` section for the Avazu layout: 21 categorical fields, no dense features."""
    return layout_config("avazu", model)


def layout_toml(layout: str) -> str:
    """The ``[model]`` keys a config file needs for ``layout`` (every part must use the same)."""
    names, dense = layout_model(layout)
    fields = ", ".join(f'{{ name = "{n}" }}' for n in names)
    return f"[model]\ndense_dim = {dense}\nfields = [{fields}]\n"


def check_layout(schema: EventSchema, layout: str) -> None:
    names, dense = layout_model(layout)
    if list(schema.fields) != names or schema.dense_dim != dense:
        raise DatasetError(
            f"the model config (fields {list(schema.fields)[:4]}{'...' if len(schema.fields) > 4 else ''}, "
            f"dense_dim {schema.dense_dim}) does not match the {layout} layout (fields {names[0]}..{names[-1]}, "
            f"{len(names)} fields, dense_dim {dense}); use `--layout {layout}` / {layout}_config(), "
            f"and give every part the same model config:\n{layout_toml(layout)}"
        )


# -- format detection ---------------------------------------------------------------


def _strip_compression(path: Path) -> tuple[str, bool]:
    name = path.name.lower()
    for ext in _COMPRESSED:
        if name.endswith(ext):
            return name[: -len(ext)], True
    return name, False


def _open(path: Path):
    return pa.input_stream(str(path), compression="detect")


def _first_line(path: Path) -> bytes:
    with _open(path) as f:
        # without a UTF-8 BOM (spreadsheet exports): the CSV reader skips it, so must the header check
        return f.read(1 << 16).removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].rstrip(b"\r")


def detect_format(path: str | os.PathLike) -> str:
    """Guess a file's format from its name, then its first line (see the module docstring)."""
    p = Path(path)
    name, _ = _strip_compression(p)
    ext = os.path.splitext(name)[1]
    fmt = _BY_EXT.get(ext)
    if fmt is None:
        raise DatasetError(f"{p}: cannot tell the format from the extension {ext!r}; pass one of {', '.join(FORMATS)}")
    if fmt in ("csv", "tsv") and p.exists():
        line = _first_line(p)
        if line.replace(b" ", b"").startswith(b"id,click,hour"):
            return "avazu"
        cells = line.split(b"\t")
        if len(cells) == 1 + len(CRITEO_DENSE) + len(CRITEO_FIELDS) and cells[0] in (b"0", b"1"):
            return "criteo"
    return fmt


# -- id columns ---------------------------------------------------------------------

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_SHIFTS = (np.uint64(4) * np.arange(15, -1, -1, dtype=np.uint64)).astype(np.uint64)


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets int64 [n+1], data uint8, present bool [n]) of a string array; null or empty = absent."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_string(arr.type):
        arr = arr.cast(pa.string())
    n = len(arr)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    present = np.diff(offs) > 0
    if arr.null_count:
        present &= ~arr.is_null().to_numpy(zero_copy_only=False)
    return offs, data, present


def _single(values: np.ndarray, present: np.ndarray) -> JaggedIds:
    offsets = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(present, out=offsets[1:])
    return JaggedIds(values.astype(np.int64, copy=False), offsets)


def hex_ids(arr: pa.Array, what: str = "column") -> JaggedIds:
    """Parse a string column of hexadecimal ids (up to 16 digits; >= 2^63 wraps like :func:`hash_id`).

    Vectorised: the digits go through a lookup table, right-aligned in a 16-nibble matrix.
    """
    offs, data, present = _string_parts(arr)
    starts = offs[:-1][present]
    lens = np.diff(offs)[present]
    if len(lens) and lens.max() > 16:
        i = int(np.argmax(lens > 16))
        bad = bytes(data[starts[i] : starts[i] + lens[i]]).decode(errors="replace")
        raise DatasetError(f"{what}: {bad!r} has more than 16 hexadecimal digits")
    k = np.arange(16)
    inside = k[None, :] >= (16 - lens)[:, None]
    pos = np.where(inside, starts[:, None] + k[None, :] - (16 - lens)[:, None], 0)
    nib = _HEX[data[pos]] if len(data) else np.zeros(pos.shape, np.uint8)
    nib = np.where(inside, nib, 0)
    badrow = (nib == 255).any(axis=1)
    if badrow.any():
        i = int(np.argmax(badrow))
        bad = bytes(data[starts[i] : starts[i] + lens[i]]).decode(errors="replace")
        raise DatasetError(f"{what}: {bad!r} is not a hexadecimal id")
    vals = (nib.astype(np.uint64) << _SHIFTS[None, :]).sum(axis=1, dtype=np.uint64)
    return _single(vals.view(np.int64), present)


def _text_id(s: str) -> int:
    """A decimal integer within 64 bits is that integer; any other text is hashed."""
    try:
        v = int(s)
    except ValueError:
        return hash_id(s)
    if INT64_MIN <= v < 2**64 and s.strip() == s and s.lstrip("+-").isdigit():
        return hash_id(v)
    return hash_id(s)


def decimal_ids(arr: pa.Array, what: str = "column", strict: bool = True) -> JaggedIds:
    """Parse a string column of decimal integer ids; with ``strict=False`` other text is hashed."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    present = np.ones(len(arr), dtype=bool)
    if arr.null_count:
        present &= ~arr.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_string(arr.type):
        present &= pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False) > 0
        kept = arr.filter(pa.array(present))
    else:
        kept = arr.drop_null()
    try:
        vals = pc.cast(kept, pa.int64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if strict:
            for s in kept.to_pylist():
                try:
                    hash_id(int(s))
                except (ValueError, EventError):
                    raise DatasetError(f"{what}: {s!r} is not a 64-bit decimal integer id") from None
        vals = np.fromiter((_text_id(str(s)) for s in kept.to_pylist()), dtype=np.int64, count=len(kept))
    return _single(vals, present)


def text_ids(arr: pa.Array, what: str = "column", sep: str = "|") -> JaggedIds:
    """Generic CSV cells: ids separated by ``sep``; decimal integers as such, other text hashed."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_string(arr.type):
        return decimal_ids(arr.cast(pa.string()), what)
    arr = pc.fill_null(arr, "")
    if not pc.any(pc.match_substring(arr, sep)).as_py():
        return decimal_ids(arr, what, strict=False)
    lists = pc.split_pattern(arr, sep)
    offs = lists.offsets.to_numpy().astype(np.int64)
    flat = lists.flatten()
    row_of = np.repeat(np.arange(len(arr)), np.diff(offs))
    single = decimal_ids(flat, what, strict=False)  # drops empty pieces
    keep = np.diff(single.offsets) > 0
    counts = np.bincount(row_of[keep], minlength=len(arr))
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return JaggedIds(single.values, offsets)


# -- readers -----------------------------------------------------------------------


def _csv_batches(path: Path, delimiter: str, names: list[str] | None, types: dict[str, pa.DataType],
                 block_size: int) -> Iterator[pa.RecordBatch]:
    read = pacsv.ReadOptions(block_size=block_size, column_names=names, autogenerate_column_names=False)
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=False if delimiter == "\t" else '"')
    conv = pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True,
                                quoted_strings_can_be_null=True)
    try:
        reader = pacsv.open_csv(_open(path), read_options=read, parse_options=parse, convert_options=conv)
        for rb in reader:
            yield rb
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise DatasetError(f"{path}: {e}") from None


def _csv_header(path: Path, delimiter: str) -> list[str]:
    line = _first_line(path).decode("utf-8", errors="replace")
    return [c.strip().strip('"') for c in line.split(delimiter)]


def _labels(col: pa.Array, where: str) -> np.ndarray:
    if col.null_count:
        raise DatasetError(f"{where}: missing label in {col.null_count} rows")
    y = col.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if len(y) and (np.isnan(y).any() or y.min() < 0 or y.max() > 1):
        raise DatasetError(f"{where}: labels must be in [0, 1]")
    return y


def _check_csv(path: Path, schema: EventSchema, delimiter: str) -> tuple[list[str], list[str]]:
    header = _csv_header(path, delimiter)
    if header == [""]:  # an empty first line read as one column named '' ("unknown column ''")
        kind = "TSV" if delimiter == "\t" else "CSV"
        raise DatasetError(f"{path}: the file is empty or its first line is blank; a {kind} file needs a header row "
                           "naming its columns")
    dense_cols = [f"dense_{i}" for i in range(schema.dense_dim)]
    known = {"label", "ts", "request_id", *dense_cols, *schema.fields}
    unknown = [c for c in header if c not in known]
    if unknown:
        # no dense columns when dense_dim is 0 (the range read "dense_0..dense_-1")
        dense = {0: "", 1: "dense_0, "}.get(schema.dense_dim, f"dense_0..dense_{schema.dense_dim - 1}, ")
        raise DatasetError(
            f"{path}: unknown column {unknown[0]!r}; expected label, ts, {dense}"
            f"request_id and the model fields {', '.join(schema.fields)}"
        )
    if "label" not in header and schema.require_label:
        raise DatasetError(f"{path}: no 'label' column")
    missing = [c for c in dense_cols if c not in header]
    if missing:
        raise DatasetError(f"{path}: missing dense column {missing[0]!r} (the model expects {schema.dense_dim})")
    return header, dense_cols


def _read_csv(path: Path, schema: EventSchema, delimiter: str, block_size: int) -> Iterator[EventBatch]:
    header, dense_cols = _check_csv(path, schema, delimiter)
    types = {"label": pa.float32(), "ts": pa.int64(), "request_id": pa.string(),
             **{c: pa.float32() for c in dense_cols}, **{f: pa.string() for f in schema.fields}}
    types = {k: v for k, v in types.items() if k in header}
    for rb in _csv_batches(path, delimiter, None, types, block_size):
        n = rb.num_rows
        cols = dict(zip(rb.schema.names, rb.columns))
        labels = _labels(cols["label"], str(path)) if "label" in cols else np.zeros(n, np.float32)
        if "ts" in cols:
            ts = pc.fill_null(cols["ts"], 0).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            ts = np.zeros(n, np.int64)
        if dense_cols:
            dense = np.stack([pc.fill_null(cols[c], 0.0).to_numpy(zero_copy_only=False) for c in dense_cols], axis=1)
            if not np.isfinite(dense).all():  # "nan"/"inf" cells parse as floats; the consumer would refuse them
                r, c = np.argwhere(~np.isfinite(dense))[0]
                raise DatasetError(f"{path}: {dense_cols[c]} = {dense[r, c]} in a data row; dense values must be finite")
        else:
            dense = np.zeros((n, 0), np.float32)
        empty = JaggedIds(np.zeros(0, np.int64), np.zeros(n + 1, np.int64))
        sparse = {f: text_ids(cols[f], f"{path} column {f}") if f in cols else empty for f in schema.fields}
        rids = cols["request_id"].to_pylist() if "request_id" in cols else None
        yield EventBatch(ts=ts, labels=labels, dense=dense.astype(np.float32, copy=False), sparse=sparse,
                         request_ids=rids)


def _read_criteo(path: Path, schema: EventSchema, block_size: int, dense: str) -> Iterator[EventBatch]:
    check_layout(schema, "criteo")
    names = ["label", *CRITEO_DENSE, *CRITEO_FIELDS]
    types = {"label": pa.float32(), **{c: pa.int64() for c in CRITEO_DENSE}, **{c: pa.string() for c in CRITEO_FIELDS}}
    for rb in _csv_batches(path, "\t", names, types, block_size):
        n = rb.num_rows
        x = np.stack([pc.fill_null(rb.column(i + 1), 0).to_numpy(zero_copy_only=False)
                      for i in range(len(CRITEO_DENSE))], axis=1).astype(np.float64)
        if dense == "log":
            x = np.log1p(np.maximum(x, 0.0))
        sparse = {c: hex_ids(rb.column(1 + len(CRITEO_DENSE) + j), f"{path} column {c}")
                  for j, c in enumerate(CRITEO_FIELDS)}
        yield EventBatch(ts=np.zeros(n, np.int64), labels=_labels(rb.column(0), str(path)),
                         dense=x.astype(np.float32), sparse=sparse)


def avazu_hour_to_ms(hours: np.ndarray) -> np.ndarray:
    """Avazu ``hour`` (YYMMDDHH, UTC) to ms since the epoch."""
    hours = np.asarray(hours, dtype=np.int64)
    days, inv = np.unique(hours // 100, return_inverse=True)
    day_ms = np.array([
        int(_dt.datetime(2000 + int(d) // 10000, int(d) // 100 % 100, int(d) % 100,
                         tzinfo=_dt.timezone.utc).timestamp() * 1000) if d else 0
        for d in days
    ], dtype=np.int64)
    return day_ms[inv.reshape(-1)] + (hours % 100) * 3_600_000


def _read_avazu(path: Path, schema: EventSchema, block_size: int) -> Iterator[EventBatch]:
    check_layout(schema, "avazu")
    header = _csv_header(path, ",")
    if header[: len(AVAZU_HEADER)] != AVAZU_HEADER and header != [h for h in AVAZU_HEADER if h != "click"]:
        raise DatasetError(f"{path}: not the Avazu header; expected {','.join(AVAZU_HEADER)}")
    if "click" not in header and schema.require_label:
        raise DatasetError(f"{path}: no 'click' column (the Avazu test file has no labels)")
    types = {c: pa.string() for c in AVAZU_FIELDS}
    types.update({"id": pa.string(), "click": pa.float32(), "hour": pa.int64()})
    for rb in _csv_batches(path, ",", None, types, block_size):
        n = rb.num_rows
        cols = dict(zip(rb.schema.names, rb.columns))
        labels = _labels(cols["click"], str(path)) if "click" in cols else np.zeros(n, np.float32)
        ts = avazu_hour_to_ms(pc.fill_null(cols["hour"], 0).to_numpy(zero_copy_only=False))
        sparse = {}
        for f in AVAZU_FIELDS:
            what = f"{path} column {f}"
            sparse[f] = hex_ids(cols[f], what) if f in AVAZU_HEX else decimal_ids(cols[f], what)
        yield EventBatch(ts=ts, labels=labels, dense=np.zeros((n, 0), np.float32), sparse=sparse,
                         request_ids=cols["id"].to_pylist())


def _read_jsonl(path: Path, schema: EventSchema, chunk: int) -> Iterator[EventBatch]:
    rows: list = []
    with _open(path) as raw:
        # surrogateescape: a line that is not UTF-8 gets back its own bytes and a "bad JSON" error naming
        # the line, instead of a UnicodeDecodeError out of the loop
        for lineno, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape",
                                                       newline="\n"), 1):
            if not line.strip():
                continue
            try:
                rows.append(schema.validate(_loads_json(line.encode("utf-8", "surrogateescape"))))
            except EventError as e:
                raise DatasetError(f"{path}:{lineno}: {e}") from None
            if len(rows) >= chunk:
                yield schema.batch_from_parsed(rows)
                rows = []
    if rows:
        yield schema.batch_from_parsed(rows)


def _read_parquet(path: Path, schema: EventSchema, chunk: int) -> Iterator[EventBatch]:
    import pyarrow.parquet as pq

    decoder = Decoder(schema)
    try:
        pf = pq.ParquetFile(str(path))
        for rb in pf.iter_batches(batch_size=chunk):
            try:
                yield decoder.batch_from_table(rb)
            except EventError as e:
                raise DatasetError(f"{path}: {e}") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{path}: not a readable Parquet file: {e}") from None


def _rechunk(batches: Iterable[EventBatch], chunk: int, schema: EventSchema) -> Iterator[EventBatch]:
    """Batches of at most ``chunk`` events; for a model with several tasks each has ``task_labels`` (a layout
    with one label column gives the first task's, the other tasks missing)."""
    num_tasks = len(schema.tasks)
    for b in batches:
        if num_tasks > 1 and b.task_labels is None:
            b.task_labels, b.task_names = b.label_matrix(num_tasks), schema.tasks
        if len(b) <= chunk:
            if len(b):
                yield b
            continue
        for s in range(0, len(b), chunk):
            yield b.take(np.arange(s, min(len(b), s + chunk)))


def read_events(
    path: str | os.PathLike,
    schema: EventSchema,
    format: str | None = None,
    chunk: int = 8192,
    dense: str = "log",
) -> Iterator[EventBatch]:
    """Yield the events of a file as batches of at most ``chunk`` events, validated against ``schema`` (the
    model config's events).

    ``format``: one of :data:`FORMATS` (default: :func:`detect_format`). ``dense``:
    ``"log"`` or ``"raw"``, the Criteo dense transform.
    """
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file")
    fmt = format or detect_format(p)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if dense not in ("log", "raw"):
        raise DatasetError(f"dense transform must be 'log' or 'raw', got {dense!r}")
    # check headers and layouts now, before the caller starts anything (a broker, a progress bar)
    if fmt in LAYOUTS:
        check_layout(schema, fmt)
    elif fmt in ("csv", "tsv"):
        _check_csv(p, schema, "," if fmt == "csv" else "\t")
    block = max(1 << 16, chunk * 256)  # bytes per CSV block: about ``chunk`` rows of Criteo
    if fmt in ("csv", "tsv"):
        src = _read_csv(p, schema, "," if fmt == "csv" else "\t", block)
    elif fmt == "criteo":
        src = _read_criteo(p, schema, block, dense)
    elif fmt == "avazu":
        src = _read_avazu(p, schema, block)
    elif fmt == "jsonl":
        src = _read_jsonl(p, schema, chunk)
    else:
        src = _read_parquet(p, schema, chunk)
    return _rechunk(src, chunk, schema)


# -- writers -----------------------------------------------------------------------


def write_events(path: str | os.PathLike, batches: Iterable[EventBatch], schema: EventSchema,
                 format: str | None = None) -> int:
    """Write batches of ``schema``'s events as Parquet (the Arrow wire columns) or JSON lines; returns the
    number of events."""
    import json

    import pyarrow.parquet as pq

    p = Path(path)
    fmt = format or _BY_EXT.get(os.path.splitext(_strip_compression(p)[0])[1])
    if fmt not in ("parquet", "jsonl"):
        raise DatasetError(f"{p}: can write parquet or jsonl, not {fmt!r}")
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = p.with_name(f".{p.name}.partial-{os.getpid()}{p.suffix}")  # same suffix: compression detect
    if fmt == "parquet":
        from .codec import arrow_schema

        with_labels = len(schema.tasks) > 1  # one schema for the whole file: labels when the model has tasks
        with pq.ParquetWriter(str(tmp), arrow_schema(schema, with_labels), compression="zstd") as w:
            for b in batches:
                w.write_batch(batch_to_arrow(b, schema, with_labels))
                n += len(b)
    else:
        with pa.output_stream(str(tmp), compression="detect") as f:
            for b in batches:
                events = b.to_events(schema.tasks if b.task_labels is not None and b.task_names is None else None)
                f.write("".join(json.dumps(ev, separators=(",", ":")) + "\n" for ev in events).encode())
                n += len(b)
    os.replace(tmp, p)
    return n


def read_file(path: str | os.PathLike, schema: EventSchema, layout: str = "auto",
              chunk: int = 8192) -> Iterator[EventBatch]:
    """:func:`read_events` with a layout choice: ``auto`` (detect), ``criteo``, ``avazu``,
    or ``events`` (the plain event columns: CSV/TSV, JSON lines or Parquet by extension)."""
    if layout == "auto":
        return read_events(path, schema, chunk=chunk)
    if layout in LAYOUTS:
        return read_events(path, schema, format=layout, chunk=chunk)
    if layout == "events":
        name, _ = _strip_compression(Path(path))
        fmt = _BY_EXT.get(os.path.splitext(name)[1])
        if fmt is None:
            raise DatasetError(f"{path}: cannot tell the format from the extension; use .csv, .tsv, .jsonl or .parquet")
        return read_events(path, schema, format=fmt, chunk=chunk)
    raise DatasetError(f"unknown layout {layout!r}; expected auto, criteo, avazu or events")
