"""The root of streamrec's own errors.

Every error streamrec raises on purpose for bad input, bad configuration or an
unreachable dependency derives from :class:`StreamrecError` (and from the builtin
it has always been, ``ValueError`` or ``RuntimeError``, so existing ``except``
clauses keep working). The CLI prints these as one line instead of a traceback;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class StreamrecError(Exception):
    """An error the user can act on: its message says what is wrong and where."""


class EventError(StreamrecError, ValueError):
    """An event does not satisfy the contract (a bad id included); the message says why."""
