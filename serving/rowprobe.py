"""Serving's check of a snapshot's row probe (``manifest.row_probe``), run on a version once it is loaded.

The checksums prove only that the files are the writer's bytes; the row probe proves that the rows serving
installed (decoded from the snapshot's row precision, held compressed in memory, decoded in the store) score
what the trainer computed from the rows it meant to send. The probe's events are scored with the loaded
version's own predict path; a score that differs by more than ``ROW_PROBE_ATOL`` refuses the push
(``load_version`` raises ``Refused``, INVALID_ARGUMENT), so the version being served stays.
"""

from __future__ import annotations

import numpy as np

from streamrec.snapshot import ROW_PROBE_ATOL, SnapshotError, probe_batch


def row_probe_problem(version, row_probe: dict) -> str | None:
    """Score ``row_probe``'s events with ``version`` (a ``ServedVersion``); the reason to refuse the push (a
    score that differs from the trainer's by more than ``ROW_PROBE_ATOL``, or a probe that does not fit the
    model), None when every score matches."""
    try:
        batch = probe_batch(row_probe, version.fields, version.dense_dim)
    except SnapshotError as e:
        return f"row probe: {e}"
    want = np.asarray(row_probe["scores"], dtype=np.float64)
    got = np.asarray(version.predict(batch), dtype=np.float64)
    if want.shape != got.shape:
        return (f"row probe: {want.shape[1] if want.ndim == 2 else '?'} scores per event, the model gives "
                f"{got.shape[1]}")
    diff = float(np.abs(got - want).max()) if got.size else 0.0
    if not diff <= ROW_PROBE_ATOL:
        return (f"row probe: the rows installed do not score as the trainer's: served scores differ from the "
                f"trainer's by {diff:.3g} (more than {ROW_PROBE_ATOL:g})")
    return None
