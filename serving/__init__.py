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

_EXPORTS = {  # submodule: the public names it defines
    ".client": "PushError PushResult ServingClient SnapshotPusher snapshot_chunks",
    ".convert": "RequestError batch_to_request events_to_request",
    ".server": "ServingServer StreamRecService pick_device serve",
    ".snapshot": "Manifest SnapshotError iter_rows read_dense read_manifest rows_batch rows_schema verify_snapshot write_snapshot",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
