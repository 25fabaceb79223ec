"""Row-wise Adagrad, written so every tier and every batch shape gives bit-identical results.

Per row: ``acc += mean(g**2)``; ``w -= lr * g / (sqrt(acc) + eps)``. The sum over the
row is an explicit left-to-right loop over columns (elementwise ops only), so the
result does not depend on how many rows are updated together or on the device's
reduction kernel — the hot tier (device), the cold tier (CPU) and the plain-Python
reference model in the tests agree float-exactly.
"""

from __future__ import annotations

import torch


def adagrad_rows(w: torch.Tensor, acc: torch.Tensor, g: torch.Tensor, lr: float, eps: float):
    """New ``(w, acc)`` for rows ``w [n, dim]`` with accumulators ``acc [n]`` and gradients ``g``."""
    dim = g.shape[1]
    sq = g * g
    s = sq[:, 0].clone()
    for j in range(1, dim):
        s = s + sq[:, j]
    acc_new = acc + s / torch.tensor(float(dim), dtype=torch.float32, device=g.device)
    lr_t = torch.tensor(lr, dtype=torch.float32, device=g.device)
    eps_t = torch.tensor(eps, dtype=torch.float32, device=g.device)
    w_new = w - lr_t * g / (torch.sqrt(acc_new) + eps_t)[:, None]
    return w_new, acc_new
