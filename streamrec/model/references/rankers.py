"""Independent plain-PyTorch references of the built-in architectures other than DLRM (that one is
``plain_dlrm.py``): DCN-v2, DeepFM and the MLP ranker, written from the papers without the product's
code. Nothing here imports the model's own modules (``streamrec.model`` outside ``references``),
``streamrec.trainer`` or ``streamrec.embedding_store``: a bug shared by the product's module and the trainer
cannot hide in both.

Each network takes the dense features and the sum-pooled embeddings of every field concatenated in field
order (``[B, fields * dim]``, the product's flat ``pooled`` input) and returns a logit per event; :class:`PlainRanker` holds one ``nn.EmbeddingBag`` (sum) per field over a vocabulary fixed up
front, trains the network with Adam and the touched rows with row-wise Adagrad (the accumulator adds
the mean squared gradient of a row), and scores each mini-batch before it trains on it (progressive
validation).

The networks declare their parameters in this order, which a caller may rely on to start a reference
from another model's weights (:func:`load_by_order`):

- ``dcn_v2``: bottom MLP (weight, bias per layer), each cross layer (W, b), deep MLP, output (w, b)
- ``deepfm``: per-field first-order weight ``[fields]``, bias ``[1]`` (a module's own parameters come
  before its submodules'), bottom MLP, dense first-order weight ``[1, dense_dim]``, deep MLP (its last
  layer one unit)
- ``mlp``: bottom MLP, top MLP (its last layer one unit)
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamrec.foundation.model_config import ModelConfig

from .plain_dlrm import auc, logloss, progressive, row_adagrad_
from .training import ReferenceTraining, mini_batches

NAMES = ("dcn_v2", "deepfm", "mlp")


class _Dense(nn.Module):
    """Affine layers ``y = x W^T + b`` with a ReLU after each but (optionally) the last."""

    def __init__(self, sizes: Sequence[int], relu_last: bool):
        super().__init__()
        self.weights = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:]):
            w, bias = torch.empty(b, a), torch.empty(b)
            bound = 1.0 / math.sqrt(a)  # PyTorch's default Linear init range (kaiming-uniform a=sqrt(5) gives the same)
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(bias, -bound, bound)
            self.weights.append(nn.Parameter(w))
            self.weights.append(nn.Parameter(bias))
        self.relu_last = relu_last

    @property
    def out_width(self) -> int | None:
        return self.weights[-2].shape[0] if len(self.weights) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.weights) // 2
        for i in range(n):
            x = x @ self.weights[2 * i].t() + self.weights[2 * i + 1]
            if i < n - 1 or self.relu_last:
                x = torch.relu(x)
        return x


class _Inputs(nn.Module):
    """The dense part (bottom MLP output, or raw features without one) beside the flat pooled embeddings."""

    def __init__(self, num_fields: int, dense_dim: int, dim: int, bottom: Sequence[int]):
        super().__init__()
        self.dim = dim
        self.bottom = _Dense([dense_dim, *bottom], relu_last=True) if dense_dim else None
        self.width = num_fields * dim + (([dense_dim, *bottom])[-1] if dense_dim else 0)

    def concat(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.bottom(dense), pooled], dim=1) if self.bottom is not None else pooled


class RefDCNv2(_Inputs):
    """Wang et al. 2021, stacked: cross layers x_{l+1} = x0 (W_l x_l + b_l) + x_l, then the deep MLP and a linear output."""

    def __init__(self, num_fields, dense_dim, dim, bottom, top, cross_layers: int):
        super().__init__(num_fields, dense_dim, dim, bottom)
        d = self.width
        self.cross_w = nn.ParameterList()
        for _ in range(cross_layers):
            layer = _Dense([d, d], relu_last=False)
            self.cross_w.append(layer.weights[0])
            self.cross_w.append(layer.weights[1])
        self.deep = _Dense([d, *top], relu_last=True)
        self.out = _Dense([([d, *top])[-1], 1], relu_last=False)

    def forward(self, dense, pooled):
        x0 = self.concat(dense, pooled)
        x = x0
        for i in range(len(self.cross_w) // 2):
            x = x0 * (x @ self.cross_w[2 * i].t() + self.cross_w[2 * i + 1]) + x
        h = self.deep(x) if len(self.deep.weights) else x
        return self.out(h)[:, 0]


class RefDeepFM(_Inputs):
    """Guo et al. 2017: bias + first order (dense linear, a weight per field on its pooled vector's sum)
    + FM pairwise term over the field embeddings + deep MLP over the concatenation."""

    def __init__(self, num_fields, dense_dim, dim, bottom, top):
        super().__init__(num_fields, dense_dim, dim, bottom)
        self.w_field = nn.Parameter(torch.zeros(num_fields))
        self.b = nn.Parameter(torch.zeros(1))
        bound = 1 / math.sqrt(max(1, dense_dim))
        self.w_dense = nn.ParameterList([nn.Parameter(torch.empty(1, dense_dim).uniform_(-bound, bound))]
                                        if dense_dim else [])
        self.deep = _Dense([self.width, *top, 1], relu_last=False)

    def forward(self, dense, pooled):
        emb = pooled.split(self.dim, dim=1)  # the fields' vectors
        pairs = 0.0
        for i in range(len(emb)):  # sum over i < j of <v_i, v_j>, written as the pairs themselves
            for j in range(i + 1, len(emb)):
                pairs = pairs + (emb[i] * emb[j]).sum(dim=1)
        first = self.b[0] + sum(self.w_field[i] * emb[i].sum(dim=1) for i in range(len(emb)))
        if len(self.w_dense):
            first = first + dense @ self.w_dense[0][0]
        return first + pairs + self.deep(self.concat(dense, pooled))[:, 0]


class RefMLP(_Inputs):
    """Concatenate and feed forward to one logit."""

    def __init__(self, num_fields, dense_dim, dim, bottom, top):
        super().__init__(num_fields, dense_dim, dim, bottom)
        self.top = _Dense([self.width, *top, 1], relu_last=False)

    def forward(self, dense, pooled):
        return self.top(self.concat(dense, pooled))[:, 0]


def make_net(name: str, num_fields: int, dense_dim: int, dim: int, bottom: Sequence[int], top: Sequence[int],
             cross_layers: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if name == "dcn_v2":
        return RefDCNv2(num_fields, dense_dim, dim, bottom, top, cross_layers)
    if name == "deepfm":
        return RefDeepFM(num_fields, dense_dim, dim, bottom, top)
    if name == "mlp":
        return RefMLP(num_fields, dense_dim, dim, bottom, top)
    raise ValueError(f"no reference for {name!r}; one of {', '.join(NAMES)}")


def load_by_order(net: nn.Module, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``tensors`` into ``net``'s parameters in declaration order (shapes must agree one by one)."""
    params = list(net.parameters())
    if len(params) != len(tensors):
        raise ValueError(f"{len(tensors)} tensors for {len(params)} parameters")
    with torch.no_grad():
        for i, (p, t) in enumerate(zip(params, tensors)):
            if tuple(p.shape) != tuple(t.shape):
                raise ValueError(f"parameter {i}: shape {tuple(p.shape)}, given {tuple(t.shape)}")
            p.copy_(t)


class PlainRanker:
    """Embedding bags over a fixed vocabulary + a reference network; Adam dense, row-wise Adagrad sparse.

    ``init_rows(field, sorted_ids) -> float32 [n, dim]``: the initial rows (default uniform in
    +-``init_scale[field]`` or +-sqrt(1/rows), from ``seed``)."""

    def __init__(self, net: nn.Module, vocab: Mapping[str, np.ndarray], dim: int, dense_lr: float, sparse_lr: float,
                 eps: float, seed: int = 0, init_scale: Mapping[str, float] | None = None,
                 init_rows: Callable[[str, np.ndarray], np.ndarray] | None = None):
        gen = torch.Generator().manual_seed(seed)
        self.net = net
        self.fields = list(vocab)
        self.ids = {f: np.unique(np.asarray(v, np.int64)) for f, v in vocab.items()}
        self.table, self.acc = {}, {}
        for f in self.fields:
            n = max(1, len(self.ids[f]))
            if init_rows is not None:
                w = torch.from_numpy(np.array(init_rows(f, self.ids[f]), np.float32).reshape(len(self.ids[f]), dim))
            else:
                scale = (init_scale or {}).get(f) or math.sqrt(1.0 / n)
                w = torch.empty(n, dim).uniform_(-scale, scale, generator=gen)
            self.table[f] = w
            self.acc[f] = torch.zeros(len(w))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=dense_lr)
        self.sparse_lr, self.eps = sparse_lr, eps

    def _pool(self, f: str, values: np.ndarray, offsets: np.ndarray):
        pos = np.searchsorted(self.ids[f], values)
        if len(values) and not np.array_equal(self.ids[f][np.minimum(pos, len(self.ids[f]) - 1)], values):
            raise KeyError(f"field {f!r}: an id is not in the reference's vocabulary")
        rows, inverse = torch.unique(torch.from_numpy(pos.astype(np.int64)), return_inverse=True)
        leaf = self.table[f][rows].clone().requires_grad_(True)
        bag = F.embedding_bag(inverse, leaf, torch.from_numpy(np.asarray(offsets[:-1], np.int64)), mode="sum")
        return bag, (f, rows, leaf)

    def logits(self, dense: np.ndarray, sparse):
        emb, leaves = [], []
        for f in self.fields:
            bag, leaf = self._pool(f, *sparse[f])
            emb.append(bag)
            leaves.append(leaf)
        return self.net(torch.from_numpy(np.asarray(dense, np.float32)), torch.cat(emb, dim=1)), leaves

    def train_batch(self, dense: np.ndarray, labels: np.ndarray, sparse) -> np.ndarray:
        """Score (before the update), then one step; returns the scores."""
        self.net.train()
        out, leaves = self.logits(dense, sparse)
        loss = F.binary_cross_entropy_with_logits(out, torch.from_numpy(np.asarray(labels, np.float32)))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        for f, rows, leaf in leaves:
            row_adagrad_(self.table[f], self.acc[f], rows, leaf.grad, self.sparse_lr, self.eps)
        return torch.sigmoid(out.detach()).numpy()

    @torch.no_grad()
    def predict(self, dense: np.ndarray, sparse) -> np.ndarray:
        self.net.eval()
        return torch.sigmoid(self.logits(dense, sparse)[0]).numpy()


def ranker_progressive(name: str, m: ModelConfig, training: ReferenceTraining, events, init_rows=None,
                       init_params: Sequence[torch.Tensor] | None = None) -> dict:
    """Progressive AUC/logloss of the ``name`` reference of model ``m`` over ``events`` in order,
    ``training.batch_size`` at a time.

    ``init_rows`` / ``init_params`` (the product model's parameters, in order): start from those instead
    of the reference's own seeded init, so the two runs can be compared event for event."""
    net = make_net(name, len(m.fields), m.dense_dim, m.embedding_dim, list(m.bottom_mlp), list(m.top_mlp),
                   m.cross_layers, m.seed)
    if init_params is not None:
        load_by_order(net, init_params)
    scales = {f.name: f.row_init_scale(training.init_scale) for f in m.fields}
    ref = PlainRanker(net, {f: events.sparse[f].values for f in m.field_names}, m.embedding_dim, training.dense_lr,
                      training.sparse_lr, training.eps, seed=m.seed, init_scale=scales, init_rows=init_rows)
    y, p = progressive(ref, mini_batches(events, training.batch_size, m.field_names))
    return {"auc": auc(y, p), "logloss": logloss(y, p), "events_scored": int(len(y)), "model": ref}
