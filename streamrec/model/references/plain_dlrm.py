"""An independent DLRM reference in plain PyTorch, written without the trainer's code.

It guards the trainer and the in-repo reference (``trainer/reference.py``, which
shares the store's init and Adagrad code) against drifting together: nothing here
imports the model's own modules (``streamrec.model`` outside ``references``),
``streamrec.trainer`` or ``streamrec.embedding_store``.
Standard DLRM (Naumov et al. 2019): one ``nn.EmbeddingBag`` (sum) per field over a
vocabulary fixed up front, rows uniform in +-sqrt(1/rows), bottom MLP, pairwise dot
interaction, top MLP; Adam on the dense part, row-wise Adagrad on the touched rows.
Progressive validation: each mini-batch is scored before it is trained on.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamrec.foundation.model_config import ModelConfig

from .training import ReferenceTraining, mini_batches


def _mlp(sizes: Sequence[int], relu_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)



@torch.no_grad()
def row_adagrad_(weight: torch.Tensor, acc: torch.Tensor, rows, g: torch.Tensor, lr: float, eps: float) -> None:
    """Row-wise Adagrad in place on ``weight[rows]`` with accumulators ``acc[rows]``: ``acc += mean(g**2)``,
    ``w -= lr * g / (sqrt(acc) + eps)`` (textbook torch ops: the references' own arithmetic)."""
    a = acc[rows] + (g * g).mean(dim=1)
    acc[rows] = a
    weight[rows] -= lr * g / (a.sqrt() + eps)[:, None]

class PlainDLRM(nn.Module):
    """``vocab``: per field, every id it will see (any order). ``init_scale``: per field, or None for sqrt(1/rows)."""

    def __init__(self, vocab: Mapping[str, np.ndarray], dense_dim: int, dim: int, bottom: Sequence[int],
                 top: Sequence[int], dense_lr: float = 1e-3, sparse_lr: float = 0.05, eps: float = 1e-8,
                 seed: int = 0, init_scale: Mapping[str, float] | None = None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.fields = list(vocab)
        self.ids = {f: np.unique(np.asarray(v, np.int64)) for f, v in vocab.items()}
        self.bags = nn.ModuleDict()
        for f in self.fields:
            rows = max(1, len(self.ids[f]))
            bag = nn.EmbeddingBag(rows, dim, mode="sum")
            scale = (init_scale or {}).get(f) or math.sqrt(1.0 / rows)
            with torch.no_grad():
                bag.weight.uniform_(-scale, scale, generator=gen)
            bag.weight.requires_grad_(False)  # updated by hand: row-wise Adagrad
            self.bags[f] = bag
        self.acc = {f: torch.zeros(len(self.bags[f].weight)) for f in self.fields}
        self.bottom = _mlp([dense_dim, *bottom], relu_last=True) if dense_dim else None
        n = len(self.fields) + (1 if self.bottom is not None else 0)
        self.pairs = torch.tril_indices(n, n, offset=-1)
        self.top = _mlp([n * (n - 1) // 2 + (dim if self.bottom is not None else 0), *top, 1], relu_last=False)
        self.opt = torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=dense_lr)
        self.sparse_lr, self.eps = sparse_lr, eps

    def _index(self, f: str, values: np.ndarray) -> torch.Tensor:
        pos = np.searchsorted(self.ids[f], values)
        if len(values) and not np.array_equal(self.ids[f][np.minimum(pos, len(self.ids[f]) - 1)], values):
            raise KeyError(f"field {f!r}: an id is not in the reference's vocabulary")
        return torch.from_numpy(pos.astype(np.int64))

    def forward(self, dense: torch.Tensor, sparse: Mapping[str, tuple[np.ndarray, np.ndarray]]):
        """Logits; ``sparse[f] = (values, offsets [B + 1])``. Also the per-field (rows, leaf) for the update."""
        feats, leaves = [], []
        for f in self.fields:
            values, offsets = sparse[f]
            idx = self._index(f, values)
            rows, inverse = torch.unique(idx, return_inverse=True)
            leaf = self.bags[f].weight[rows].clone().requires_grad_(True)
            feats.append(F.embedding_bag(inverse, leaf, torch.from_numpy(np.asarray(offsets[:-1], np.int64)),
                                         mode="sum"))
            leaves.append((f, rows, leaf))
        return self.dense_forward(dense, torch.cat(feats, dim=1)), leaves

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits from dense features and the flat pooled embeddings ``[B, fields * dim]`` (field order)."""
        feats = list(pooled.view(len(pooled), len(self.fields), -1).unbind(1))
        if self.bottom is not None:
            x = self.bottom(dense)
            feats.insert(0, x)
        z = torch.stack(feats, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        top_in = torch.cat([x, inter], dim=1) if self.bottom is not None else inter
        return self.top(top_in).squeeze(1)

    def train_batch(self, dense: np.ndarray, labels: np.ndarray, sparse) -> np.ndarray:
        """Score (before the update), then one step; returns the scores."""
        logits, leaves = self(torch.from_numpy(np.asarray(dense, np.float32)), sparse)
        y = torch.from_numpy(np.asarray(labels, np.float32))
        loss = F.binary_cross_entropy_with_logits(logits, y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        for f, rows, leaf in leaves:
            row_adagrad_(self.bags[f].weight, self.acc[f], rows, leaf.grad, self.sparse_lr, self.eps)
        return torch.sigmoid(logits.detach()).numpy()


def progressive(model: PlainDLRM, batches: Iterable[tuple[np.ndarray, np.ndarray, dict]]) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores) of every event, each scored before its mini-batch trains."""
    ys, ps = [], []
    for dense, labels, sparse in batches:
        ps.append(model.train_batch(dense, labels, sparse))
        ys.append(np.asarray(labels, np.float32))
    return (np.concatenate(ys), np.concatenate(ps)) if ys else (np.zeros(0, np.float32), np.zeros(0, np.float32))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (ties count half), written here so the reference shares no metric code either."""
    y = np.asarray(labels) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2, counts)  # ties share their average rank
    r = np.empty(len(s), np.float64)
    r[order] = ranks
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def logloss(labels: np.ndarray, scores: np.ndarray) -> float:
    p = np.clip(np.asarray(scores, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean()) if len(y) else float("nan")


def dlrm_progressive(m: ModelConfig, training: ReferenceTraining, events) -> dict:
    """Progressive AUC/logloss of the independent reference of model ``m`` over ``events`` in order,
    ``training.batch_size`` at a time."""
    scales = {f.name: f.row_init_scale(training.init_scale) for f in m.fields}
    ref = PlainDLRM({f: events.sparse[f].values for f in m.field_names}, m.dense_dim, m.embedding_dim, m.bottom_mlp,
                    m.top_mlp, training.dense_lr, training.sparse_lr, training.eps, seed=m.seed, init_scale=scales)
    y, p = progressive(ref, mini_batches(events, training.batch_size, m.field_names))
    return {"auc": auc(y, p), "logloss": logloss(y, p), "events_scored": int(len(y))}
