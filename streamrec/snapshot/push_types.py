"""The push side of the trainer-serving contract, without the transport: the pusher extension point.

The trainer publishes through any :class:`Pusher`, made per target by the
:data:`PusherFactory` it is given; the built-in implementation is serving's gRPC
``streamrec.serving.SnapshotPusher`` (``SnapshotPusher.factory(cfg.serving)``). The trainer
reads only a :class:`PushResult`'s ``ok``/``code``/``version`` and decides with
:mod:`.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

from .errors import SnapshotError, needs_full


@dataclass
class PushResult:
    ok: bool
    version: int = 0  # the version the server serves after the push (accepted; refused: 0 when unknown)
    code: str = "OK"  # gRPC status name when refused
    reason: str = ""
    seconds: float = 0.0  # wall time of the push, including retries
    attempts: int = 0

    @property
    def needs_full(self) -> bool:
        """The receiver cannot apply this delta: send a full snapshot next."""
        return not self.ok and needs_full(self.code)


class PushError(SnapshotError):
    """A push that did not land (raised only when a pusher is asked to raise)."""

    def __init__(self, result: PushResult):
        super().__init__(f"push refused: {result.code}: {result.reason}", code=result.code)
        self.result = result


@runtime_checkable
class Pusher(Protocol):
    """Delivers snapshot directories to one receiver.

    ``push`` returns a :class:`PushResult` for every outcome, refusals and transport
    failures included (it raises only when its owner asked it to); ``close`` releases
    the connection.
    """

    def push(self, snapshot_dir) -> PushResult: ...

    def close(self) -> None: ...


PusherFactory = Callable[[str], Pusher]  # target ("host:port") -> a pusher to it
