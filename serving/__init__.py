"""Serving: the gRPC endpoint (Predict, PushSnapshot, Status, health, reflection),
its snapshot loader and version swap, and the Python clients. The API's single
source is ``streamrec.proto``; the snapshot format is :mod:`streamrec.snapshot`.

Public surface::

    SnapshotPusher(target, token=..., tls_ca=...).push(dir) -> PushResult
    ServingClient(target, token=..., tls_ca=...).predict(events) -> (scores, version)
    events_to_request(events) / batch_to_request(EventBatch) -> PredictRequest (column-wise, bytes columns)
    ServerSettings(serving, store, dense_abs_max): the sections a server reads
    serve(settings) -> ServingServer (.port, .target, .stop()), or a ServingGroup when serving.processes > 1
    ServingGroup(settings, ...).start(): serving.processes server processes on one port (SO_REUSEPORT)
    serving_target(serving) / push_targets(serving): where clients connect, where a trainer pushes
    ServingClient(...).rollback(to_version | release=True) / .accept(): the operator's calls (push token)
    Guard(cfg.serving.guard).judge(evidence) -> Verdict: the promotion guard; VersionBook: head, kept, pinned
    ModelLines: a server's model lines (a book each), the A/B Split, the shadow comparison; shadow_auc(log, labels)
    DriftWatch / DriftFigures: a waiting candidate's live scores paired with the promoted version's (guard: drift)
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .client import ServingClient, SnapshotPusher, snapshot_chunks
    from .convert import RequestError, batch_to_request, events_to_request
    from .drift import DriftFigures, DriftWatch
    from .group import ServingGroup
    from .guard import Guard, Verdict
    from .history import VersionBook
    from .lines import ModelLines, Split, shadow_auc, split_key
    from .launch import serve
    from .server import ServingServer, StreamRecService
    from .settings import ServerSettings
    from .targets import push_targets, serving_target

_EXPORTS = {  # submodule: the public names it defines
    ".client": "ServingClient SnapshotPusher snapshot_chunks",
    ".convert": "RequestError batch_to_request events_to_request",
    ".drift": "DriftFigures DriftWatch",
    ".group": "ServingGroup",
    ".guard": "Guard Verdict",
    ".history": "VersionBook",
    ".lines": "ModelLines Split shadow_auc split_key",
    ".launch": "serve",
    ".server": "ServingServer StreamRecService",
    ".settings": "ServerSettings",
    ".targets": "push_targets serving_target",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
