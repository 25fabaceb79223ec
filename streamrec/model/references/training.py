"""How an independent reference trains: the values it takes from the trainer's and the store's settings,
and the mini-batches it walks an event stream in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np


@dataclass(frozen=True)
class ReferenceTraining:
    """The trainer's and the store's training values a reference copies (``trainer.batch_size``,
    ``trainer.dense_lr``, ``store.adagrad_lr``, ``store.adagrad_eps``, ``store.init_scale``)."""

    batch_size: int  # events per mini-batch, each scored before it trains
    dense_lr: float  # Adam's rate on the dense part
    sparse_lr: float  # row-wise Adagrad's rate on the touched rows
    eps: float  # row-wise Adagrad's epsilon
    init_scale: float  # the store's row init scale for a field that sets neither its own nor its expected ids


def mini_batches(events, batch_size: int, fields: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray, dict]]:
    """``(dense, labels, {field: (values, offsets)})`` of ``events`` in order, ``batch_size`` at a time."""
    for s in range(0, len(events), batch_size):
        b = events.take(np.arange(s, min(len(events), s + batch_size)))
        yield b.dense, b.labels, {f: (b.sparse[f].values, b.sparse[f].offsets) for f in fields}
