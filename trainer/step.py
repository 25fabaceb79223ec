"""One training step, PERSIA-style hybrid: the dense network is updated
synchronously by a torch optimizer; each embedding field hands its unique rows'
gradients to whoever owns the rows (the tiered store, or an in-memory table).

The step scores the batch in the same forward pass it trains on, *before* any
update, so the returned probabilities are progressive-validation scores.
"""

from __future__ import annotations

from typing import Callable, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F

from streamrec.model import RankingModel, embed_batch

from .trainer_types import DenseOptimizer

Lookup = Callable[[str, np.ndarray], torch.Tensor]
ApplyGrads = Callable[[str, np.ndarray, torch.Tensor], None]


def dense_optimizer(model: RankingModel, kind: DenseOptimizer, lr: float) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if kind == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=lr)
    raise ValueError(f"dense optimizer must be one of {', '.join(get_args(DenseOptimizer))}, got {kind!r}")


# A gradient beyond this squares to ~1e30: Adagrad's and Adam's float32 second moments (sums of g**2)
# would overflow to inf within a few such steps, and a row or weight with an inf moment never learns again.
GRAD_ABS_MAX = 1e15


class NonFiniteStep(ArithmeticError):
    """A mini-batch whose loss or gradients are not finite; nothing of it was applied.

    ``rows``: the events (indices into the mini-batch) whose own loss is not finite, or
    every row when only the gradients are (the culprit cannot be told apart then)."""

    def __init__(self, rows: np.ndarray, why: str):
        super().__init__(why)
        self.rows = rows


def train_step(model: RankingModel, opt: torch.optim.Optimizer, batch, fields: Sequence[str], lookup: Lookup,
               apply_grads: ApplyGrads, device: torch.device, uniques=None) -> np.ndarray:
    """Score (before update) and train on one mini-batch; returns the scores.
    ``uniques``: the batch's ``model.unique_ids`` when the caller already has them.

    Raises :class:`NonFiniteStep`, having changed nothing (no optimizer step, no row
    update), when a loss or a gradient is NaN or infinite: one poisoned batch must not
    turn the dense weights or a stored row into NaN for good."""
    pooled, touched = embed_batch(batch, fields, lookup, device, requires_grad=True, uniques=uniques)
    dense = torch.from_numpy(batch.dense).to(device)
    labels = torch.from_numpy(batch.labels).to(device)
    logits = model(dense, pooled)
    per_event = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    finite = torch.isfinite(per_event)
    if not bool(finite.all()):
        raise NonFiniteStep(np.flatnonzero(~finite.cpu().numpy()), "the loss of some events is not finite")
    loss = per_event.mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grads += [rows.grad for _, uniq, rows in touched if len(uniq) and rows.grad is not None]
    # |g| <= GRAD_ABS_MAX is False for NaN too: one check for NaN, inf and overflowing magnitudes
    if grads and not bool(torch.stack([(g.abs() <= GRAD_ABS_MAX).all() for g in grads]).all()):
        opt.zero_grad(set_to_none=True)
        raise NonFiniteStep(np.arange(len(per_event)), f"gradients are not finite or beyond +-{GRAD_ABS_MAX:g}")
    opt.step()
    for f, uniq, rows in touched:
        if len(uniq):
            apply_grads(f, uniq, rows.grad)
    return torch.sigmoid(logits.detach()).float().cpu().numpy()
