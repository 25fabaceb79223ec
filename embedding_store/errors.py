"""Errors the store raises; all subclass ValueError so callers can treat them as bad input."""

from streamrec.foundation import StreamrecError


class StoreError(StreamrecError, ValueError):
    """Bad input to the store (unknown table, wrong dtype/shape, duplicate ids...)."""


class StoreMismatchError(StoreError):
    """The store directory was created with another layout (dims, shards, seed)."""
