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

Sums run over the same rows in the same order as ``streamrec.trainer.pool_sum``, so scores
equal the trainer's.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .idindex import IdIndex


class MemoryRows:
    """Per field a sorted id array; field ``f``'s rows are ``weight[base[f] : base[f] + len(ids[f])]``
    in id order. The last row of ``weight`` is zeros (a placeholder index for ids not held)."""

    def __init__(self, fields: list[str], dim: int, ids: dict[str, np.ndarray], weight: torch.Tensor):
        self.fields = list(fields)
        self.dim = int(dim)
        self.ids = {f: ids.get(f, np.empty(0, np.int64)) for f in self.fields}
        self.base = {}
        n = 0
        for f in self.fields:
            self.base[f] = n
            n += len(self.ids[f])
        if weight.shape != (n + 1, self.dim):
            raise ValueError(f"weight of shape {tuple(weight.shape)}, expected ({n + 1}, {self.dim})")
        self.weight = weight
        self.rows = n
        self.index = {f: IdIndex(self.ids[f], np.arange(self.base[f], self.base[f] + len(self.ids[f])))
                      for f in self.fields}

    @classmethod
    def build(cls, fields: list[str], dim: int, device: torch.device,
              parts: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> "MemoryRows":
        """From per-field ``(ids, vectors)`` parts; a later part wins for a repeated id."""
        ids_out, segs = {}, []
        for f in fields:
            ps = parts.get(f) or []
            if not ps:
                ids_out[f] = np.empty(0, np.int64)
                continue
            ids = np.concatenate([p[0] for p in ps]).astype(np.int64, copy=False)
            vec = np.concatenate([p[1] for p in ps]).astype(np.float32, copy=False)
            # last occurrence of each id, in id order
            rev_ids = ids[::-1]
            uniq, first_in_rev = np.unique(rev_ids, return_index=True)
            take = len(ids) - 1 - first_in_rev
            ids_out[f] = uniq
            segs.append(torch.from_numpy(np.ascontiguousarray(vec[take])))
        segs.append(torch.zeros((1, dim), dtype=torch.float32))
        weight = torch.cat(segs).to(device).contiguous()
        return cls(fields, dim, ids_out, weight)

    def parts(self) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
        """This version's rows as build parts (a delta starts from these)."""
        w = self.weight.detach().cpu().numpy()
        return {f: [(self.ids[f], w[self.base[f]:self.base[f] + len(self.ids[f])])] for f in self.fields
                if len(self.ids[f])}

    def contains(self, field: str, ids: np.ndarray) -> np.ndarray:
        rows, _ = self.index[field].find(ids, -1)
        return rows >= 0

    def pooled(self, batch, cold_lookup: Callable[[str, np.ndarray], torch.Tensor]) -> torch.Tensor:
        """Sum-pooled embeddings ``[batch, fields, dim]`` of an ``streamrec.ingest.EventBatch``.

        ``cold_lookup(field, unique_ids)`` gives the rows of ids not held in memory."""
        n_ev = len(batch.ts)
        zero_row = self.rows
        idx_parts, off_parts, misses = [], [], []
        total = 0
        for f in self.fields:
            j = batch.sparse[f]
            vals = j.values
            idx, n_miss = self.index[f].find(vals, zero_row)
            if n_miss:
                miss = np.flatnonzero(idx == zero_row)
                misses.append((miss + total, f, vals[miss]))
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
            for pos, f, ids in misses:
                uniq, inv = np.unique(ids, return_inverse=True)
                got = cold_lookup(f, uniq).to(dev)
                rows[torch.from_numpy(pos).to(dev)] = got[torch.from_numpy(inv.reshape(-1)).to(dev)]
            out = F.embedding_bag(torch.arange(total, device=dev), rows, offsets, mode="sum")
        return out.view(len(self.fields), n_ev, self.dim).transpose(0, 1)
