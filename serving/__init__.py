"""Serving: the gRPC endpoint (Predict, PushSnapshot, Status, health, reflection),
the snapshot format the trainer writes, and the Python clients.

Public surface::

    write_snapshot(out_dir, *, version, parent_version, kind, dense_state, rows, ...)  -> Path
    rows_batch(table, ids, vectors) -> pyarrow.RecordBatch   # rows in the snapshot schema
    verify_snapshot(dir) -> Manifest ; read_manifest ; read_dense ; iter_rows
    SnapshotPusher(target, token=..., tls_ca=...).push(dir) -> PushResult
    ServingClient(target, token=..., tls_ca=...).predict(events) -> (scores, version)
    events_to_request(events) / batch_to_request(EventBatch) -> PredictRequest (column-wise, bytes columns)
    serve(cfg) -> ServingServer (.port, .target, .stop())
"""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .client import PushError, PushResult, ServingClient, SnapshotPusher, snapshot_chunks
    from .convert import RequestError, batch_to_request, events_to_request
    from .server import ServingServer, StreamRecService, pick_device, serve
    from .snapshot import Manifest, SnapshotError, iter_rows, read_dense, read_manifest, rows_batch, rows_schema, verify_snapshot, write_snapshot

_EXPORTS = {
    'PushError': '.client',
    'PushResult': '.client',
    'ServingClient': '.client',
    'SnapshotPusher': '.client',
    'snapshot_chunks': '.client',
    'RequestError': '.convert',
    'batch_to_request': '.convert',
    'events_to_request': '.convert',
    'ServingServer': '.server',
    'StreamRecService': '.server',
    'pick_device': '.server',
    'serve': '.server',
    'Manifest': '.snapshot',
    'SnapshotError': '.snapshot',
    'iter_rows': '.snapshot',
    'read_dense': '.snapshot',
    'read_manifest': '.snapshot',
    'rows_batch': '.snapshot',
    'rows_schema': '.snapshot',
    'verify_snapshot': '.snapshot',
    'write_snapshot': '.snapshot',
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
