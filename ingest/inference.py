"""The model schema of an event file: which sparse fields it has and how wide its dense vector is.

Every part must read events with the same fields and dense width. When a user
points ``demo --data``, ``produce`` or ``generate --like`` at a file without a
config, the schema is read from the file (a sample of its first events, or its
header) instead of failing half-way with "dense has 1 values, model expects 4";
when a config is given, any disagreement is reported before anything starts,
naming the field.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .datasets import LAYOUTS, DatasetError, _csv_header, _open, detect_format, layout_model

if TYPE_CHECKING:
    from streamrec.foundation.model_config import ModelConfig

SAMPLE_EVENTS = 1000  # JSON lines and Parquet rows read to infer the schema
_RESERVED = ("label", "labels", "ts", "request_id")  # event columns that are not sparse fields


@dataclass
class DataSchema:
    """What a file holds, in model terms."""

    path: str
    format: str
    fields: list[str]
    dense_dim: int

    def toml(self) -> str:
        """The ``[model]`` keys to save and give every part (``--config``)."""
        fields = ", ".join(f'{{ name = "{n}" }}' for n in self.fields)
        return f"[model]\ndense_dim = {self.dense_dim}\nfields = [{fields}]\n"

    def apply(self, model: ModelConfig) -> ModelConfig:
        """A copy of ``model`` (the ``[model]`` section) with these fields and dense width (its other keys
        kept)."""
        import copy

        from streamrec.foundation.model_config import FieldSpec

        model = copy.deepcopy(model)
        old = {f.name: f for f in model.fields}
        model.fields = [old.get(n) or FieldSpec(n) for n in self.fields]
        model.dense_dim = self.dense_dim
        return model

    def mismatches(self, model_config: ModelConfig) -> list[str]:
        """Each way the model config and this file disagree, naming the field (empty: they agree)."""
        model = model_config.field_names
        out = [f"sparse field {f!r} is in {self.path} but not in the model config (model.fields: "
               f"{', '.join(model)})" for f in self.fields if f not in model]
        if self.format in LAYOUTS or self.format in ("csv", "tsv"):  # a fixed column set: every field is a column
            out += [f"model field {f!r} has no column in {self.path}" for f in model if f not in self.fields]
        if self.dense_dim != model_config.dense_dim:
            out.append(f"dense: {self.path} has {self.dense_dim} values per event, the model config has "
                       f"model.dense_dim = {model_config.dense_dim}")
        return out


def infer_schema(path: str | os.PathLike, format: str | None = None, sample: int = SAMPLE_EVENTS) -> DataSchema:
    """Read the schema from the file: a layout's fixed one, a CSV header, or the first ``sample`` events."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file")
    fmt = format or detect_format(p)
    if fmt in LAYOUTS:
        fields, dense = layout_model(fmt)
    elif fmt in ("csv", "tsv"):
        fields, dense = _from_header(p, "," if fmt == "csv" else "\t")
    elif fmt == "jsonl":
        fields, dense = _from_jsonl(p, sample)
    elif fmt == "parquet":
        fields, dense = _from_parquet(p, sample)
    else:
        raise DatasetError(f"{p}: cannot infer a schema from format {fmt!r}")
    if not fields:
        raise DatasetError(f"{p}: no sparse field found (a model needs at least one): nothing to embed")
    return DataSchema(str(p), fmt, fields, dense)


def _dense_width(names: list[str], where: str) -> int:
    idx = sorted(int(n[len("dense_"):]) for n in names if n.startswith("dense_") and n[len("dense_"):].isdigit())
    if idx != list(range(len(idx))):
        raise DatasetError(f"{where}: dense columns must be dense_0..dense_{len(idx) - 1} without gaps, got "
                           f"{', '.join(f'dense_{i}' for i in idx)}")
    return len(idx)


def _from_header(p: Path, delimiter: str) -> tuple[list[str], int]:
    header = _csv_header(p, delimiter)
    if header == [""]:
        raise DatasetError(f"{p}: the file is empty or its first line is blank; it needs a header row naming its "
                           "columns (label, ts, dense_0.., one per sparse field)")
    dense = _dense_width(header, str(p))
    fields = [c for c in header if c not in _RESERVED and not (c.startswith("dense_") and c[6:].isdigit())]
    return fields, dense


def _from_jsonl(p: Path, sample: int) -> tuple[list[str], int]:
    fields: dict[str, None] = {}  # in order of first appearance
    dense: int | None = None
    with _open(p) as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")
        for lineno, line in itertools.islice(((i, x) for i, x in enumerate(lines, 1) if x.strip()), sample):
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{p}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(ev, dict):
                raise DatasetError(f"{p}:{lineno}: an event must be a JSON object")
            sparse = ev.get("sparse") or {}
            if not isinstance(sparse, dict):
                raise DatasetError(f"{p}:{lineno}: 'sparse' must be an object mapping field name to ids")
            for opt in ("user", "item"):
                if opt in ev:
                    fields.setdefault(opt, None)
            for f in sparse:
                fields.setdefault(str(f), None)
            width = len(ev.get("dense") or [])
            if dense is None:
                dense = width
            elif width != dense:
                raise DatasetError(f"{p}:{lineno}: dense has {width} values, the events before it have {dense}: "
                                   "every event needs the same dense width")
    return list(fields), dense or 0


def _from_parquet(p: Path, sample: int) -> tuple[list[str], int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(str(p))
        names = pf.schema_arrow.names
        dense = 0
        if "dense" in names:
            first = next(pf.iter_batches(batch_size=max(1, sample), columns=["dense"]), None)
            widths = {len(v) for v in first.column(0).to_pylist() if v is not None} if first is not None else set()
            if len(widths) > 1:
                raise DatasetError(f"{p}: the dense column holds vectors of widths {sorted(widths)}: every event "
                                   "needs the same dense width")
            dense = widths.pop() if widths else 0
        else:
            dense = _dense_width(names, str(p))
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{p}: not a readable Parquet file: {e}") from None
    fields = [c for c in names if c not in (*_RESERVED, "dense") and not (c.startswith("dense_") and c[6:].isdigit())]
    return fields, dense
