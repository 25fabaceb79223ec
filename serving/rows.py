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
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .idindex import IdIndex


class MemoryRows:
    """Per table a sorted id array; table ``t``'s rows are ``weight[base[t] : base[t] + len(ids[t])]`` in id
    order, its first ``dims[t]`` columns (``weight`` is as wide as the widest table; narrower rows are
    zero-padded). The last row of ``weight`` is zeros (a placeholder index for ids not held).

    ``field_tables``: per field (in the model's field order) the table its ids are looked up in; a table two
    fields share is held once. Pooling gives ``[batch, pooled_dim]``: field ``f``'s sum-pooled rows in its
    table's ``dims`` columns, fields concatenated in order (the model's ``pooled`` input)."""

    def __init__(self, field_tables: dict[str, str], dims: dict[str, int], ids: dict[str, np.ndarray],
                 weight: torch.Tensor):
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
        self.weight = weight
        self.rows = n
        self.index = {t: IdIndex(self.ids[t], np.arange(self.base[t], self.base[t] + len(self.ids[t])))
                      for t in self.tables}
        self.uniform = len(set(self.dims[self.field_tables[f]] for f in self.fields)) <= 1
        self.pooled_dim = sum(self.dims[self.field_tables[f]] for f in self.fields)

    @classmethod
    def build(cls, field_tables: dict[str, str], dims: dict[str, int], device: torch.device,
              parts: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> "MemoryRows":
        """From per-table ``(ids, vectors)`` parts; a later part wins for a repeated id."""
        width = max(dims.values(), default=0)
        ids_out, segs = {}, []
        for t in dims:
            ps = parts.get(t) or []
            if not ps:
                ids_out[t] = np.empty(0, np.int64)
                continue
            ids = np.concatenate([p[0] for p in ps]).astype(np.int64, copy=False)
            vec = np.concatenate([p[1] for p in ps]).astype(np.float32, copy=False)
            # last occurrence of each id, in id order
            rev_ids = ids[::-1]
            uniq, first_in_rev = np.unique(rev_ids, return_index=True)
            take = len(ids) - 1 - first_in_rev
            ids_out[t] = uniq
            rows = np.ascontiguousarray(vec[take])
            if rows.shape[1] < width:
                rows = np.pad(rows, ((0, 0), (0, width - rows.shape[1])))
            segs.append(torch.from_numpy(rows))
        segs.append(torch.zeros((1, width), dtype=torch.float32))
        weight = torch.cat(segs).to(device).contiguous()
        return cls(field_tables, dims, ids_out, weight)

    def parts(self) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """This version's rows as build parts, per table (a delta starts from these)."""
        w = self.weight.detach().cpu().numpy()
        return {t: [(self.ids[t], w[self.base[t]:self.base[t] + len(self.ids[t]), :self.dims[t]])]
                for t in self.tables if len(self.ids[t])}

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
        if not misses:
            out = F.embedding_bag(index, self.weight, offsets, mode="sum")
        else:  # gather, fill the rows of ids not held, pool in the same order
            rows = self.weight.index_select(0, index)
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
