"""One training step, PERSIA-style hybrid: the dense network is updated
synchronously by a torch optimizer; each embedding field hands its unique rows'
gradients to whoever owns the rows (the tiered store, or an in-memory table).

The step scores the batch in the same forward pass it trains on, *before* any
update, so the returned probabilities are progressive-validation scores.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from streamrec.model import DLRM, embed_batch

Lookup = Callable[[str, np.ndarray], torch.Tensor]
ApplyGrads = Callable[[str, np.ndarray, torch.Tensor], None]


def dense_optimizer(model: DLRM, kind: str, lr: float) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if kind == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=lr)
    raise ValueError(f"dense optimizer must be 'adam' or 'adagrad', got {kind!r}")


def train_step(model: DLRM, opt: torch.optim.Optimizer, batch, fields: Sequence[str], lookup: Lookup,
               apply_grads: ApplyGrads, device: torch.device, uniques=None) -> np.ndarray:
    """Score (before update) and train on one mini-batch; returns the scores.
    ``uniques``: the batch's ``model.unique_ids`` when the caller already has them."""
    pooled, touched = embed_batch(batch, fields, lookup, device, requires_grad=True, uniques=uniques)
    dense = torch.from_numpy(batch.dense).to(device)
    labels = torch.from_numpy(batch.labels).to(device)
    logits = model(dense, pooled)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    for f, uniq, rows in touched:
        if len(uniq):
            apply_grads(f, uniq, rows.grad)
    return torch.sigmoid(logits.detach()).float().cpu().numpy()
