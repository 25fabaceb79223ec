"""Tiered embedding store: sharded RocksDB cold tier + device-resident hot tier.

Public surface: :class:`EmbeddingStore` (all tables of one model) and :class:`StoreSpec` (how one
opens: tables, tiers, optimizer, lean tables; ``StoreSpec.from_sections`` from the config), its errors, the
cold-tier extension point (:class:`ColdTier`, a Protocol, and its built-in
:class:`RocksDBColdTier`), and the row rules any replica must share: ``init_rows``
(deterministic initial rows) and ``adagrad_rows``/``adagrad_rows_np`` (row-wise
Adagrad); ``note_occurrences`` (how often each id occurs in the coming step, for admission), ``peek_with_admission``
(rows as a trainer with admission reads them);
``table_sizes(store)`` (rows and bytes on disk per table); ``store_view``/``remove_view`` (a private view of
a store directory for a read-only open that must write nothing into it, as by concurrent readers). See ``store.py`` for the tiering and durability rules.
"""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .adagrad import adagrad_rows, adagrad_rows_np
    from .admission import note_occurrences, peek_with_admission
    from .cold import RocksDBColdTier
    from .errors import StoreError, StoreMismatchError
    from .export import table_sizes
    from .reader_view import remove_view, store_view
    from .rows import init_rows
    from .store import EmbeddingStore
    from .store_spec import StoreSpec
    from .store_types import ColdTier

# lazy: the config section (store_config) must not load torch or RocksDB with it
_EXPORTS = {  # submodule: the public names it defines
    ".adagrad": "adagrad_rows adagrad_rows_np",
    ".admission": "note_occurrences peek_with_admission",
    ".cold": "RocksDBColdTier",
    ".errors": "StoreError StoreMismatchError",
    ".export": "table_sizes",
    ".reader_view": "remove_view store_view",
    ".rows": "init_rows",
    ".store": "EmbeddingStore",
    ".store_spec": "StoreSpec",
    ".store_types": "ColdTier",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(name for names in _EXPORTS.values() for name in names.split())
