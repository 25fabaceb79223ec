"""The device tier's memory: every table's hot rows of one width in one tensor.

A training step reads and updates the hot rows of all tables with one gather and one
row-wise Adagrad per width (``streamrec.trainer.fused_step``), so the rows of every table
of a width live in one ``w [rows + 1, dim]`` tensor with their Adagrad sums ``acc [rows + 1]``.
Table ``t``'s rows occupy ``[base[t], base[t] + len(t.hot))`` in ``t``'s slot order, and its
``HotTable.w`` / ``acc`` are views of that range, as are its host-side bookkeeping arrays
(``dirty``, ``ep``, ``ts``: the arena's own arrays of the same names): the per-table paths
(lookup, migration, write-back, checkpoint) and the fused step read and write the same memory.

The last row (``scratch``) belongs to no table: a fixed-shape step on CUDA pads its unique
rows with it and writes their (unused) updates there; no lookup ever returns it.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from .table import Table


class HotArena:
    """The hot rows of every table of width ``dim`` on ``device`` (module doc)."""

    def __init__(self, dim: int, device: torch.device):
        self.dim = int(dim)
        self.device = device
        self.base: dict[str, int] = {}
        self.w = torch.zeros((1, self.dim), dtype=torch.float32, device=device)
        self.acc = torch.zeros(1, dtype=torch.float32, device=device)
        self.dirty = np.zeros(1, bool)  # changed since the last write-back to the cold tier, per row
        self.ep = np.zeros(1, np.int64)  # epoch of the last change, per row
        self.ts = np.zeros(1, np.float64)  # last-touched time, per row

    @property
    def scratch(self) -> int:
        """The row index no table owns (padding of fixed-shape steps)."""
        return int(self.w.shape[0]) - 1

    def rebuild(self, tables: Iterable[Table]) -> None:
        """Lay ``tables``' hot rows out again (after a hot-set change) and point their views here."""
        tables = list(tables)
        dev = self.device
        self.w = torch.cat([*(t.hot.w.to(dev) for t in tables), torch.zeros((1, self.dim), device=dev)]).contiguous()
        self.acc = torch.cat([*(t.hot.acc.to(dev) for t in tables), torch.zeros(1, device=dev)]).contiguous()
        self.dirty = np.concatenate([*(t.hot.dirty for t in tables), np.zeros(1, bool)])
        self.ep = np.concatenate([*(t.hot.ep for t in tables), np.zeros(1, np.int64)])
        self.ts = np.concatenate([*(t.hot.ts for t in tables), np.zeros(1, np.float64)])
        self.base = {}
        at = 0
        for t in tables:
            n = len(t.hot)
            self.base[t.name] = at
            h = t.hot
            h.w, h.acc = self.w[at:at + n], self.acc[at:at + n]
            h.dirty, h.ep, h.ts = self.dirty[at:at + n], self.ep[at:at + n], self.ts[at:at + n]
            at += n

    def mark_written(self, slots: np.ndarray, epoch: int, now: float) -> None:
        """Rows ``slots`` (repeats allowed) were just updated: dirty, stamped with ``epoch`` and ``now``."""
        self.dirty[slots] = True
        self.ep[slots] = epoch
        self.ts[slots] = now


def arenas_of(tables: Iterable[Table], device: torch.device) -> dict[int, HotArena]:
    """One arena per table width, tables laid out in the order given."""
    by_dim: dict[int, list[Table]] = {}
    for t in tables:
        by_dim.setdefault(t.dim, []).append(t)
    out = {}
    for dim, ts in by_dim.items():
        a = HotArena(dim, device)
        a.rebuild(ts)
        out[dim] = a
    return out
