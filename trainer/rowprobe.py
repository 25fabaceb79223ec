"""The trainer's side of a snapshot's row probe (``manifest.row_probe``, ``streamrec.snapshot.row_probe``).

``RowSample`` wraps the row batches as they stream into ``write_snapshot`` and keeps the first few rows of
each table (nothing else is held); ``build_row_probe`` then makes up to ``PROBE_EVENTS`` events of those ids
(per field one id of its table, none when the snapshot carries no row of that table; dense values from the
fixed probe seed) and scores them with the model on the rows as serving will hold them
(``round_trip`` in the snapshot's row precision). Serving scores the same events after it loads the version
and refuses the push when its scores differ.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import torch

from streamrec.model import predict_batch
from streamrec.snapshot import PROBE_EVENTS, probe_batch, probe_inputs, round_trip


class RowSample:
    """An iterator over row batches (``pyarrow`` record batches or tables in the snapshot's row schema) that
    keeps up to ``per_table`` rows of each of ``tables`` as it passes them on; once every table has its
    rows, the batches pass untouched."""

    def __init__(self, rows: Iterable, tables: Iterable[str], per_table: int = PROBE_EVENTS):
        self.rows = rows
        self.tables = set(tables)
        self.per_table = per_table
        self.kept: dict[str, tuple[list[int], list[np.ndarray]]] = {}

    def full(self) -> bool:
        return all(len(self.kept.get(t, ((),))[0]) >= self.per_table for t in self.tables)

    def __iter__(self) -> Iterator:
        for batch in self.rows:
            if len(batch) and not self.full():
                self._keep(batch)
            yield batch

    def _keep(self, batch) -> None:
        tables = np.asarray(batch.column("table").to_numpy(zero_copy_only=False)).astype(str)
        width = batch.schema.field("vector").type.list_size
        vectors = batch.column("vector")
        if isinstance(vectors, pa.ChunkedArray):
            vectors = vectors.combine_chunks()
        flat = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
        ids_col = np.asarray(batch.column("id").to_numpy(zero_copy_only=False))
        for t in np.unique(tables):
            ids, vecs = self.kept.setdefault(str(t), ([], []))
            need = self.per_table - len(ids)
            if need <= 0:
                continue
            idx = np.flatnonzero(tables == t)[:need]
            ids.extend(int(x) for x in ids_col[idx])
            vecs.extend(np.asarray(flat[idx], dtype=np.float32))


def build_row_probe(model, model_cfg, sample: RowSample, precision: str) -> dict[str, Any] | None:
    """The manifest's ``row_probe`` from the rows ``sample`` kept, or None when it kept none (or the model's
    scores on them are not finite)."""
    kept = {t: (np.asarray(ids, np.int64), round_trip(np.stack(vecs), precision))
            for t, (ids, vecs) in sample.kept.items() if ids}
    fields = list(model_cfg.field_names)
    tables = dict(model_cfg.field_tables)
    n = min(PROBE_EVENTS, max((len(kept[tables[f]][0]) for f in fields if tables[f] in kept), default=0))
    if n == 0:
        return None
    dense, _ = probe_inputs(model_cfg.dense_dim, 0, rows=n)
    events = []
    for i in range(n):
        sparse = {}
        for f in fields:
            got = kept.get(tables[f])
            sparse[f] = [int(got[0][i % len(got[0])])] if got is not None else []
        events.append({"dense": [float(x) for x in dense[i].tolist()], "sparse": sparse})
    probe = {"events": events, "scores": []}
    batch = probe_batch(probe, fields, model_cfg.dense_dim)

    def lookup(table: str, ids: np.ndarray) -> torch.Tensor:
        have_ids, vecs = kept[table]
        pos = {int(x): j for j, x in enumerate(have_ids)}
        return torch.from_numpy(np.ascontiguousarray(vecs[[pos[int(x)] for x in ids]]))

    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            scores = predict_batch(model, batch, model_cfg, lookup, dev)
    finally:
        model.train(was_training)
    scores = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(scores).all():  # non-finite weights: serving refuses them on their own, no probe needed
        return None
    probe["scores"] = [[float(x) for x in row] for row in scores]
    return probe
