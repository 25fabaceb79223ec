"""The manifest's ``row_probe`` as a batch of events: what the trainer scores before it writes a snapshot and
serving scores after it loads one.

``row_probe = {"events": [{"dense": [...], "sparse": {field: [id, ...]}}, ...], "scores": [[per task], ...]}``:
events made of ids whose rows the snapshot carries, and the probabilities the trainer computed for them from
those rows as serving holds them (``round_trip`` of the row precision). A served score that differs means
the rows serving installed are not the rows the trainer meant.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from streamrec.foundation.events import EventBatch, JaggedIds

from .errors import SnapshotError

PROBE_EVENTS = 8  # events a trainer puts in a row probe
ROW_PROBE_ATOL = 1e-5  # the largest difference between a served and the trainer's probe score accepted


def probe_batch(row_probe: dict[str, Any], fields: Sequence[str], dense_dim: int) -> EventBatch:
    """The probe's events as an ``EventBatch`` over ``fields`` (a field an event does not name has no ids).
    Raises ``SnapshotError`` (INVALID_ARGUMENT) for an event of another dense width or a field the model
    does not have."""
    events = row_probe["events"]
    for i, ev in enumerate(events):
        if len(ev["dense"]) != dense_dim:
            raise SnapshotError(f"row_probe.events[{i}]: {len(ev['dense'])} dense values, the model has {dense_dim}")
        extra = sorted(set(ev["sparse"]) - set(fields))
        if extra:
            raise SnapshotError(f"row_probe.events[{i}]: field {extra[0][:40]!r} is not a field of the model")
    n = len(events)
    dense = np.asarray([ev["dense"] for ev in events], dtype=np.float32).reshape(n, dense_dim)
    sparse = {f: JaggedIds.from_lists([ev["sparse"].get(f, []) for ev in events]) for f in fields}
    return EventBatch(ts=np.zeros(n, np.int64), labels=np.zeros(n, np.float32), dense=dense, sparse=sparse)
