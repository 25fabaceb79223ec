"""The plain MLP ranker: concatenate the dense part (the bottom MLP's output, or the raw dense
features when ``model.bottom_mlp`` is empty) and every field's pooled embedding, flattened, and feed
it forward through ``model.top_mlp`` (ReLU between layers) to one logit. No explicit feature
crosses: the baseline the other architectures' crosses are measured against.
"""

from __future__ import annotations

import torch
from torch import nn

from .dlrm import mlp


class MLPRanker(nn.Module):
    def __init__(self, num_fields: int, dense_dim: int, embedding_dim: int, bottom_mlp: list[int],
                 top_mlp: list[int], seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the caller's RNG untouched
            torch.manual_seed(seed)
            self.bottom = mlp([dense_dim, *bottom_mlp], last_activation=True) if dense_dim else None
            width = ([dense_dim, *bottom_mlp][-1] if dense_dim else 0) + num_fields * embedding_dim
            self.top = mlp([width, *top_mlp, 1], last_activation=False)

    @classmethod
    def from_config(cls, model_cfg) -> "MLPRanker":
        return cls(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim, list(model_cfg.bottom_mlp),
                   list(model_cfg.top_mlp), model_cfg.seed)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch]`` from dense ``[batch, dense_dim]`` and pooled embeddings ``[batch, fields, dim]``."""
        flat = pooled.flatten(1)
        x = torch.cat([self.bottom(dense), flat], dim=1) if self.bottom is not None else flat
        return self.top(x).squeeze(1)
