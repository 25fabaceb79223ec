"""Row-wise Adagrad, written so every tier and every batch shape gives bit-identical results.

Per row: ``acc += mean(g**2)``; ``w -= lr * g / (sqrt(acc) + eps)``. The sum over the
row is an explicit left-to-right loop over columns (elementwise ops only), so the
result does not depend on how many rows are updated together or on the device's
reduction kernel, and sqrt is taken in float64 then rounded — the hot tier (device), the cold tier (CPU) and the plain-Python
reference model in the tests agree float-exactly.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=16)
def _scalars(device: torch.device, lr: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``lr`` and ``eps`` as float32 tensors on ``device``, made once: ``torch.tensor(x, device=cuda)``
    would copy from the host (and wait for it) on every call."""
    return (torch.full((), lr, dtype=torch.float32, device=device),
            torch.full((), eps, dtype=torch.float32, device=device))


def adagrad_rows(w: torch.Tensor, acc: torch.Tensor, g: torch.Tensor, lr: float, eps: float):
    """New ``(w, acc)`` for rows ``w [n, dim]`` with accumulators ``acc [n]`` and gradients ``g``."""
    dim = g.shape[1]
    sq = g * g
    s = sq[:, 0].clone()
    for j in range(1, dim):
        s = s + sq[:, j]
    acc_new = acc + s / torch.full_like(s, float(dim))  # a tensor divisor: a scalar one becomes * (1/dim)
    lr_t, eps_t = _scalars(g.device, float(lr), float(eps))
    # same-shape operands: a broadcast divisor takes another (not bit-identical) kernel path
    # torch's vectorised float32 sqrt is not always correctly rounded; float64 sqrt rounded
    # to float32 is (53 >= 2*24 + 2 bits), so it equals IEEE float32 sqrt on every device
    root = torch.sqrt(acc_new.double()).float()
    denom = (root + eps_t)[:, None].expand_as(g).contiguous()
    w_new = w - (lr_t * g) / denom
    return w_new, acc_new


def adagrad_rows_np(w: np.ndarray, acc: np.ndarray, g: np.ndarray, lr: float, eps: float):
    """``adagrad_rows`` for host rows in numpy: the same IEEE float32 operations in the same
    order (so bit-identical to the torch version on any device), without torch's per-op
    dispatch cost, which dominates for the few thousand rows of one batch."""
    n, dim = g.shape
    gt = np.array(g.T, dtype=np.float32, order="C")  # our own copy, column j contiguous: the sum reads rows
    sq = np.multiply(gt, gt, out=gt)  # in place (ufuncs with out=: same ops, fewer temporaries)
    s = sq[0]
    for j in range(1, dim):
        s += sq[j]
    acc_new = np.divide(s, np.float32(dim), out=s)
    acc_new = np.add(acc, acc_new, out=acc_new)  # acc + s/dim: same ops, no temporaries
    root = np.sqrt(acc_new.astype(np.float64)).astype(np.float32)
    denom = np.add(root, np.float32(eps), out=root)
    step = np.multiply(g, np.float32(lr))
    np.divide(step, denom[:, None], out=step)
    w_new = np.subtract(w, step, out=step)
    return w_new, acc_new
