"""The snapshot format: what the trainer hands to serving.

A snapshot is a directory::

    manifest.json        version, parent, kind, offsets, metrics, hashes, per-file sha256, quality evidence
    dense.safetensors    the model's state_dict (all of it, also in a delta)
    program.json         the dense network exported with torch.export (a full snapshot; see program.py)
    program-constants.safetensors   tensors the program holds outside the state dict (when it has any)
    rows-00000.parquet   embedding rows: table (string), id (int64), vector (fixed_size_list<float32>[dim]);
                         one width per file (tables of different widths go to different files). In the
                         manifest's ``row_precision`` (``rowcodec.py``): fp32 as above; fp16: vector
                         fixed_size_list<float16>[dim]; int8: vector fixed_size_list<uint8>[dim] plus
                         scale and bias (float16) per row. ``iter_rows`` decodes every precision to float32.
    deleted.parquet      a delta only, when it removes rows: table (string), id (int64) (``deletions.py``)

``manifest.row_probe`` (or null): up to 8 events built from rows the snapshot carries and the scores the
trainer computed for them from the rows as serving will hold them (``round_trip`` of the row precision);
serving scores the events with the loaded version and refuses the push when a score differs.

``manifest.tasks`` names the model's tasks in output order (column t of the logits is task t);
``manifest.program`` describes the exported program (file, sha256, input and output shapes, the logits
it gave on the probe batch), or is null when the model could not be exported: serving then builds the
module from ``model_config`` (which needs its code importable there). A delta's ``program`` names its
parent's program (same sha256) and carries no program file: only the weights change.

A *full* snapshot holds every row the model has; a *delta* holds the rows that
changed since ``parent_version``. ``manifest.json`` is written last (atomically),
so a directory with a manifest is complete; the per-file sha256 lets a receiver
prove that what arrived over the wire is what the writer wrote.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from streamrec.foundation import INT64_MAX, INT64_MIN, as_resource_error, sha256_file
from streamrec.snapshot.snapshot_types import MODEL_LINE_RE

from .deletions import DELETED, write_deleted
from .errors import SnapshotError
from .rowcodec import PRECISIONS, decode_rows, encode_rows

FORMAT = 1
MANIFEST = "manifest.json"
DENSE = "dense.safetensors"
ROWS_PER_FILE = 1_000_000
KINDS = ("full", "delta")

# Bounds on a manifest's shape, checked before and right after parsing: a manifest comes from the network
# (PushSnapshot), so it is as hostile as any request. Far above what a real snapshot needs: a manifest of
# 10,000 row files (10 billion rows) and 10,000 Kafka partitions is ~2 MiB, at depth 5.
MAX_MANIFEST_BYTES = 4 << 20
MAX_DEPTH = 10  # objects/arrays inside each other (a real manifest: 5)
MAX_FILES = 10_000
MAX_ENTRIES = 65_536  # entries of kafka_offsets, metrics, store_config each
MAX_KEY_CHARS = 256  # metric names, offset keys
MAX_VERSION = 1 << 62  # leaves room above any accepted version: a push can never make later ones impossible
MAX_PROBE_EVENTS = 64  # row_probe events (the trainer sends at most 8)
MAX_PROBE_IDS = 1024  # ids per field of one row_probe event
MAX_PROBE_WIDTH = 1 << 16  # dense values of one row_probe event, scores (tasks) per event
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # no path, no leading dot, no control chars, <= 128


def _no_constant(name: str):
    raise SnapshotError(f"manifest holds {name}: every number must be finite")


def _shape(v: Any, where: str, depth: int = 1) -> None:
    """Depth and string checks over a parsed manifest (strings go into protobuf replies: valid UTF-8 only)."""
    if depth > MAX_DEPTH:
        raise SnapshotError(f"manifest: {where} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise SnapshotError(f"manifest: {where} is not valid UTF-8 text") from None
    elif isinstance(v, dict):
        for k, x in v.items():
            _shape(k, f"{where} key", depth)
            _shape(x, f"{where}.{k}"[:200], depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _shape(x, f"{where}[{i}]", depth + 1)


@dataclass
class Manifest:
    version: int
    parent_version: int | None
    kind: str
    created_ms: int
    newest_event_ms: int
    config_hash: str
    model_config: dict[str, Any]
    kafka_offsets: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    rows: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"sha256", "bytes"}
    store_config: dict[str, Any] = field(default_factory=dict)  # init settings the store used (init_scale, ...)
    tasks: list[str] = field(default_factory=list)  # task names in output order; empty: model_config's tasks
    program: dict[str, Any] | None = None  # the exported dense network (see program.py), null: none
    evidence: dict[str, Any] | None = None  # the quality evidence serving's guard reads (see evidence.py), null: none
    model_line: str = "main"  # the model line the version belongs to (serving keeps one chain per line); absent: main
    row_precision: str = "fp32"  # how the row files hold vectors (rowcodec.py); absent: fp32
    row_probe: dict[str, Any] | None = None  # events and the trainer's scores on them (see the module doc), null: none
    deleted: int = 0  # rows this delta removes, listed in deleted.parquet (deletions.py)
    format: int = FORMAT

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, blob: bytes | str) -> "Manifest":
        if len(blob) > MAX_MANIFEST_BYTES:
            raise SnapshotError(f"manifest is {len(blob)} bytes, the limit is {MAX_MANIFEST_BYTES}")
        try:
            d = json.loads(blob, parse_constant=_no_constant)
        except SnapshotError:
            raise
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
            raise SnapshotError(f"manifest is not valid JSON: {str(e)[:200]}") from None
        except RecursionError:
            raise SnapshotError(f"manifest is nested deeper than {MAX_DEPTH} levels") from None
        _shape(d, "manifest")
        if not isinstance(d, dict):
            raise SnapshotError("manifest must be a JSON object")
        if d.get("format") != FORMAT:
            raise SnapshotError(f"manifest format {d.get('format')!r} is not supported (expected {FORMAT})")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise SnapshotError(f"manifest has unknown key {extra[0]!r}")
        try:
            m = cls(**d)
        except TypeError as e:
            raise SnapshotError(f"manifest: {e}") from None
        m.check()
        return m

    def check(self) -> None:
        def bad(key: str, msg: str) -> None:
            raise SnapshotError(f"manifest.{key}: {msg}")

        def int64(v: Any) -> bool:
            return type(v) is int and INT64_MIN <= v <= INT64_MAX

        # every value is type-checked here: unchecked, a wrong type would surface as an UNKNOWN error
        # (which pushers retry) or be installed and then break every Status call (protobuf refuses it there)
        if not int64(self.version) or not 1 <= self.version <= MAX_VERSION:
            bad("version", f"must be an integer in 1..2^62, got {self.version!r}")
        if self.parent_version is not None and not int64(self.parent_version):
            bad("parent_version", f"must be an int64 or null, got {self.parent_version!r}")
        if not isinstance(self.model_line, str) or not re.fullmatch(MODEL_LINE_RE, self.model_line):
            bad("model_line", f"must be a model line name (lower-case letters, digits, _ and -; at most 32), "
                              f"got {self.model_line!r}")
        for key in ("created_ms", "newest_event_ms", "rows"):
            if not int64(getattr(self, key)):
                bad(key, f"must be an int64, got {getattr(self, key)!r}")
        if not int64(self.deleted) or self.deleted < 0 or (self.deleted and self.kind != "delta"):
            bad("deleted", f"must be a count >= 0, and 0 in a full snapshot, got {self.deleted!r}")
        if not isinstance(self.config_hash, str):
            bad("config_hash", f"must be a string, got {self.config_hash!r}")
        for key in ("files", "kafka_offsets", "metrics", "store_config"):
            if not isinstance(getattr(self, key), dict):
                bad(key, f"must be an object, got {type(getattr(self, key)).__name__}")
        if not len(self.config_hash) <= MAX_KEY_CHARS:
            bad("config_hash", f"longer than {MAX_KEY_CHARS} characters")
        for key in ("kafka_offsets", "metrics", "store_config"):
            d = getattr(self, key)
            if len(d) > MAX_ENTRIES:
                bad(key, f"{len(d)} entries, the limit is {MAX_ENTRIES}")
            long = next((k for k in d if len(k) > MAX_KEY_CHARS), None)
            if long is not None:
                bad(key, f"key {long[:40]!r}... is longer than {MAX_KEY_CHARS} characters")
        for k, x in self.metrics.items():
            if type(x) not in (int, float) or not math.isfinite(x):
                bad(f"metrics.{k}", f"must be a finite number, got {x!r}")
        scale = self.store_config.get("init_scale", 0.05)
        if type(scale) not in (int, float) or not 0 < scale <= 1e3:
            bad("store_config.init_scale", f"must be a number in (0, 1000], got {scale!r}")
        if self.kind not in KINDS:
            bad("kind", f"must be 'full' or 'delta', got {self.kind!r}")
        if self.kind == "delta":
            if not isinstance(self.parent_version, int) or self.parent_version < 1:
                bad("parent_version", "a delta needs a positive parent_version")
            if self.parent_version >= self.version:
                bad("parent_version", f"{self.parent_version} is not older than version {self.version}")
        if DENSE not in self.files:
            bad("files", f"{DENSE} is missing")
        if len(self.files) > MAX_FILES:
            bad("files", f"{len(self.files)} files, the limit is {MAX_FILES}")
        for name, info in self.files.items():
            if not FILE_NAME.fullmatch(name) or name == MANIFEST:
                bad("files", f"bad file name {name[:80]!r}: 1-128 of letters, digits, '.', '_', '-', not starting "
                             f"with '.', '_' or '-'")
            if not isinstance(info, dict) or not isinstance(info.get("sha256"), str) or not int64(info.get("bytes")):
                bad("files", f"{name!r} needs sha256 (string) and bytes (integer)")
            if info["bytes"] < 0:
                bad("files", f"{name!r} has a negative size")
        if not isinstance(self.model_config, dict) or not self.model_config.get("fields"):
            bad("model_config", "must describe the model (fields, sizes)")
        if (not isinstance(self.tasks, list) or len(self.tasks) > 1024
                or any(not isinstance(t, str) or not 0 < len(t) <= 128 for t in self.tasks)
                or len(set(self.tasks)) != len(self.tasks)):
            bad("tasks", "must be a list of distinct task names (1-128 characters each, at most 1024)")
        if self.program is not None:
            self._check_program(bad)
        if not isinstance(self.row_precision, str) or self.row_precision not in PRECISIONS:
            bad("row_precision", f"must be one of {', '.join(PRECISIONS)}, got {str(self.row_precision)[:40]!r}")
        if self.row_probe is not None:
            self._check_row_probe(bad)
        if self.evidence is not None:
            from .evidence import check_evidence

            check_evidence(self.evidence)

    def _check_program(self, bad) -> None:
        p = self.program
        if not isinstance(p, dict):
            bad("program", f"must be an object or null, got {type(p).__name__}")
        known = {"format", "file", "sha256", "constants", "inputs", "outputs", "probe_rows", "probe_logits", "torch"}
        extra = sorted(set(p) - known)
        if extra:
            bad("program", f"unknown key {extra[0]!r}")
        if p.get("format") != 1:
            bad("program.format", f"{p.get('format')!r} is not supported (expected 1)")
        for key in ("file", "sha256"):
            if not isinstance(p.get(key), str) or not p[key]:
                bad(f"program.{key}", "must be a non-empty string")
        if p.get("constants") is not None and not isinstance(p["constants"], str):
            bad("program.constants", "must be a file name or null")
        for key in ("file", "constants"):
            name = p.get(key)
            if name is not None and (not FILE_NAME.fullmatch(name) or name in (MANIFEST, DENSE)):
                bad(f"program.{key}", f"bad file name {name[:80]!r}")
        if self.kind == "full":  # a delta's program is its parent's: no file of its own
            info = self.files.get(p["file"])
            if info is None:
                bad("program.file", f"{p['file']!r} is not among the snapshot's files")
            if info["sha256"] != p["sha256"]:
                bad("program.sha256", f"differs from the sha256 of {p['file']!r} in files")
            if p.get("constants") is not None and p["constants"] not in self.files:
                bad("program.constants", f"{p['constants']!r} is not among the snapshot's files")

        def shape2(key: str, items: Any, n: int) -> list[int]:
            if not isinstance(items, list) or len(items) != n:
                bad(f"program.{key}", f"must be a list of {n}")
            dims = []
            for it in items:
                shp = it.get("shape") if isinstance(it, dict) else None
                if (not isinstance(shp, list) or len(shp) != 2 or shp[0] != "batch" or type(shp[1]) is not int
                        or not 0 <= shp[1] <= 1 << 24 or not isinstance(it.get("name"), str)):
                    bad(f"program.{key}", 'each needs a name and a shape ["batch", width]')
                dims.append(shp[1])
            return dims

        shape2("inputs", p.get("inputs"), 2)
        (num_tasks,) = shape2("outputs", p.get("outputs"), 1)
        if self.tasks and num_tasks != len(self.tasks):
            bad("program.outputs", f"{num_tasks} logits per event, the manifest names {len(self.tasks)} tasks")
        rows = p.get("probe_rows")
        if type(rows) is not int or not 1 <= rows <= 1024:
            bad("program.probe_rows", f"must be an integer in 1..1024, got {rows!r}")
        logits = p.get("probe_logits")
        if (not isinstance(logits, list) or len(logits) != rows
                or any(not isinstance(r, list) or len(r) != num_tasks for r in logits)
                or any(type(x) not in (int, float) or not math.isfinite(x) for r in logits for x in r)):
            bad("program.probe_logits", f"must be {rows} rows of {num_tasks} finite numbers")
        if p.get("torch") is not None and not isinstance(p["torch"], str):
            bad("program.torch", "must be a string")

    def _check_row_probe(self, bad) -> None:
        p = self.row_probe

        def finite(xs: Any) -> bool:
            return (isinstance(xs, list) and len(xs) <= MAX_PROBE_WIDTH
                    and all(type(x) in (int, float) and math.isfinite(x) for x in xs))

        if not isinstance(p, dict) or set(p) != {"events", "scores"}:
            bad("row_probe", "must be an object with events and scores, or null")
        events, scores = p["events"], p["scores"]
        if not isinstance(events, list) or not 1 <= len(events) <= MAX_PROBE_EVENTS:
            bad("row_probe.events", f"must be a list of 1..{MAX_PROBE_EVENTS} events")
        if not isinstance(scores, list) or len(scores) != len(events):
            bad("row_probe.scores", f"must be a list of {len(events)} score lists (one per event)")
        for i, ev in enumerate(events):
            if not isinstance(ev, dict) or set(ev) != {"dense", "sparse"}:
                bad(f"row_probe.events[{i}]", "must be an object with dense and sparse")
            if not finite(ev["dense"]):
                bad(f"row_probe.events[{i}].dense", f"must be a list of at most {MAX_PROBE_WIDTH} finite numbers")
            sp = ev["sparse"]
            if not isinstance(sp, dict) or len(sp) > 1024:
                bad(f"row_probe.events[{i}].sparse", "must be an object of at most 1024 fields")
            for f, ids in sp.items():
                if (not 0 < len(f) <= 128 or not isinstance(ids, list) or len(ids) > MAX_PROBE_IDS
                        or any(type(x) is not int or not INT64_MIN <= x <= INT64_MAX for x in ids)):
                    bad(f"row_probe.events[{i}].sparse", f"field {f[:40]!r}: must be a list of at most "
                                                         f"{MAX_PROBE_IDS} int64 ids")
            s = scores[i]
            if not finite(s) or not 1 <= len(s) <= 1024:
                bad(f"row_probe.scores[{i}]", "must be a list of 1..1024 finite numbers (one per task)")

    @property
    def row_files(self) -> list[str]:
        return sorted(n for n in self.files if n.startswith("rows-") and n.endswith(".parquet"))


def rows_schema(dim: int, precision: str = "fp32") -> pa.Schema:
    """The row files' schema at width ``dim`` in ``precision`` (see the module doc)."""
    if precision == "fp32":
        return pa.schema([("table", pa.string()), ("id", pa.int64()), ("vector", pa.list_(pa.float32(), dim))])
    if precision == "fp16":
        return pa.schema([("table", pa.string()), ("id", pa.int64()), ("vector", pa.list_(pa.float16(), dim))])
    if precision == "int8":
        return pa.schema([("table", pa.string()), ("id", pa.int64()), ("vector", pa.list_(pa.uint8(), dim)),
                          ("scale", pa.float16()), ("bias", pa.float16())])
    raise SnapshotError(f"row precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def _encode_batch(b: pa.RecordBatch, dim: int, precision: str) -> pa.RecordBatch:
    """A float32 row batch in ``precision``'s schema."""
    if precision == "fp32":
        return b
    vectors = b.column("vector").flatten().to_numpy().reshape(-1, dim)
    enc = encode_rows(vectors, precision)
    vtype = pa.float16() if precision == "fp16" else pa.uint8()
    cols = [b.column("table"), b.column("id"),
            pa.FixedSizeListArray.from_arrays(pa.array(enc["vector"].reshape(-1), vtype), dim)]
    if precision == "int8":
        cols += [pa.array(enc["scale"], pa.float16()), pa.array(enc["bias"], pa.float16())]
    return pa.RecordBatch.from_arrays(cols, schema=rows_schema(dim, precision))


def rows_batch(table: str, ids: np.ndarray, vectors: np.ndarray | torch.Tensor) -> pa.RecordBatch:
    """One table's rows as a record batch in the snapshot's row schema."""
    if isinstance(vectors, torch.Tensor):
        vectors = vectors.detach().float().cpu().numpy()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int64)
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise SnapshotError(f"rows of {table!r}: {len(ids)} ids but vectors of shape {tuple(vectors.shape)}")
    dim = vectors.shape[1]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)
    return pa.RecordBatch.from_arrays([pa.array([table] * len(ids), pa.string()), pa.array(ids), vec],
                                      schema=rows_schema(dim))


def write_snapshot(out_dir, *, version: int, parent_version: int | None, kind: str,
                   dense_state: dict[str, torch.Tensor], rows: Iterable[pa.RecordBatch],
                   kafka_offsets: dict, metrics: dict, config_hash: str, newest_event_ms: int,
                   model_config: dict, store_config: dict | None = None,
                   rows_per_file: int = ROWS_PER_FILE, tasks: list[str] | None = None,
                   program: dict | None = None, program_data=None, evidence: dict | None = None,
                   model_line: str = "main", row_precision: str = "fp32", row_probe: dict | None = None,
                   deleted: dict | None = None) -> Path:
    """Write a complete snapshot directory; the manifest goes last so a half-written one has none.

    ``tasks``: the model's task names in output order. ``program``: the manifest's description of the
    exported dense network (``ExportedDense.manifest_entry``; a delta passes its parent's, with this
    version's probe logits), None when there is none; ``program_data``: the ``ExportedDense`` whose files a
    full snapshot writes (``program.json``, and its constants when it has any). ``evidence``: the quality
    evidence the trainer saw since the previous snapshot (``evidence.py``), None when there is none.
    ``model_line``: the model line the version belongs to (``serving.model_line``). ``row_precision``: how the
    row files hold the (float32) rows given (``rowcodec.py``); ``row_probe``: the manifest's row probe, or None,
    or a function called once every row is written that returns it (a probe made of rows seen on the way).

    A full, read-only or unwritable disk (or no file handle left) raises :class:`~streamrec.foundation.ResourceError`
    naming the snapshot and the file being written, and the half-written directory is removed so that it
    keeps no space."""
    out = Path(out_dir)
    if (out / MANIFEST).exists():
        raise SnapshotError(f"{out} already holds a snapshot")
    where = [out]  # the file being written, for the error line (pyarrow's and safetensors' errors name none)
    try:
        return _write_snapshot(out, where, version=version, parent_version=parent_version, kind=kind,
                               dense_state=dense_state, rows=rows, kafka_offsets=kafka_offsets, metrics=metrics,
                               config_hash=config_hash, newest_event_ms=newest_event_ms,
                               model_config=model_config, store_config=store_config, rows_per_file=rows_per_file,
                               tasks=tasks, program=program, program_data=program_data, evidence=evidence,
                               model_line=model_line, row_precision=row_precision, row_probe=row_probe,
                               deleted=deleted)
    except Exception as e:
        err = as_resource_error(e, f"writing snapshot v{int(version)}", str(where[0]))
        if err is None:
            raise
        if not (out / MANIFEST).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise err from e


def _write_snapshot(out: Path, where: list, *, version, parent_version, kind, dense_state, rows, kafka_offsets,
                    metrics, config_hash, newest_event_ms, model_config, store_config, rows_per_file,
                    tasks, program, program_data, evidence=None, model_line="main", row_precision="fp32",
                    row_probe=None, deleted=None) -> Path:
    from safetensors.torch import save_file

    if row_precision not in PRECISIONS:
        raise SnapshotError(f"row precision {row_precision!r} is not one of {', '.join(PRECISIONS)}")
    out.mkdir(parents=True, exist_ok=True)
    where[0] = out / DENSE
    state = {k: v.detach().cpu().contiguous().clone() for k, v in dense_state.items()}
    save_file(state, str(out / DENSE))
    names = [DENSE]
    if program_data is not None and kind == "full":
        where[0] = out / program["file"]
        (out / program["file"]).write_bytes(program_data.program_json)
        names.append(program["file"])
        if program.get("constants"):
            where[0] = out / program["constants"]
            save_file(program_data.constants, str(out / program["constants"]))
            names.append(program["constants"])
    n_rows, n_files = 0, 0
    writers: dict[int, list] = {}  # vector width -> [ParquetWriter, rows in its file]: one width per file
    try:
        for batch in rows:
            if isinstance(batch, pa.Table):
                batches = batch.to_batches()
            else:
                batches = [batch]
            for b in batches:
                if len(b) == 0:
                    continue
                dim = b.schema.field("vector").type.list_size
                b = _encode_batch(b.select(["table", "id", "vector"]).cast(rows_schema(dim)), dim, row_precision)
                w = writers.get(dim)
                if w is None or w[1] >= rows_per_file:
                    if w is not None:
                        w[0].close()
                    name = f"rows-{n_files:05d}.parquet"
                    n_files += 1
                    names.append(name)
                    where[0] = out / name
                    w = writers[dim] = [pq.ParquetWriter(str(out / name), rows_schema(dim, row_precision),
                                                       compression="zstd"), 0]
                w[0].write_batch(b)
                w[1] += len(b)
                n_rows += len(b)
    finally:
        for w in writers.values():
            w[0].close()
    if callable(row_probe):
        row_probe = row_probe()
    n_deleted = 0
    if deleted:
        where[0] = out / DELETED
        n_deleted = write_deleted(out, deleted)
        if n_deleted:
            names.append(DELETED)
    files = {n: {"sha256": sha256_file(out / n), "bytes": (out / n).stat().st_size} for n in names}
    m = Manifest(
        version=int(version), parent_version=None if parent_version is None else int(parent_version),
        kind=kind, created_ms=int(time.time() * 1000), newest_event_ms=int(newest_event_ms),
        config_hash=str(config_hash), model_config=_plain(model_config),
        kafka_offsets=_plain(kafka_offsets), metrics={k: float(v) for k, v in (metrics or {}).items()},
        rows=n_rows, files=files, store_config=_plain(store_config or {}),
        tasks=[str(t) for t in (tasks or [])], program=_plain(program) if program is not None else None,
        evidence=_plain(evidence) if evidence is not None else None, model_line=str(model_line),
        row_precision=str(row_precision), row_probe=_plain(row_probe) if row_probe is not None else None,
        deleted=n_deleted,
    )
    m.check()
    tmp = where[0] = out / (MANIFEST + ".tmp")
    tmp.write_bytes(m.to_json())
    os.replace(tmp, out / MANIFEST)
    return out


def _plain(obj: Any) -> Any:
    """JSON-safe copy: tuple keys such as (topic, partition) become 'topic:partition'."""
    if isinstance(obj, dict):
        return {(":".join(map(str, k)) if isinstance(k, tuple) else str(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return _plain(asdict(obj))
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


def read_manifest(snapshot_dir) -> Manifest:
    p = Path(snapshot_dir) / MANIFEST
    if not p.exists():
        raise SnapshotError(f"{p} does not exist (incomplete snapshot?)")
    return Manifest.from_json(p.read_bytes())


def verify_snapshot(snapshot_dir) -> Manifest:
    """Check every file against the manifest's size and sha256; return the manifest."""
    d = Path(snapshot_dir)
    m = read_manifest(d)
    for name, info in m.files.items():
        p = d / name
        if not p.exists():
            raise SnapshotError(f"{name}: missing")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise SnapshotError(f"{name}: {size} bytes, manifest says {info['bytes']} (truncated?)")
        if sha256_file(p) != info["sha256"]:
            raise SnapshotError(f"{name}: sha256 does not match the manifest (corrupt)")
    return m


def read_dense(snapshot_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(Path(snapshot_dir) / DENSE))
    except Exception as e:  # safetensors raises several types on bad bytes
        raise SnapshotError(f"{DENSE}: cannot be read: {e}") from None


MAX_EXPANSION = 64  # a row file may decode to at most this many times its size (+ 64 MiB): no zip bombs


def iter_rows(snapshot_dir, manifest: Manifest | None = None,
              dim: int | dict[str, int] | None = None, encoded: bool = False) -> Iterator[tuple]:
    """Yield ``(table, ids int64[n], vectors float32[n, dim])`` groups from the row files.

    ``dim``: the width every vector must have, checked from each file's schema before any row is read; a
    ``{table: width}`` mapping checks each table's rows against its own width (a file of a width no table
    has is refused before its rows are read). Vectors come decoded to float32 whatever the manifest's
    ``row_precision``; a file whose schema is not that precision's row schema is refused. ``encoded``: yield
    ``(table, ids, vectors, rows)`` where ``rows`` is the group as the file holds it (``encode_rows``'s dict)."""
    d = Path(snapshot_dir)
    m = manifest or read_manifest(d)
    precision = m.row_precision
    want_type = {"fp32": pa.float32(), "fp16": pa.float16(), "int8": pa.uint8()}[precision]
    for name in m.row_files:
        try:
            pf = pq.ParquetFile(str(d / name))
            # the checksums prove only that these are the writer's bytes: a file not in the row schema
            # raised KeyError/AttributeError below, an UNKNOWN error that pushers retry
            sch = pf.schema_arrow
            vt = sch.field("vector").type if "vector" in sch.names else None
            if ("table" not in sch.names or not pa.types.is_string(sch.field("table").type)
                    or "id" not in sch.names or sch.field("id").type != pa.int64()
                    or vt is None or not pa.types.is_fixed_size_list(vt) or vt.value_type != want_type
                    or (precision == "int8") != ("scale" in sch.names and "bias" in sch.names)
                    or (precision == "int8" and (sch.field("scale").type != pa.float16()
                                                 or sch.field("bias").type != pa.float16()))):
                raise SnapshotError(f"{name}: not in the {precision} row schema (table: string, id: int64, "
                                    f"vector: fixed_size_list<{want_type}>"
                                    f"{', scale: halffloat, bias: halffloat' if precision == 'int8' else ''}: the "
                                    f"manifest's row_precision is {precision}), got {sch}")
            if isinstance(dim, dict):
                if vt.list_size not in set(dim.values()):
                    raise SnapshotError(f"{name}: vectors of width {vt.list_size}, no table of the model has it "
                                        f"(widths {sorted(set(dim.values()))})")
            elif dim is not None and vt.list_size != dim:
                raise SnapshotError(f"{name}: vectors of width {vt.list_size}, the model's embedding_dim is {dim}")
            decoded = pf.metadata.num_rows * (vt.list_size * 4 + 8)
            if decoded > MAX_EXPANSION * (d / name).stat().st_size + (64 << 20):
                raise SnapshotError(f"{name}: {pf.metadata.num_rows} rows of width {vt.list_size} from "
                                    f"{(d / name).stat().st_size} bytes (more than {MAX_EXPANSION}x: refused)")
            for b in pf.iter_batches(batch_size=65_536):
                tables = b.column("table").to_numpy(zero_copy_only=False)
                ids = b.column("id").to_numpy()
                vec = b.column("vector")
                width = vec.type.list_size
                enc = {"vector": vec.flatten().to_numpy().reshape(-1, width)}
                if precision == "int8":
                    enc["scale"] = b.column("scale").to_numpy(zero_copy_only=False)
                    enc["bias"] = b.column("bias").to_numpy(zero_copy_only=False)
                vectors = decode_rows(enc, precision)
                for t in np.unique(tables):
                    if isinstance(dim, dict) and str(t) in dim and dim[str(t)] != width:
                        raise SnapshotError(f"{name}: table {str(t)!r} has vectors of width {width}, the model's "
                                            f"table has {dim[str(t)]}")
                    mask = tables == t
                    if encoded:
                        yield str(t), ids[mask], vectors[mask], {k: a[mask] for k, a in enc.items()}
                    else:
                        yield str(t), ids[mask], vectors[mask]
        except (pa.ArrowException, OSError) as e:
            raise SnapshotError(f"{name}: cannot be read: {e}") from None
