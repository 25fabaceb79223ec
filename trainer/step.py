"""One training step, PERSIA-style hybrid: the dense network is updated
synchronously by torch's Adam or Adagrad update (``dense_optimizers.py``); each
embedding table hands its unique rows' gradients to whoever owns the rows (the
tiered store, or an in-memory table).

The step scores the batch in the same forward pass it trains on, *before* any
update, so the returned probabilities ``[B, T]`` are progressive-validation scores.

The loss of several tasks is ``sum_t weight_t * sum_i labelled_it * bce_it / B``: task
``t``'s binary cross-entropy summed over the events that carry its label (NaN in the label
matrix is a missing label) and divided by the batch size. A missing label is masked out of
the loss (its term is selected away, so its gradient is exactly zero), never read as 0. A
task labelled on a fraction of the events therefore weighs that fraction of a fully
labelled one: dividing by its own labelled count instead would give each of its rare
labels the pull of many events, on embedding rows every task shares. With one task every
event is labelled and this is the mean logloss. An event's own loss, for the numerical
guard, is the sum of its present tasks' terms.

Fake-negative weighted loss (Ktena et al., RecSys 2019 "Addressing delayed feedback for
continuous training with neural networks in CTR prediction"): in a ``join.mode =
fake_negative`` stream every impression arrives at once as a ``fake_negative`` (label 0) and
again as a ``positive`` if it converts, so the stream holds each positive twice, once with the
wrong label. With ``f`` the model's own probability for the event and task, DETACHED (no
gradient flows through a weight), a positive's term weighs ``(1 + f)`` and a fake negative's
``(1 - f)(1 + f)``; the expected gradient then vanishes where the model's probability is the
true positive rate, where the naive loss settles at ``rate / (1 + rate)``. Every other event
(no feedback kind, and ``negative`` / ``positive`` of window mode, whose labels are final)
weighs 1. The weights multiply each task's term, so a task applies them only where the event
carries its label (a missing label's term stays zero).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from streamrec.foundation import FEEDBACK_CODES, EventBatch
from streamrec.model import RankingModel, embed_batch, task_logits

from .dense_optimizers import DenseOptimizerProtocol

FEEDBACK_FAKE_NEGATIVE, FEEDBACK_POSITIVE = FEEDBACK_CODES["fake_negative"], FEEDBACK_CODES["positive"]
Lookup = Callable[[str, np.ndarray], torch.Tensor]
ApplyGrads = Callable[[str, np.ndarray, torch.Tensor], None]


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


def label_matrix(batch: EventBatch, num_tasks: int) -> np.ndarray:
    """The batch's labels as float32 ``[B, num_tasks]``, NaN where a task's label is missing."""
    return np.asarray(batch.label_matrix(num_tasks), np.float32)


def task_weights(fields, weights: Sequence[float] | None) -> list[float]:
    """The tasks' loss weights: ``weights``, else the model config's (``fields`` is one), else one task of 1."""
    if weights is not None:
        return [float(w) for w in weights]
    tasks = getattr(fields, "tasks", None)
    return [float(t.weight) for t in tasks] if tasks is not None else [1.0]


def masked_task_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-event per-task loss [B, T], 0 where the label is missing; labelled mask [B, T])``."""
    present = ~torch.isnan(labels)
    per = F.binary_cross_entropy_with_logits(logits, torch.where(present, labels, torch.zeros_like(labels)),
                                             reduction="none")
    return torch.where(present, per, torch.zeros_like(per)), present


def fake_negative_weights(batch: EventBatch, logits: torch.Tensor) -> torch.Tensor | None:
    """The fake-negative loss weights ``[B, T]`` of a batch of a fake-negative stream (module doc): ``1 + f``
    for a ``positive``, ``(1 - f)(1 + f)`` for a ``fake_negative``, 1 for the rest, with ``f`` the detached
    probability; None when no event has one of those two kinds (every weight would be 1)."""
    fb = batch.feedback
    if fb is None:
        return None
    pos, fake = fb == FEEDBACK_POSITIVE, fb == FEEDBACK_FAKE_NEGATIVE
    if not (pos.any() or fake.any()):
        return None
    f = torch.sigmoid(logits.detach())
    dev = logits.device
    pos_t = torch.from_numpy(pos).to(dev).unsqueeze(1)
    fake_t = torch.from_numpy(fake).to(dev).unsqueeze(1)
    one = torch.ones_like(f)
    return torch.where(pos_t, 1 + f, torch.where(fake_t, (1 - f) * (1 + f), one))


def weighted_losses(per: torch.Tensor, batch: EventBatch, logits: torch.Tensor, fake_negative: bool) -> torch.Tensor:
    """The per-event per-task loss terms ``[B, T]``, weighed by :func:`fake_negative_weights` when
    ``fake_negative`` (the same tensor when every weight is 1)."""
    if fake_negative:
        w = fake_negative_weights(batch, logits)
        if w is not None:
            return per * w
    return per


def train_step(model: RankingModel, opt: DenseOptimizerProtocol, batch: EventBatch, fields, lookup: Lookup,
               apply_grads: ApplyGrads, device: torch.device, uniques=None,
               weights: Sequence[float] | None = None, fake_negative: bool = False) -> np.ndarray:
    """Score (before update) and train on one mini-batch; returns the scores ``[B, T]``.
    ``batch``: an :class:`~streamrec.foundation.EventBatch` (its labels, ``task_labels`` and ``feedback``
    as the batch carries them: a reader of another shape converts to one first);
    ``fields``: the model config (its tables and tasks), ``{field: table}`` or field names;
    ``uniques``: the batch's ``model.unique_ids`` when the caller already has them;
    ``weights``: the tasks' loss weights (default: the config's, or one task of weight 1);
    ``fake_negative``: the batch is of a fake-negative stream, weigh its events by their feedback kinds
    (module doc).

    Raises :class:`NonFiniteStep`, having changed nothing (no optimizer step, no row
    update), when a loss or a gradient is NaN or infinite: one poisoned batch must not
    turn the dense weights or a stored row into NaN for good."""
    w = task_weights(fields, weights)
    pooled, touched = embed_batch(batch, fields, lookup, device, requires_grad=True, uniques=uniques)
    dense = torch.from_numpy(batch.dense).to(device)
    labels = torch.from_numpy(label_matrix(batch, len(w))).to(device)
    logits = task_logits(model(dense, pooled), len(w))
    per, present = masked_task_losses(logits, labels)
    per_event = per.sum(dim=1)
    finite = torch.isfinite(per_event)
    if not bool(finite.all()):
        raise NonFiniteStep(np.flatnonzero(~finite.cpu().numpy()), "the loss of some events is not finite")
    terms = weighted_losses(per, batch, logits, fake_negative)
    loss = sum(w[t] * terms[:, t].sum() for t in range(len(w))) / max(1, len(per))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grads += [rows.grad for _, uniq, rows in touched if len(uniq) and rows.grad is not None]
    # |g| <= GRAD_ABS_MAX is False for NaN too: one check for NaN, inf and overflowing magnitudes
    if grads and not bool(torch.stack([(g.abs() <= GRAD_ABS_MAX).all() for g in grads]).all()):
        opt.zero_grad(set_to_none=True)
        raise NonFiniteStep(np.arange(len(per_event)), f"gradients are not finite or beyond +-{GRAD_ABS_MAX:g}")
    opt.step()
    for table, uniq, rows in touched:
        if len(uniq) and rows.grad is not None:
            apply_grads(table, uniq, rows.grad)
    return torch.sigmoid(logits.detach()).float().cpu().numpy()
