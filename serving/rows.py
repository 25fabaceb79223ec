"""The in-memory rows of a served version, and pooling a request's ids with them.

Why: a Predict request touches thousands of ids. Resolving them with one
compiled hash-index probe per field (``IdIndex``; a binary search per id cost as
much as the forward pass at batch 512), and pooling
every field with one ``embedding_bag`` over one weight tensor, costs a fraction of
going through the store per field (``np.unique``, tier split, gathers, a lock).
Ids not held in memory are read from the version's RocksDB store in one batched
read per field (``cold_lookup``), which also gives unseen ids their deterministic
init. A ``MemoryRows`` never changes once built (a delta builds a new one from
its parent's), so any number of requests read it without a lock.

Sums run over the same rows in the same order as ``streamrec.model.pool_sum``, so scores
equal the trainer's. A table that several fields share is held once and looked up for each of them.

Compressed rows (``serving.row_precision``, the snapshot's ``row_precision``): the weight is held in the
snapshot's precision, float16, or uint8 with a float16 scale and bias per row, exactly as the snapshot
carried it. Pooling then dequantizes only the gathered rows (gather, decode to float32 as
``streamrec.snapshot.decode_rows`` does, ``embedding_bag`` over them in order), so a score equals scoring
the snapshot's ``round_trip`` values, whether an id is held in memory or read from the store (which holds
the decoded float32 rows).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from streamrec.snapshot import encode_rows

from .idindex import IdIndex

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.uint8}


class MemoryRows:
    """Per table a sorted id array; table ``t``'s rows are ``weight[base[t] : base[t] + len(ids[t])]`` in id
    order, its first ``dims[t]`` columns (``weight`` is as wide as the widest table; narrower rows are
    zero-padded). The last row of ``weight`` is zeros (a placeholder index for ids not held).

    ``field_tables``: per field (in the model's field order) the table its ids are looked up in; a table two
    fields share is held once. Pooling gives ``[batch, pooled_dim]``: field ``f``'s sum-pooled rows in its
    table's ``dims`` columns, fields concatenated in order (the model's ``pooled`` input).

    ``precision`` follows ``weight``'s dtype: float32 (fp32), float16 (fp16), or uint8 (int8, with ``scale``
    and ``bias``, float16 ``[rows + 1]``, one per row of ``weight``)."""

    def __init__(self, field_tables: dict[str, str], dims: dict[str, int], ids: dict[str, np.ndarray],
                 weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        self.field_tables = dict(field_tables)
        self.fields = list(self.field_tables)
        self.tables = list(dims)
        self.dims = {t: int(d) for t, d in dims.items()}
        self.dim = max(self.dims.values(), default=0)  # the width of ``weight``
        self.ids = {t: ids.get(t, np.empty(0, np.int64)) for t in self.tables}
        self.base = {}
        n = 0
        for t in self.tables:
            self.base[t] = n
            n += len(self.ids[t])
        if weight.shape != (n + 1, self.dim):
            raise ValueError(f"weight of shape {tuple(weight.shape)}, expected ({n + 1}, {self.dim})")
        self.precision = next((p for p, dt in DTYPES.items() if dt == weight.dtype), None)
        if self.precision is None:
            raise ValueError(f"weight of dtype {weight.dtype}, expected one of {list(DTYPES.values())}")
        if (self.precision == "int8") != (scale is not None and bias is not None):
            raise ValueError("a uint8 weight needs a scale and a bias per row (and only it has them)")
        if scale is not None and (scale.shape != (n + 1,) or bias.shape != (n + 1,)):
            raise ValueError(f"scale/bias of shapes {tuple(scale.shape)}/{tuple(bias.shape)}, expected ({n + 1},)")
        self.weight = weight
        self.scale = scale
        self.bias = bias
        self.rows = n
        self.index = {t: IdIndex(self.ids[t], np.arange(self.base[t], self.base[t] + len(self.ids[t])))
                      for t in self.tables}
        self.uniform = len(set(self.dims[self.field_tables[f]] for f in self.fields)) <= 1
        self.pooled_dim = sum(self.dims[self.field_tables[f]] for f in self.fields)

    @classmethod
    def build(cls, field_tables: dict[str, str], dims: dict[str, int], device: torch.device,
              parts: dict[str, list[tuple[np.ndarray, np.ndarray | dict]]], precision: str = "fp32") -> "MemoryRows":
        """From per-table ``(ids, rows)`` parts; a later part wins for a repeated id. ``rows``: the rows encoded in
        ``precision`` (``encode_rows``'s dict, as the snapshot carried them), or float32 vectors, encoded here."""
        if precision not in DTYPES:
            raise ValueError(f"row precision {precision!r} is not one of {list(DTYPES)}")
        width = max(dims.values(), default=0)
        keys = ("vector", "scale", "bias") if precision == "int8" else ("vector",)
        ids_out, segs = {}, {k: [] for k in keys}
        for t in dims:
            ps = parts.get(t) or []
            if not ps:
                ids_out[t] = np.empty(0, np.int64)
                continue
            encs = [p[1] if isinstance(p[1], dict) else encode_rows(p[1], precision) for p in ps]
            ids = np.concatenate([p[0] for p in ps]).astype(np.int64, copy=False)
            # last occurrence of each id, in id order
            rev_ids = ids[::-1]
            uniq, first_in_rev = np.unique(rev_ids, return_index=True)
            take = len(ids) - 1 - first_in_rev
            ids_out[t] = uniq
            for k in keys:
                a = np.ascontiguousarray(np.concatenate([e[k] for e in encs])[take])
                if k == "vector" and a.shape[1] < width:
                    a = np.pad(a, ((0, 0), (0, width - a.shape[1])))
                segs[k].append(torch.from_numpy(a))
        dt = DTYPES[precision]
        segs["vector"].append(torch.zeros((1, width), dtype=dt))
        weight = torch.cat(segs["vector"]).to(dt).to(device).contiguous()
        scale = bias = None
        if precision == "int8":  # the placeholder row: q 0, scale 0, bias 0 decodes to zeros
            scale = torch.cat(segs["scale"] + [torch.zeros(1, dtype=torch.float16)]).to(device).contiguous()
            bias = torch.cat(segs["bias"] + [torch.zeros(1, dtype=torch.float16)]).to(device).contiguous()
        return cls(field_tables, dims, ids_out, weight, scale, bias)

    def parts(self) -> dict[str, list[tuple[np.ndarray, dict]]]:
        """This version's rows as build parts, per table, encoded in its precision (a delta starts from these)."""
        enc = self.encoded()
        out = {}
        for t in self.tables:
            if not len(self.ids[t]):
                continue
            lo, hi = self.base[t], self.base[t] + len(self.ids[t])
            out[t] = [(self.ids[t], {k: (a[lo:hi, :self.dims[t]] if k == "vector" else a[lo:hi])
                                     for k, a in enc.items()})]
        return out

    def encoded(self) -> dict[str, np.ndarray]:
        """The held tensors as numpy (``vector``; ``scale`` and ``bias`` for int8), placeholder row included."""
        out = {"vector": self.weight.detach().cpu().numpy()}
        if self.scale is not None:
            out["scale"] = self.scale.detach().cpu().numpy()
            out["bias"] = self.bias.detach().cpu().numpy()
        return out

    def nbytes(self) -> int:
        """Bytes of the held row tensors (weight, and scale and bias for int8)."""
        return sum(int(t.numel() * t.element_size()) for t in (self.weight, self.scale, self.bias) if t is not None)

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of ``weight`` decoded to float32 (``decode_rows``: ``q * scale + bias`` for int8)."""
        rows = self.weight.index_select(0, index)
        if self.precision == "fp32":
            return rows
        rows = rows.float()
        if self.precision == "int8":
            rows = rows * self.scale.index_select(0, index).float().unsqueeze(1) \
                + self.bias.index_select(0, index).float().unsqueeze(1)
        return rows

    def contains(self, table: str, ids: np.ndarray) -> np.ndarray:
        rows, _ = self.index[table].find(ids, -1)
        return rows >= 0

    def pooled(self, batch, cold_lookup: Callable[[str, np.ndarray], torch.Tensor]) -> torch.Tensor:
        """Sum-pooled embeddings ``[batch, pooled_dim]`` of an ``streamrec.ingest.EventBatch``.

        ``cold_lookup(table, unique_ids)`` gives the rows of ids not held in memory."""
        n_ev = len(batch.ts)
        zero_row = self.rows
        idx_parts, off_parts, misses = [], [], []
        total = 0
        for f in self.fields:
            t = self.field_tables[f]
            j = batch.sparse[f]
            vals = j.values
            idx, n_miss = self.index[t].find(vals, zero_row)
            if n_miss:
                miss = np.flatnonzero(idx == zero_row)
                misses.append((miss + total, t, vals[miss]))
            idx_parts.append(idx)
            off_parts.append(j.offsets[:-1] + total)
            total += len(vals)
        dev = self.weight.device
        index = torch.from_numpy(np.concatenate(idx_parts)).to(dev)
        offsets = torch.from_numpy(np.concatenate(off_parts)).to(dev)
        if not misses and self.precision == "fp32":
            out = F.embedding_bag(index, self.weight, offsets, mode="sum")
        else:  # gather (decoded), fill the rows of ids not held, pool in the same order
            rows = self.gather(index)
            for pos, t, ids in misses:
                uniq, inv = np.unique(ids, return_inverse=True)
                got = cold_lookup(t, uniq).to(dev)
                d = self.dims[t]
                rows[torch.from_numpy(pos).to(dev), :d] = got[torch.from_numpy(inv.reshape(-1)).to(dev)]
            out = F.embedding_bag(torch.arange(total, device=dev), rows, offsets, mode="sum")
        per_field = out.view(len(self.fields), n_ev, self.dim)
        if self.uniform and (not self.fields or self.dims[self.field_tables[self.fields[0]]] == self.dim):
            return per_field.transpose(0, 1).reshape(n_ev, self.pooled_dim)
        return torch.cat([per_field[i, :, :self.dims[self.field_tables[f]]] for i, f in enumerate(self.fields)],
                         dim=1)
