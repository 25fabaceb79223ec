"""DLRM (Naumov et al. 2019): bottom MLP over dense features, one pooled embedding per
sparse field, pairwise dot interaction, top MLP.

The module holds only the dense parameters. Embedding rows live in the tiered
store and arrive here already looked up and pooled, ``[batch, fields, dim]``, so
the same module scores for the trainer and for serving.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: list[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, num_fields: int, dense_dim: int, embedding_dim: int,
                 bottom_mlp: list[int], top_mlp: list[int], seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.dense_dim = dense_dim
            self.num_fields = num_fields
            self.embedding_dim = embedding_dim
            self.bottom = mlp([dense_dim, *bottom_mlp], last_activation=True) if dense_dim else None
            n = num_fields + (1 if self.bottom is not None else 0)
            tri = torch.tril_indices(n, n, offset=-1)  # the pairs (i > j) of the interaction
            # as one flat index into the row-major [n, n] interaction matrix: one index_select,
            # cheaper than advanced indexing with two index tensors
            self.register_buffer("_pairs", tri[0] * n + tri[1], persistent=False)
            top_in = n * (n - 1) // 2 + (embedding_dim if self.bottom is not None else 0)
            self.top = mlp([top_in, *top_mlp, 1], last_activation=False)

    @classmethod
    def from_config(cls, model_cfg) -> "DLRM":
        return cls(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim,
                   list(model_cfg.bottom_mlp), list(model_cfg.top_mlp), model_cfg.seed)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch]`` from dense ``[batch, dense_dim]`` and pooled embeddings ``[batch, fields, dim]``."""
        if self.bottom is not None:
            x = self.bottom(dense)
            feats = torch.cat([x.unsqueeze(1), pooled], dim=1)
        else:
            x = None
            feats = pooled
        inter = torch.bmm(feats, feats.transpose(1, 2))
        flat = inter.flatten(1).index_select(1, self._pairs)  # == inter[:, tri[0], tri[1]], same values and gradient
        z = torch.cat([x, flat], dim=1) if x is not None else flat
        return self.top(z).squeeze(1)


def pool_sum(rows: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum-pool jagged lookups: bag ``i`` sums ``rows[index[offsets[i]:offsets[i+1]]]``.

    ``rows`` are the unique rows of a field (a leaf that collects their gradient),
    ``index`` maps every id occurrence to its unique row. Empty bags pool to zero.
    """
    return F.embedding_bag(index, rows, offsets[:-1], mode="sum", include_last_offset=False)


def unique_ids(batch, fields) -> dict:
    """Per field ``(sorted unique ids, inverse index)`` of a batch: computed once per
    mini-batch and shared by the prefetch and the lookup (``embed_batch(uniques=...)``)."""
    import numpy as np

    out = {}
    for f in fields:
        uniq, inverse = np.unique(batch.sparse[f].values, return_inverse=True)
        out[f] = (uniq, inverse.reshape(-1))
    return out


def embed_batch(batch, fields, lookup, device, requires_grad: bool = False, uniques=None):
    """Look up and sum-pool every sparse field of an ``streamrec.ingest.EventBatch``.

    ``lookup(field, unique_ids: np.ndarray[int64]) -> Tensor[n, dim]`` fetches rows
    (from the tiered store in training, from serving's copy in serving). Returns
    ``pooled [B, F, dim]`` and, per field, ``(unique_ids, rows)`` where ``rows`` is
    a leaf tensor whose ``.grad`` after backward is the gradient of each unique row.
    ``uniques``: this batch's ``unique_ids(batch, fields)`` when the caller has them.
    """
    import numpy as np

    pooled = []
    touched = []
    for f in fields:
        j = batch.sparse[f]
        if uniques is not None:
            uniq, inverse = uniques[f]
        else:
            uniq, inverse = np.unique(j.values, return_inverse=True)
        rows = lookup(f, uniq).to(device)
        if requires_grad:
            rows = rows.detach().requires_grad_(True)
        index = torch.from_numpy(inverse.astype(np.int64, copy=False).reshape(-1)).to(device)
        offsets = torch.from_numpy(j.offsets).to(device)
        pooled.append(pool_sum(rows, index, offsets))
        touched.append((f, uniq, rows))
    return torch.stack(pooled, dim=1), touched


@torch.no_grad()
def predict_batch(model: DLRM, batch, fields, lookup, device) -> "np.ndarray":
    """Click probabilities for a batch: the one scoring path shared by trainer and serving."""
    pooled, _ = embed_batch(batch, fields, lookup, device)
    dense = torch.from_numpy(batch.dense).to(device)
    return torch.sigmoid(model(dense, pooled)).float().cpu().numpy()
