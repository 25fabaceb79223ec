"""Tiered embedding store: sharded RocksDB cold tier + device-resident hot tier.

Public surface: :class:`EmbeddingStore` (all tables of one model), its errors, and the
row rules any replica must share: ``init_rows`` (deterministic initial rows) and
``adagrad_rows``/``adagrad_rows_np`` (row-wise Adagrad). See ``store.py`` for the tiering and durability rules.
"""

from .errors import StoreError, StoreMismatchError
from .adagrad import adagrad_rows, adagrad_rows_np
from .rows import init_rows
from .store import EmbeddingStore

__all__ = ["EmbeddingStore", "StoreError", "StoreMismatchError", "adagrad_rows", "adagrad_rows_np", "init_rows"]
