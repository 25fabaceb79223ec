"""EmbeddingStore: every embedding table of one model, tiered.

Tiers and ownership: a row is *owned* by the hot tier (device tensor) while it is in
the hot set; else by the host cache (``cache.py``, bounded, write-back, LRU) while it
is cached; else by the cold tier (a ``ColdTier``, ``store_types.py``: sharded RocksDB,
``cold.py``, unless another is passed as ``cold=``; the rules below are stated for it).
Hot rows keep a backup copy in the cold tier, refreshed when they are demoted and at every checkpoint (only rows changed
since are written); dirty cached rows are written back, batched, when evicted and at
every checkpoint — so a checkpoint is a set of RocksDB checkpoints plus the hot id
list. Promotion takes a row out of the cache (no copy is left behind), so every row
has exactly one owner for updates. Prefetch buffers (``buffers.py``) hold the next
batch's RocksDB reads; they mirror RocksDB, never the cache, and are read only for
rows the cache misses.

Durability: ``checkpoint(path)`` is exact (``restore`` brings back vectors, Adagrad
state and the hot set bit for bit). ``close()`` writes every dirty cached and hot row
back (a clean reopen of the live directory loses no update, only the hot set);
``flush()`` writes dirty cached rows back and fsyncs. After a crash (SIGKILL), the consistent point is the last checkpoint:
- host cache on (``host_cache_rows > 0``, the trainer's default): updates since the
  last checkpoint that were still dirty in the cache are lost, and the live directory
  holds each row at some acknowledged value no older than that checkpoint (write-backs
  are per-row atomic but not a prefix); resume with ``restore(last checkpoint)`` and
  replay from its Kafka offsets (the trainer's checkpoint contract, ARCHITECTURE.md). This is
  the price of writing a cold row to RocksDB once per eviction instead of once per batch;
- host cache off (``host_cache_rows=0``, serving's stores): every write goes straight
  to RocksDB, so the live directory reopens at a prefix of acknowledged writes (WAL +
  cross-shard undo, see cold.py), with hot rows at their last write-back.

Not thread-safe: call it from one thread (the prefetcher is internal).

This class holds the state and the lookup path; each other responsibility reads alone in
its module: ``table.py`` (one table's state), ``rowpath.py`` (cold rows through cache,
buffers and cold tier), ``optimizer.py`` (row-wise Adagrad where each row lives),
``migration.py`` (hot set changes), ``checkpoint.py``, ``export.py`` (Arrow export,
record import, scans), ``expiry.py``, ``stats.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from streamrec.foundation import hot_row_bytes, resolve_device

from . import admission as _admission
from . import checkpoint as _checkpoint
from . import eviction, export, expiry, lookup, migration, optimizer, rowpath
from . import stats as _stats
from .cache import HostCache
from .cold import FORMAT, RocksDBColdTier, check_manifest, read_manifest, write_manifest
from .errors import StoreError
from .hot_arena import HotArena, arenas_of
from .hot_index import HotIndex, index_of
from .rows import init_rows
from .store_spec import StoreSpec
from .store_types import ColdTier
from .table import HotQueue, Probes, Table

ADMISSION_FILE = _checkpoint.ADMISSION_FILE

if TYPE_CHECKING:
    import pyarrow as pa

    from streamrec.foundation import HotBudget
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig


class EmbeddingStore:
    """All embedding tables of one model: sharded RocksDB cold tier + device hot tier.

    ``apply_gradients`` requires unique ids and raises :class:`StoreError` on duplicates
    (sum them first, e.g. with ``np.unique`` + ``index_add``). Unseen ids read as their
    deterministic init; a row is stored on its first write; ``peek`` never touches
    the buffers either. ``memtable_mb`` bounds RocksDB write buffers over all shards.
    ``max_id`` optionally bounds a table's ids to ``[0, max_id)``. The hot tier holds at most
    ``hot_capacity_rows`` rows and, when ``hot_capacity_bytes`` > 0, at most that many device bytes,
    a row of a table of width ``dim`` costing ``hot_row_bytes(dim)`` (tables may differ in width).
    ``host_cache_rows``
    bounds the write-back host cache over all tables (split evenly; 0 = off, every
    cold write goes straight to RocksDB).

    Lean tables: ``admit_min_count`` >= 2 gives an id its own row from its ``admit_min_count``-th training step
    on (``admission.py``); ``max_rows`` > 0 caps each table's stored rows (``eviction.py``, :meth:`evict`).
    Every setting named here is a field of the :class:`StoreSpec` the store opens with (``store_spec.py``).

    The modules beside this one read and change the store's state through the members that
    ``store_types.StoreParts`` lists (the checks every call makes, the remembered probes, the epoch).
    """

    def __init__(self, spec: StoreSpec, cold: ColdTier | None = None):
        """Open (or create) the store ``spec`` describes; ``cold``: another cold tier than sharded RocksDB
        at ``spec.path`` (``store_types.ColdTier``)."""
        self.spec = spec
        self.path = Path(spec.path)
        self.device = resolve_device(spec.device)
        self.seed = int(spec.seed)
        self.lr, self.eps = float(spec.lr), float(spec.eps)
        self.init_scale = spec.default_init_scale
        self.hot_capacity_rows = int(spec.hot_capacity_rows)
        self.hot_capacity_bytes = max(0, int(spec.hot_capacity_bytes))
        self.host_cache_rows = int(spec.host_cache_rows)
        self.read_only = spec.read_only
        self.shards = spec.shards
        self.eviction, self.lfu_half_life_s = str(spec.eviction), float(spec.lfu_half_life_s)
        self.evict_slack = float(spec.evict_slack)
        self.cold: ColdTier = self._open_cold(cold)
        self.tables = {n: Table(n, int(d), self.device, (spec.max_id or {}).get(n), spec.table_init_scale(n))
                       for n, d in spec.tables.items()}
        self._by_tag = {t.tag: t for t in self.tables.values()}
        self._code = {n: np.int16(c) for c, n in enumerate(self.tables)}  # a table's code in the hot index
        # the hot index's compiled probe where the host bounds a trainer (a CUDA device): hot_index.py
        self.compiled_index = self.device.type == "cuda"
        self.arenas: dict[int, HotArena] = {}  # {dim: every hot row of that width}, hot_arena.py
        self.hot_index: HotIndex | None = None  # (table, id) -> arena slot of every hot row, hot_index.py
        self.lay_out_hot()
        self._set_up_lean_tables_and_cache()
        self.prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="store-prefetch")
        self.hot_hits = 0
        self.cold_hits = 0
        self.created = 0
        self.probes = Probes()  # per table: the last lookup's and the last prefetch's index probes
        self.hot_queue: HotQueue | None = None  # device-tier updates queued inside fused_hot_updates()
        self._closed = False

    def _open_cold(self, cold: ColdTier | None) -> ColdTier:
        """Check the directory's manifest against the spec (or refuse a read-only open of no store), open the
        cold tier, then write the manifest; sets the epoch and the manifest."""
        spec, tables = self.spec, {k: int(v) for k, v in self.spec.tables.items()}
        manifest = read_manifest(self.path)
        if manifest is not None:
            check_manifest(self.path, manifest, dict(spec.tables), spec.shards, self.seed)
            all_tables = {**manifest["tables"], **tables}
            self._epoch = int(manifest.get("epoch", 0))
        else:
            if spec.read_only:
                raise StoreError(f"no store at {self.path} (no {self.path / 'manifest.json'}); cannot open read-only")
            all_tables = tables
            self._epoch = 0
        if spec.read_only:
            self._manifest = manifest
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._manifest = {"format": FORMAT, "tables": all_tables, "shards": spec.shards, "seed": self.seed,
                              "epoch": self._epoch}
        if cold is None:  # a manifest is written only once every shard exists, so with one, each must be there
            cold = RocksDBColdTier(str(self.path), spec.shards, spec.block_cache_mb, read_only=spec.read_only,
                                   sync=spec.sync, memtable_mb=spec.memtable_mb, existing=manifest is not None)
        if not spec.read_only:  # after the cold tier exists (see RocksDBColdTier's ``existing``)
            try:
                write_manifest(self.path, self._manifest)
            except BaseException:
                cold.close()
                raise
        return cold

    def _set_up_lean_tables_and_cache(self) -> None:
        """Give the tables their admission counters and row caps (loading the saved counts) and their host
        caches."""
        spec = self.spec
        if _admission.configure(self.tables.values(), spec.admit_min_count, spec.unadmitted, spec.admit_counter_mb,
                                spec.max_rows, spec.eviction):
            _checkpoint.load_admission(self, self.path / ADMISSION_FILE)
        if self.host_cache_rows:
            per_table = max(1, self.host_cache_rows // len(self.tables))
            for t in self.tables.values():
                t.cache = HostCache(per_table, t.dtype, rowpath.spiller(self, t), admission=spec.cache_admission)

    @classmethod
    def from_sections(cls, store: StoreConfig, model: ModelConfig, budget: HotBudget, device: str | torch.device,
                      path: str | None = None, read_only: bool = False,
                      cold: ColdTier | None = None) -> EmbeddingStore:
        """The store a trainer keeps for ``model`` with the ``store`` section's settings and the device tier's
        ``budget`` (``hot_budget``): see :meth:`StoreSpec.from_sections`."""
        return cls(StoreSpec.from_sections(store, model, budget, device, path=path, read_only=read_only), cold)

    # -- checks every public call makes, shared with the modules beside this one --------------------------
    def table(self, table: str) -> Table:
        """The state of table ``table``; :class:`StoreError` when the store is closed or has no such table."""
        if self._closed:
            raise StoreError("the store is closed")
        t = self.tables.get(table)
        if t is None:
            raise StoreError(f"unknown table {table!r}; tables: {', '.join(sorted(self.tables))}")
        return t

    def check_writable(self) -> None:
        """:class:`StoreError` when the store is open read-only."""
        if self.read_only:
            raise StoreError(f"store {self.path} is open read-only")

    def table_by_tag(self, tag: int) -> Table | None:
        """The table whose rows the cold tier keys with ``tag`` (``rows.table_tag``), None for none of them."""
        return self._by_tag.get(int(tag))

    # -- epochs: a write stamps its rows with one past the last checkpoint's --------------------------------
    @property
    def epoch(self) -> int:
        """The last checkpoint's epoch (0: none yet)."""
        return self._epoch

    @property
    def manifest(self) -> dict:
        """A copy of the store's manifest (format, tables, shards, seed, epoch)."""
        return dict(self._manifest or {})

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` as the last checkpoint's, in memory and in the directory's manifest."""
        self._epoch = int(epoch)
        self._manifest["epoch"] = self._epoch
        write_manifest(self.path, self._manifest)

    @property
    def write_epoch(self) -> int:
        """The epoch a write stamps on its rows: one past the last checkpoint's."""
        return self._epoch + 1

    # -- public API -------------------------------------------------------------------
    def init_rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        t = self.table(table)
        return init_rows(t.salt, self.seed, t.checked_ids(ids), t.dim, t.init_scale)

    def hot_mask(self, table: str, ids: np.ndarray) -> np.ndarray:
        t = self.table(table)
        return t.hot.mask(t.checked_ids(ids))

    def lookup(self, table: str, ids: np.ndarray, host: bool = False) -> torch.Tensor:
        """Rows of ``ids`` (any order, repeats allowed) as ``[n, dim]`` float32 on the device (on the host
        with ``host``: a caller that copies several tables' cold rows to the device in one piece).

        An unseen id reads as its deterministic init (its row is stored by its first write, which saves a
        write per new row: most of a Zipf stream's cold traffic); an id not admitted yet reads the unadmitted
        value. Fetched cold rows are kept for the ``apply_gradients`` that usually follows.
        """
        if (t := self.table(table)).admission is not None and t.admission.min_count > 1:
            return _admission.lookup(t, t.checked_ids(ids), torch.device("cpu") if host else self.device,
                                     lambda uniq: lookup.rows(self, table, uniq, remember=True, host=host))
        return lookup.rows(self, table, ids, remember=True, host=host)

    def peek(self, table: str, ids: np.ndarray, host: bool = False) -> torch.Tensor:
        """Like ``lookup`` but never writes: unseen ids read their init (unadmitted ids: as serving reads them)."""
        if (t := self.table(table)).admission is not None and t.admission.min_count > 1:
            rows = _admission.peek(self, t, t.checked_ids(ids))
            return rows.cpu() if host else rows
        return lookup.rows(self, table, ids, remember=False, host=host)

    # -- the fused step's row source (streamrec.trainer.step_types.RowSource) --------------------------------
    def arena(self, dim: int) -> HotArena:
        """The device tensor holding every hot row of width ``dim`` (``hot_arena.py``)."""
        a = self.arenas.get(int(dim))
        if a is None:
            raise StoreError(f"no table of width {dim}; widths: {', '.join(map(str, sorted(self.arenas)))}")
        return a

    def resolve(self, tables: Sequence[str], lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Each id's row in its table's width's :meth:`arena`, -1 where the id is not hot (its row is then
        read with :meth:`lookup` and updated with :meth:`apply_gradients`). ``ids`` are consecutive runs,
        ``lengths[k]`` ids of table ``tables[k]`` each; one probe of the hot index resolves them all.
        Counts the hot ids as hot hits."""
        slots = self.hot_slots(tables, lengths, ids)
        self.hot_hits += int(np.count_nonzero(slots >= 0))
        return slots

    def hot_slots(self, tables: Sequence[str], lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """:meth:`resolve` without counting hits (which ids are hot, for FAE's classification)."""
        if self._closed:
            raise StoreError("the store is closed")
        try:
            codes = np.repeat(np.array([self._code[t] for t in tables], np.int16), lengths)
        except KeyError as e:
            raise StoreError(f"unknown table {e.args[0]!r}; tables: {', '.join(sorted(self.tables))}") from None
        if isinstance(ids, torch.Tensor) or np.asarray(ids).dtype != np.int64:
            ids = np.asarray(ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids).astype(np.int64)
        return self.hot_index.find(codes, ids)

    def mark_hot_written(self, dim: int, arena_slots: np.ndarray) -> None:
        """Record that the rows at ``arena_slots`` of the width-``dim`` arena (repeats allowed) were just
        updated there: they are written back at the next checkpoint, stamped with this epoch and time."""
        self.arena(dim).mark_written(arena_slots, self.write_epoch, time.time())

    def lay_out_hot(self) -> None:
        """Lay the hot rows out in their arenas and index them again (``migration.set_hot`` calls this)."""
        # the old layout goes first (each table now holds its own new rows): one set of hot rows less at the peak
        self.arenas, self.hot_index = {}, None
        self.arenas = arenas_of(self.tables.values(), self.device)
        self.hot_index = index_of(self.tables.values(), self.arenas, self.compiled_index)

    def apply_gradients(self, table: str, ids: np.ndarray, grads: torch.Tensor) -> np.ndarray | None:
        """Row-wise Adagrad on rows ``ids`` (unique) with ``grads [n, dim]`` float32 (``optimizer.py``); with
        admission, an unadmitted id's gradient goes to the shared row (or nowhere) instead."""
        return optimizer.apply_gradients(self, table, ids, grads)

    def peek_held(self, table: str, ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """``peek`` of unique ``ids`` and which of them the store holds a row for (``export.py``)."""
        return export.peek_held(self, table, ids)

    def delete_rows(self, table: str, ids: np.ndarray) -> int:
        """Delete the stored rows of unique ``ids`` (not hot); returns how many were stored (``export.py``)."""
        return export.delete_rows(self, table, ids)

    def evict(self, clock: Callable[[], float] = time.time) -> dict[str, np.ndarray]:
        """Cut tables past ``max_rows * (1 + evict_slack)`` back to ``max_rows``; the deleted ids per table."""
        return eviction.evict(self, clock=clock)

    @contextmanager
    def fused_hot_updates(self) -> Iterator[None]:
        """Within the block, the device tier's share of every ``apply_gradients`` is queued and
        applied at the block's end, for all tables at once (``optimizer.fused_hot_update``: the
        same values, one batch of kernels instead of one per table). Reads inside the block see
        the hot rows as they were before it: wrap only code that reads every row before it
        applies any gradient, as a training step does. On a CPU store this changes nothing."""
        if self.device.type == "cpu" or self.hot_queue is not None:
            yield
            return
        self.hot_queue = []
        try:
            yield
        finally:
            optimizer.flush_hot_updates(self)

    def upsert_rows(self, table: str, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Overwrite the vectors of rows ``ids`` (unique); optimizer state kept (zero if new)."""
        self.check_writable()
        t = self.table(table)
        self.probes.lookup.pop(table, None)  # a row written here may be one a remembered lookup refused
        ids = t.checked_unique_ids(ids)
        if isinstance(vectors, torch.Tensor):
            vectors = vectors.detach().cpu().numpy()
        v = np.asarray(vectors)
        if v.dtype != np.float32:
            raise StoreError(f"{table}: vectors must be float32, got {v.dtype}")
        if v.shape != (len(ids), t.dim):
            raise StoreError(f"{table}: vectors must have shape ({len(ids)}, {t.dim}), got {v.shape}")
        if len(ids) == 0:
            return
        if t.admission is not None:  # a row made outside training counts as admitted
            t.admission.mark(ids)
        now = time.time()
        slots = t.hot.find(ids)
        is_hot = slots >= 0
        if is_hot.any():
            s = slots[is_hot]
            t.hot.w[torch.from_numpy(s).to(self.device)] = torch.from_numpy(v[is_hot]).to(self.device)
            t.hot.dirty[s] = True
            t.hot.ep[s] = self.write_epoch
            t.hot.ts[s] = now
        if not is_hot.all():
            cids = ids[~is_hot]
            old, found, cslots = rowpath.cold_rows(self, t, cids, touch=True)
            new = old.copy()
            new["w"] = v[~is_hot]
            new["ts"] = now
            new["ep"] = self.write_epoch
            rowpath.store_cold(self, t, cids, new, old, found, cslots)

    def prefetch(self, table: str, ids: np.ndarray) -> None:
        """Start reading the cold rows of ``ids`` in the background for a later lookup/apply."""
        t = self.table(table)
        rowpath.prefetch(self, t, t.checked_ids(ids))

    def set_hot(self, hot: dict[str, np.ndarray]) -> dict:
        """Make ``hot`` the complete hot set (a table not named has no hot rows); see ``migration.py``.

        Demoted rows (with their Adagrad state) are written to the cold tier; promoted rows are
        read from it (or initialised). No update is lost.
        """
        return migration.set_hot(self, hot)

    def hot_row_bytes(self, table: str) -> int:
        """Device bytes one hot row of ``table`` costs (its width's weights + its Adagrad sum)."""
        return hot_row_bytes(self.table(table).dim)

    def hot_bytes_of(self, counts: Mapping[str, int]) -> int:
        """Device bytes of ``counts[t]`` hot rows of each table ``t``, each at its table's width."""
        return sum(int(n) * self.hot_row_bytes(t) for t, n in counts.items())

    def checkpoint(self, path: str) -> int:
        """Write a consistent, durable point to ``path`` (must not exist yet); returns its epoch
        (``checkpoint.py``). ``changed_rows(since=epoch)`` gives exactly what changed after it."""
        return _checkpoint.checkpoint(self, path)

    @classmethod
    def restore(cls, checkpoint_path: str, spec: StoreSpec | None = None, *, path: str | None = None,
                cold: ColdTier | None = None, **overrides) -> EmbeddingStore:
        """Open the state of a checkpoint (classmethod) as the store ``spec`` describes, a copy of the checkpoint
        at ``spec.path`` where that is another directory. Without ``spec``: the checkpoint's own store (its
        tables, shards, seed and hot capacities) with ``overrides`` (:class:`StoreSpec` fields), at ``path`` (a
        copy) or in the checkpoint's directory. See ``checkpoint.py``."""
        if spec is None:
            spec = _checkpoint.checkpoint_spec(checkpoint_path, path, **overrides)
        elif path is not None or overrides:
            raise TypeError("restore takes a spec or a path and StoreSpec fields, not both")
        return _checkpoint.restore(cls, checkpoint_path, spec, cold)

    def changed_rows(self, since: int | None = None) -> Iterator[pa.RecordBatch]:
        """Rows changed after checkpoint epoch ``since`` (None: all rows), as Arrow batches
        with columns ``table`` (string), ``id`` (int64), ``vector`` (fixed_size_list<float32>[dim])."""
        return export.changed_rows(self, since)

    def export_records(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """Every stored row with its optimizer state, as ``(table, ids, records)`` chunks: what a
        resharding moves. Open a checkpoint read-only for this (a checkpoint holds the hot rows in
        the cold tier too); on a live store, call :meth:`flush` after a checkpoint first."""
        for t, ids, recs in export.scan_cold(self):
            yield t.name, ids, recs

    def import_records(self, table: str, ids: np.ndarray, records: np.ndarray) -> None:
        """Store rows exactly as exported (vector, Adagrad state, timestamps); ``ids`` unique."""
        export.import_records(self, table, ids, records)

    def expire(self, older_than_s: float, clock: Callable[[], float] = time.time) -> int:
        """Delete cold rows untouched for ``older_than_s`` seconds by ``clock`` (the clock rows are stamped
        with; a test passes its own to place the cutoff); returns how many (``expiry.py``)."""
        return expiry.expire(self, older_than_s, clock)

    def stats(self) -> dict:
        return _stats.stats(self)

    def flush(self) -> None:
        """Write dirty cached rows back, then make every write survive power loss (fsync the WALs)."""
        if not self.read_only:
            rowpath.flush_caches(self)
        self.cold.sync_wal()

    def close(self) -> None:
        if self._closed:
            return
        try:
            rowpath.drain(self)
            if not self.read_only:  # a clean close loses nothing: cached and hot rows go back
                rowpath.flush_caches(self)
                migration.write_back_hot(self)
                _checkpoint.save_admission(self, self.path / ADMISSION_FILE)
        finally:
            self.prefetch_pool.shutdown(wait=True)
            self.cold.close()
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

