"""FAE scheduling (Adnan et al., VLDB'22): split a window of arriving events into
*hot* mini-batches (every sparse id is in the device-resident hot set, so no store
traffic) and *cold* mini-batches (at least one id lives below the device), then
interleave them so the model sees popular and unpopular data mixed roughly as it
arrived; that is what keeps accuracy equal to arrival-order training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, get_args

import numpy as np

from streamrec.foundation import EventBatch

from .trainer_types import Schedule

HotMask = Callable[[str, np.ndarray], np.ndarray]


def hot_samples(batch: EventBatch, fields: Sequence[str], hot_mask: HotMask) -> np.ndarray:
    """Bool per event: True when every id of every field is hot (events with no ids are hot)."""
    n = len(batch)
    cold = np.zeros(n, bool)
    one_each = None  # the usual layout, one id per event in every field: the mask is per event already
    for f in fields:
        j = batch.sparse[f]
        if len(j.values) == 0:
            continue
        mask = np.asarray(hot_mask(f, j.values), dtype=bool)
        if mask.all():
            continue
        if len(j.values) == n:
            if one_each is None:
                one_each = np.arange(n + 1, dtype=np.int64)
            if np.array_equal(j.offsets, one_each):
                cold |= ~mask
                continue
        cold[np.repeat(np.arange(n), j.lengths)[~mask]] = True
    return ~cold


@dataclass
class MiniBatch:
    kind: str  # "hot" | "cold" | "mixed" (arrival order)
    rows: np.ndarray  # indices into the window batch, in arrival order


def _chunks(rows: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Split into ceil(n / batch_size) nearly equal chunks (no tiny tail batch)."""
    if len(rows) == 0:
        return []
    k = -(-len(rows) // batch_size)
    return [c for c in np.array_split(rows, k) if len(c)]


def plan(hot: np.ndarray, batch_size: int, schedule: Schedule = "fae", hot_per_cold: int = 0) -> list[MiniBatch]:
    """Mini-batches for one window, in training order.

    ``schedule="arrival"``: plain arrival-order chunks. ``"fae"``: hot and cold chunks,
    interleaved in proportion to their counts (``hot_per_cold=0``) or ``hot_per_cold``
    hot chunks per cold chunk. Within each chunk events keep arrival order.
    """
    if schedule not in get_args(Schedule):
        raise ValueError(f"schedule must be one of {', '.join(get_args(Schedule))}, got {schedule!r}")
    idx = np.arange(len(hot))
    if schedule == "arrival":
        return [MiniBatch("mixed", c) for c in _chunks(idx, batch_size)]
    hot_chunks = [MiniBatch("hot", c) for c in _chunks(idx[hot], batch_size)]
    cold_chunks = [MiniBatch("cold", c) for c in _chunks(idx[~hot], batch_size)]
    if not hot_chunks or not cold_chunks:
        return hot_chunks + cold_chunks
    out: list[MiniBatch] = []
    if hot_per_cold > 0:
        h = 0
        for c in cold_chunks:
            out.extend(hot_chunks[h:h + hot_per_cold])
            h += hot_per_cold
            out.append(c)
        out.extend(hot_chunks[h:])
        return out
    # proportional: place chunk i of each kind at its fractional position in the window
    keyed = [((i + 0.5) / len(hot_chunks), 0, m) for i, m in enumerate(hot_chunks)]
    keyed += [((i + 0.5) / len(cold_chunks), 1, m) for i, m in enumerate(cold_chunks)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [m for _, _, m in keyed]
