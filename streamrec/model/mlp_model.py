"""The plain MLP ranker: concatenate the dense part (the bottom MLP's output, or the raw dense
features when ``model.bottom_mlp`` is empty) and every field's pooled embedding at its own dim, and
feed it forward through ``model.top_mlp`` (ReLU between layers) to one logit per task. No explicit feature
crosses: the baseline the other architectures' crosses are measured against.
"""

from __future__ import annotations

import torch
from torch import nn

from .concat import concat_input, concat_width, dense_bottom
from .dlrm import mlp


class MLPRanker(nn.Module):
    def __init__(self, pooled_dim: int, dense_dim: int, bottom_mlp: list[int], top_mlp: list[int], seed: int = 0,
                 num_tasks: int = 1):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the caller's RNG untouched
            torch.manual_seed(seed)
            self.bottom = dense_bottom(dense_dim, bottom_mlp)
            width = concat_width(pooled_dim, dense_dim, bottom_mlp)
            self.top = mlp([width, *top_mlp, 1], last_activation=False, tasks=num_tasks, seed=seed)

    @classmethod
    def from_config(cls, model_cfg) -> "MLPRanker":
        return cls(model_cfg.pooled_dim, model_cfg.dense_dim, list(model_cfg.bottom_mlp), list(model_cfg.top_mlp),
                   model_cfg.seed, num_tasks=len(model_cfg.tasks))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, tasks]`` from dense ``[batch, dense_dim]`` and pooled ``[batch, pooled_dim]``."""
        return self.top(concat_input(self.bottom, dense, pooled))
