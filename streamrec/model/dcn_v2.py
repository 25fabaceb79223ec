"""DCN-v2 (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network"), the stacked form.

The input ``x0`` is the concatenation of the dense part (the bottom MLP's output, or the raw dense
features when ``model.bottom_mlp`` is empty) and every field's pooled embedding at its own dim.
``model.cross_layers`` full-rank cross layers ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` model
explicit feature crosses of growing degree; a deep MLP (``model.top_mlp``, ReLU after every layer)
and a final linear layer map the crossed vector to one logit per task (the tasks share the cross
network and the deep MLP: a shared-bottom multi-task model).
"""

from __future__ import annotations

import torch
from torch import nn

from .concat import concat_input, concat_width, dense_bottom
from .dlrm import mlp, task_head


class DCNv2(nn.Module):
    def __init__(self, pooled_dim: int, dense_dim: int, bottom_mlp: list[int], top_mlp: list[int],
                 cross_layers: int, seed: int = 0, num_tasks: int = 1):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the caller's RNG untouched
            torch.manual_seed(seed)
            self.bottom = dense_bottom(dense_dim, bottom_mlp)
            width = concat_width(pooled_dim, dense_dim, bottom_mlp)
            self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(cross_layers))
            self.deep = mlp([width, *top_mlp], last_activation=True)
            self.out = task_head([width, *top_mlp][-1], num_tasks, seed)

    @classmethod
    def from_config(cls, model_cfg) -> "DCNv2":
        return cls(model_cfg.pooled_dim, model_cfg.dense_dim, list(model_cfg.bottom_mlp), list(model_cfg.top_mlp),
                   model_cfg.cross_layers, model_cfg.seed, num_tasks=len(model_cfg.tasks))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, tasks]`` from dense ``[batch, dense_dim]`` and pooled ``[batch, pooled_dim]``."""
        x0 = concat_input(self.bottom, dense, pooled)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.out(self.deep(x))
