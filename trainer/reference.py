"""The plain in-memory baseline: every embedding row in an ``nn.Embedding``, no
store, no tiers. Same deterministic initial rows and the same row-wise Adagrad as
the store, so the tiered trainer can be checked against it (equivalence tests) and
compared against it (``bench train``).

Ids are unbounded in the stream, so the baseline takes a vocabulary per field up
front (all ids it will see), the way DLRM's reference pre-indexes Criteo. Rows are
kept per table (``model.tables``, each at its own dim): fields that share a table
share its rows, their vocabularies united.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from streamrec.embedding_store import adagrad_rows, adagrad_rows_np, init_rows
from streamrec.foundation import table_salt
from streamrec.model import build_model, predict_batch

from .step import dense_optimizer, train_step


class MemoryDLRM:
    def __init__(self, cfg, vocab: Mapping[str, np.ndarray], device: torch.device | str = "cpu",
                 init_chunk: int = 1 << 17):
        self.cfg = cfg
        self.device = torch.device(device)
        self.fields = cfg.model.field_names
        self.model = build_model(cfg.model).to(self.device)
        self.opt = dense_optimizer(self.model, cfg.trainer.dense_optimizer, cfg.trainer.dense_lr)
        self.ids: dict[str, np.ndarray] = {}
        self.emb: dict[str, nn.Embedding] = {}
        self.acc: dict[str, torch.Tensor] = {}
        self._last: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        scales = cfg.model.init_scales(cfg.store.init_scale)  # the store's per-table rule (DLRM: sqrt(1/rows))
        uses: dict[str, list[str]] = {}
        for f, t in cfg.model.field_tables.items():
            uses.setdefault(t, []).append(f)
        for t, dim in cfg.model.tables.items():
            ids = np.unique(np.concatenate([np.asarray(vocab[f], dtype=np.int64) for f in uses[t]]))
            self.ids[t] = ids
            w = np.empty((len(ids), dim), np.float32)
            for s in range(0, len(ids), init_chunk):
                w[s:s + init_chunk] = init_rows(table_salt(t), cfg.model.seed, ids[s:s + init_chunk], dim,
                                                scales[t])
            e = nn.Embedding(len(ids), dim, _weight=torch.from_numpy(w))
            e.weight.requires_grad_(False)
            self.emb[t] = e.to(self.device)
            self.acc[t] = torch.zeros(len(ids), dtype=torch.float32, device=self.device)

    def index(self, table: str, ids: np.ndarray) -> np.ndarray:
        last = self._last.get(table)
        if last is not None and last[0] is ids:  # apply_gradients right after lookup of the same array
            return last[1]
        known = self.ids[table]
        pos = np.searchsorted(known, ids)
        pos = np.minimum(pos, len(known) - 1)
        if len(ids) and not np.array_equal(known[pos], ids):
            missing = ids[known[pos] != ids][:3]
            raise KeyError(f"table {table!r}: ids {missing.tolist()} are not in the baseline's vocabulary")
        self._last[table] = (ids, pos)
        return pos

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        if self.device.type == "cpu":  # numpy gather on the shared buffer: no torch dispatch per table
            return torch.from_numpy(self.emb[table].weight.numpy()[self.index(table, ids)])
        idx = torch.from_numpy(self.index(table, ids)).to(self.device)
        return self.emb[table].weight[idx]

    def apply_gradients(self, table: str, ids: np.ndarray, grads: torch.Tensor) -> None:
        """Row-wise Adagrad on the touched rows only (the sparse update a competent DLRM does)."""
        if self.device.type == "cpu":  # same IEEE ops as the store's host path, bit for bit
            idx = self.index(table, ids)
            w, acc = self.emb[table].weight.numpy(), self.acc[table].numpy()
            w[idx], acc[idx] = adagrad_rows_np(w[idx], acc[idx], grads.detach().numpy(),
                                               self.cfg.store.adagrad_lr, self.cfg.store.adagrad_eps)
            return
        idx = torch.from_numpy(self.index(table, ids)).to(self.device)
        w = self.emb[table].weight
        new_w, new_acc = adagrad_rows(w[idx], self.acc[table][idx], grads.to(self.device),
                                      self.cfg.store.adagrad_lr, self.cfg.store.adagrad_eps)
        w[idx] = new_w
        self.acc[table][idx] = new_acc

    def train_batch(self, batch) -> np.ndarray:
        """Score-before-train on one mini-batch; returns the progressive scores ``[B, T]``."""
        self.model.train()
        return train_step(self.model, self.opt, batch, self.cfg.model, self.lookup, self.apply_gradients, self.device)

    def predict(self, batch) -> np.ndarray:
        self.model.eval()
        return predict_batch(self.model, batch, self.cfg.model, self.lookup, self.device)

    def nbytes(self) -> int:
        return sum(e.weight.numel() * 4 + self.acc[f].numel() * 4 for f, e in self.emb.items())
