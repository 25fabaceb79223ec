"""The trainer-serving contract: the snapshot format and the push protocol's rules.

A snapshot is a directory (manifest, dense weights, embedding rows as Parquet,
per-file sha256) that the trainer writes and serving verifies before it swaps.
Public surface::

    write_snapshot(out_dir, *, version, parent_version, kind, dense_state, rows, ...) -> Path
    rows_batch(table, ids, vectors) -> pyarrow.RecordBatch   # rows in the snapshot schema
    verify_snapshot(dir) -> Manifest ; read_manifest ; read_dense ; iter_rows ; Manifest
    SnapshotError(message, code)        # every failure, with its gRPC status name
    is_retryable(code), needs_full(code)  # what a pusher does after a refusal
    PushResult, PushError, Pusher, PusherFactory  # the push side, transport-free (the pusher Protocol)
    export_dense(model, dense_dim, pooled_dim, num_tasks) -> ExportedDense   # the dense network as a program
    load_program(program_json, weights, constants) -> nn.Module ; probe_inputs ; task_logits
    Evidence, Figures, InputHealth, EventSample, Contribution, read_evidence(block)  # a snapshot's evidence (manifest.evidence)
    check_evidence(block), make_evidence(...), window(...)  # its checks; a hand-made block
    encode_rows, decode_rows, round_trip, PRECISIONS  # rows in a row precision (fp32, fp16, int8 row-wise)
    probe_batch(row_probe, fields, dense_dim), PROBE_EVENTS, ROW_PROBE_ATOL  # manifest.row_probe's events
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .evidence import (
        EVIDENCE_FORMAT, Contribution, Evidence, EventSample, Figures, InputHealth, check_evidence, empty_evidence,
        make_evidence, read_evidence, window,
    )
    from .deletions import DELETED, iter_deleted
    from .errors import NEEDS_FULL, RETRYABLE, SnapshotError, is_retryable, needs_full
    from .format import (
        DENSE, KINDS, MANIFEST, Manifest, iter_rows, read_dense, read_manifest, rows_batch, rows_schema, verify_snapshot,
        write_snapshot,
    )
    from .program import (
        PROGRAM, PROGRAM_CONSTANTS, ExportedDense, export_dense, load_program, probe_inputs, task_logits,
    )
    from .push_types import Pusher, PusherFactory, PushError, PushResult
    from .row_probe import PROBE_EVENTS, ROW_PROBE_ATOL, probe_batch
    from .rowcodec import PRECISIONS, decode_rows, encode_rows, round_trip

# lazy: the error types must not load pyarrow and torch (the format does)
_EXPORTS = {  # submodule: the public names it defines
    ".evidence": "EVIDENCE_FORMAT Contribution Evidence EventSample Figures InputHealth check_evidence empty_evidence make_evidence "
                 "read_evidence window",
    ".deletions": "DELETED iter_deleted",
    ".errors": "NEEDS_FULL RETRYABLE SnapshotError is_retryable needs_full",
    ".format": "DENSE KINDS MANIFEST Manifest iter_rows read_dense read_manifest rows_batch rows_schema verify_snapshot "
               "write_snapshot",
    ".program": "PROGRAM PROGRAM_CONSTANTS ExportedDense export_dense load_program probe_inputs task_logits",
    ".push_types": "Pusher PusherFactory PushError PushResult",
    ".rowcodec": "PRECISIONS decode_rows encode_rows round_trip",
    ".row_probe": "PROBE_EVENTS ROW_PROBE_ATOL probe_batch",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
