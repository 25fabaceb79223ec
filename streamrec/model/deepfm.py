"""DeepFM (Guo et al. 2017): a factorization machine and a deep network over the same embeddings,
their logits summed.

- FM second-order term: ``0.5 * sum_d((sum_f v_fd)^2 - sum_f v_fd^2)`` over the fields' pooled
  embeddings ``v [batch, fields, dim]``: every pairwise dot product ``<v_i, v_j>``, i < j, in
  O(fields * dim). A field whose dim differs from ``model.embedding_dim`` is projected to it first by
  its own learned linear map (as DLRM's interaction does); fields at that width have none.
- First-order term: a linear layer over the dense features, plus a learned weight per field on the
  sum of that field's pooled vector, plus a bias. The paper's first-order term is a 1-wide
  embedding per id; here a field's ids contribute through their (already learned) embedding rows
  instead, so the store holds one table of one width per field and nothing model-specific.
- Deep part: an MLP (``model.top_mlp`` hidden layers, then one unit) over the concatenation of the
  dense part (the bottom MLP's output, or the raw dense features when ``model.bottom_mlp`` is
  empty) and the pooled embeddings at their own dims.
- Several tasks: the FM term and the per-field weights are shared; each task has its own bias, its
  own dense linear weights and its own deep output unit (the deep network's last layer has one unit
  per task).
"""

from __future__ import annotations

import torch
from torch import nn

from .concat import concat_input, concat_width, dense_bottom
from .dlrm import field_matrix, field_projections, mlp, task_head


class DeepFM(nn.Module):
    def __init__(self, num_fields: int, dense_dim: int, embedding_dim: int, bottom_mlp: list[int],
                 top_mlp: list[int], seed: int = 0, field_dims: list[int] | None = None, num_tasks: int = 1):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the caller's RNG untouched
            torch.manual_seed(seed)
            self.field_dims = [int(d) for d in field_dims] if field_dims is not None else [embedding_dim] * num_fields
            self.embedding_dim = embedding_dim
            self.bottom = dense_bottom(dense_dim, bottom_mlp)
            self.dense_linear = task_head(dense_dim, num_tasks, seed, bias=False) if dense_dim else None
            self.field_weight = nn.Parameter(torch.zeros(num_fields))
            self.bias = nn.Parameter(torch.zeros(num_tasks))
            width = concat_width(sum(self.field_dims), dense_dim, bottom_mlp)
            self.deep = mlp([width, *top_mlp, 1], last_activation=False, tasks=num_tasks, seed=seed)
            # made after every other layer, so the other layers' initial weights do not depend on the field dims
            self.project = field_projections(self.field_dims, embedding_dim)

    @classmethod
    def from_config(cls, model_cfg) -> "DeepFM":
        return cls(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim, list(model_cfg.bottom_mlp),
                   list(model_cfg.top_mlp), model_cfg.seed, field_dims=list(model_cfg.field_dims.values()),
                   num_tasks=len(model_cfg.tasks))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, tasks]`` from dense ``[batch, dense_dim]`` and pooled ``[batch, pooled_dim]``."""
        v = field_matrix(pooled, self.field_dims, self.embedding_dim, self.project)
        total = v.sum(dim=1)
        fm = 0.5 * (total * total - (v * v).sum(dim=1)).sum(dim=1, keepdim=True)
        first = (v.sum(dim=2) * self.field_weight).sum(dim=1, keepdim=True) + self.bias
        if self.dense_linear is not None:
            first = first + self.dense_linear(dense)
        return first + fm + self.deep(concat_input(self.bottom, dense, pooled))
