"""The plain in-memory baseline: every embedding row resident in one device tensor per
width, no store, no tiers. Same deterministic initial rows and the same row-wise Adagrad as
the store, so the tiered trainer can be checked against it (equivalence tests) and
compared against it (``bench train``).

Ids are unbounded in the stream, so the baseline takes a vocabulary per field up
front (all ids it will see), the way DLRM's reference pre-indexes Criteo. Rows are
kept per table (``model.tables``, each at its own dim): fields that share a table
share its rows, their vocabularies united.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import torch
from streamrec.embedding_store import adagrad_rows, adagrad_rows_np, init_rows
from streamrec.foundation import table_salt
from streamrec.model import build_model, predict_batch

from .fused_step import FusedStep
from .dense_optimizers import dense_optimizer

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.trainer.trainer_config import TrainerConfig


class _Arena:
    """Every row of one width, resident (the store's ``HotArena`` layout: a scratch row last)."""

    def __init__(self, w: torch.Tensor, acc: torch.Tensor):
        self.w, self.acc = w, acc

    @property
    def scratch(self) -> int:
        return int(self.w.shape[0]) - 1


class MemoryDLRM:
    """The baseline, trained by the same fused step as the tiered trainer (``fused_step.py``) with every
    row resident in one device tensor per width: a :class:`~.step_types.RowSource` that never has a
    cold row."""

    def __init__(self, model: ModelConfig, trainer: TrainerConfig, store: StoreConfig, vocab: Mapping[str, np.ndarray],
                 device: torch.device | str = "cpu", init_chunk: int = 1 << 17):
        """``model``: the tables and the network; ``trainer``: the dense optimizer; ``store``: the rows' Adagrad
        and initial scale (the tiered store's own, so both start from the same rows)."""
        self.model_cfg = model
        self.device = torch.device(device)
        self.fields = model.field_names
        self.model = build_model(model).to(self.device)
        self.opt = dense_optimizer(self.model, trainer.dense_optimizer, trainer.dense_lr)
        self.lr, self.eps = float(store.adagrad_lr), float(store.adagrad_eps)
        self.ids: dict[str, np.ndarray] = {}
        self.base: dict[str, int] = {}
        self._dims = dict(model.tables)
        scales = model.init_scales(store.init_scale)  # the store's per-table rule (DLRM: sqrt(1/rows))
        uses: dict[str, list[str]] = {}
        for f, t in model.field_tables.items():
            uses.setdefault(t, []).append(f)
        rows: dict[int, int] = {}  # rows per width so far: each table's base in its width's arena
        for t, dim in model.tables.items():
            self.ids[t] = np.unique(np.concatenate([np.asarray(vocab[f], dtype=np.int64) for f in uses[t]]))
            self.base[t] = rows.get(dim, 0)
            rows[dim] = self.base[t] + len(self.ids[t])
        # each width's rows made in place, a chunk at a time: never a second copy of the tables
        self.arenas: dict[int, _Arena] = {}
        for dim, n in rows.items():
            w = np.zeros((n + 1, dim), np.float32)  # the last row: the arena's scratch row
            for t, tdim in model.tables.items():
                if tdim != dim:
                    continue
                ids, at = self.ids[t], self.base[t]
                for s in range(0, len(ids), init_chunk):
                    w[at + s:at + s + len(ids[s:s + init_chunk])] = init_rows(
                        table_salt(t), model.seed, ids[s:s + init_chunk], dim, scales[t])
            self.arenas[dim] = _Arena(torch.from_numpy(w).to(self.device),
                                      torch.zeros(n + 1, dtype=torch.float32, device=self.device))
        self.step = FusedStep(self.model, self.opt, model, self, self.device)

    def index(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Each id's row in the table's own range (a ``KeyError`` names ids outside the vocabulary)."""
        known = self.ids[table]
        pos = np.searchsorted(known, ids)
        pos = np.minimum(pos, len(known) - 1)
        if len(ids) and not np.array_equal(known[pos], ids):
            missing = ids[known[pos] != ids][:3]
            raise KeyError(f"table {table!r}: ids {missing.tolist()} are not in the baseline's vocabulary")
        return pos

    # -- RowSource: every row is resident -----------------------------------------------------------
    def arena(self, dim: int) -> _Arena:
        return self.arenas[int(dim)]

    def resolve(self, tables: Sequence[str], lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.empty(len(ids), np.int64)
        at = 0
        for t, n in zip(tables, lengths):
            out[at:at + n] = self._resolve(t, ids[at:at + n])
            at += n
        return out

    def _resolve(self, table: str, ids: np.ndarray) -> np.ndarray:
        return self.index(table, ids) + self.base[table]

    def lookup(self, table: str, ids: np.ndarray, host: bool = False) -> torch.Tensor:
        """Rows of ``ids`` (any order, repeats allowed)."""
        a = self.arenas[self._dims[table]]
        if a.w.device.type == "cpu":  # numpy gather on the shared buffer: no torch dispatch per table
            return torch.from_numpy(a.w.numpy()[self._resolve(table, ids)])
        rows = a.w[torch.from_numpy(self._resolve(table, ids)).to(a.w.device)]
        return rows.cpu() if host else rows

    peek = lookup

    def prefetch(self, table: str, ids: np.ndarray) -> None:
        pass  # nothing to read ahead: every row is resident

    def apply_gradients(self, table: str, ids: np.ndarray, grads: torch.Tensor) -> None:
        """Row-wise Adagrad on the rows of unique ``ids`` (the sparse update a competent DLRM does)."""
        a = self.arenas[self._dims[table]]
        idx = self._resolve(table, ids)
        if a.w.device.type == "cpu":  # same IEEE ops as the store's host path, bit for bit
            w, acc = a.w.numpy(), a.acc.numpy()
            w[idx], acc[idx] = adagrad_rows_np(w[idx], acc[idx], grads.detach().numpy(), self.lr, self.eps)
            return
        it = torch.from_numpy(idx).to(a.w.device)
        a.w[it], a.acc[it] = adagrad_rows(a.w[it], a.acc[it], grads.to(a.w.device), self.lr, self.eps)

    def mark_hot_written(self, dim: int, arena_slots: np.ndarray) -> None:
        pass  # no tier below to write back to

    # -- training -------------------------------------------------------------------------------------
    def train_batch(self, batch) -> np.ndarray:
        """Score-before-train on one mini-batch; returns the progressive scores ``[B, T]``."""
        self.model.train()
        return self.step.run(self.step.prepare(batch))

    def predict(self, batch) -> np.ndarray:
        self.model.eval()
        return predict_batch(self.model, batch, self.model_cfg, self.lookup, self.device)

    def nbytes(self) -> int:
        return sum(a.w.numel() * 4 + a.acc.numel() * 4 for a in self.arenas.values())
