"""The plain MLP ranker: concatenate the dense part (the bottom MLP's output, or the raw dense
features when ``model.bottom_mlp`` is empty) and every field's pooled embedding, flattened, and feed
it forward through ``model.top_mlp`` (ReLU between layers) to one logit. No explicit feature
crosses: the baseline the other architectures' crosses are measured against.
"""

from __future__ import annotations

import torch
from torch import nn

from .concat import concat_input, concat_width, dense_bottom
from .dlrm import mlp


class MLPRanker(nn.Module):
    def __init__(self, num_fields: int, dense_dim: int, embedding_dim: int, bottom_mlp: list[int],
                 top_mlp: list[int], seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the caller's RNG untouched
            torch.manual_seed(seed)
            self.bottom = dense_bottom(dense_dim, bottom_mlp)
            width = concat_width(num_fields, dense_dim, embedding_dim, bottom_mlp)
            self.top = mlp([width, *top_mlp, 1], last_activation=False)

    @classmethod
    def from_config(cls, model_cfg) -> "MLPRanker":
        return cls(len(model_cfg.fields), model_cfg.dense_dim, model_cfg.embedding_dim, list(model_cfg.bottom_mlp),
                   list(model_cfg.top_mlp), model_cfg.seed)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch]`` from dense ``[batch, dense_dim]`` and pooled embeddings ``[batch, fields, dim]``."""
        return self.top(concat_input(self.bottom, dense, pooled)).squeeze(1)
