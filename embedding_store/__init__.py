"""Tiered embedding store: sharded RocksDB cold tier + device-resident hot tier.

Public surface: :class:`EmbeddingStore` (all tables of one model), its errors, and
``resolve_device``. See ``store.py`` for the tiering and durability rules.
"""

from .errors import StoreError, StoreMismatchError
from .store import EmbeddingStore, resolve_device

__all__ = ["EmbeddingStore", "StoreError", "StoreMismatchError", "resolve_device"]
