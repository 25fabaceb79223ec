"""The concatenated input of the flat architectures (``mlp``, ``deepfm``, ``dcn_v2``)::

    dense  [B, dense_dim] ──► bottom MLP (ReLU after each layer; none when model.bottom_mlp is empty) ─┐
                                                                                                     ├─ cat ──► [B, width]
    pooled [B, pooled_dim] (every field's pooled vector, at its own dim) ────────────────────────────┘

Without dense features there is no bottom part and the input is the pooled embeddings alone.
"""

from __future__ import annotations

import torch
from torch import nn

from .dlrm import mlp


def dense_bottom(dense_dim: int, bottom_mlp: list[int]) -> nn.Sequential | None:
    """The dense features' bottom MLP (empty, the identity, when ``bottom_mlp`` is empty); None without
    dense features."""
    return mlp([dense_dim, *bottom_mlp], last_activation=True) if dense_dim else None


def concat_width(pooled_dim: int, dense_dim: int, bottom_mlp: list[int]) -> int:
    """The width of :func:`concat_input`'s output."""
    return ([dense_dim, *bottom_mlp][-1] if dense_dim else 0) + pooled_dim


def concat_input(bottom: nn.Module | None, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """``[bottom(dense), pooled]`` along the feature axis (the embeddings alone without ``bottom``)."""
    return torch.cat([bottom(dense), pooled], dim=1) if bottom is not None else pooled
