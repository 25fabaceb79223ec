"""One error for every way a snapshot can fail: written, read, pushed, received or
installed. ``code`` is the gRPC status name a server answers with and a pusher acts
on; the two decisions a pusher makes from it live here, next to the codes:

- :func:`is_retryable`: may the same push succeed later (server down, deadline)?
- :func:`needs_full`: the receiver cannot apply this delta (it does not hold the
  parent, or the rows arrived corrupt): the next snapshot must be full.
"""

from __future__ import annotations

from streamrec.foundation import StreamrecError

RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNKNOWN"})
NEEDS_FULL = frozenset({"FAILED_PRECONDITION", "DATA_LOSS"})


def is_retryable(code: str) -> bool:
    """The same push may succeed on retry."""
    return code in RETRYABLE


def needs_full(code: str) -> bool:
    """After a refusal with ``code`` the pusher must send a full snapshot, not the next delta."""
    return code in NEEDS_FULL


class SnapshotError(StreamrecError, ValueError):
    """A snapshot that cannot be written, read, pushed or installed; ``code`` is the gRPC status
    name for it (``INVALID_ARGUMENT`` unless said otherwise)."""

    code = "INVALID_ARGUMENT"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def retryable(self) -> bool:
        return is_retryable(self.code)

    @property
    def needs_full(self) -> bool:
        return needs_full(self.code)
