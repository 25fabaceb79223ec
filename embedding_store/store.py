"""EmbeddingStore: every embedding table of one model, tiered.

Tiers and ownership: a row is *owned* by the hot tier (device tensor) while it is in
the hot set; else by the host cache (``cache.py``, bounded, write-back, LRU) while it
is cached; else by the cold tier (sharded RocksDB). Hot rows keep a backup copy in
RocksDB, refreshed when they are demoted and at every checkpoint (only rows changed
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
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple

import numpy as np
import torch

from streamrec.foundation import hot_budget_rows, resolve_device, save_npz

from .adagrad import adagrad_rows, adagrad_rows_np
from .buffers import RowBuffer
from .cache import SPILL_CHUNK, HostCache
from .cold import FORMAT, RocksDBColdTier, check_manifest, read_manifest, write_manifest
from .errors import StoreError
from .store_types import ColdTier
from .hot import HotTable
from .rows import (gather, init_rows, record_dtype, scatter, table_salt, table_tag, unique_sorted,
                   unpack_records)

_MAX_BUFFERS = 3  # per table: the last read batch + up to two prefetched batches


class _Table:
    def __init__(self, name: str, dim: int, device: torch.device, max_id: int | None):
        self.name = name
        self.dim = dim
        self.salt = table_salt(name)
        self.tag = table_tag(name)
        self.dtype = record_dtype(dim)
        self.hot = HotTable(dim, device)
        self.buffers: list[RowBuffer] = []
        self.max_id = max_id
        self.cache: HostCache | None = None


class _Probe(NamedTuple):
    """Where the rows of ``ids`` of one table sit: the hot slot of each id and the cache
    slot of each cold one (-1: absent). Remembered so the next call on the same ids
    (prefetch -> lookup -> apply_gradients) skips both index probes; valid only while
    neither index has changed, which their generation counters tell."""

    table: str
    ids: np.ndarray  # owned (a copy where the caller's array could be refilled)
    hot: np.ndarray
    cache: np.ndarray
    hot_gen: int
    cache_gen: int
    # lookup's probe only: the cold rows without a cache slot are exactly the rows the cache's admission
    # refused, and these are their current records and stored flags (in cold-row order), so the
    # apply_gradients that follows writes them back without reading them again. Any write to the table
    # other than that apply_gradients drops the probe (a refused row's write-back changes no generation).
    refused: bool = False
    refused_recs: np.ndarray | None = None
    refused_found: np.ndarray | None = None

    def valid_for(self, t: "_Table", ids: np.ndarray) -> bool:
        return (self.table == t.name and t.cache is not None and self.hot_gen == t.hot.gen
                and self.cache_gen == t.cache.gen and np.array_equal(self.ids, ids))


class EmbeddingStore:
    """All embedding tables of one model: sharded RocksDB cold tier + device hot tier.

    ``apply_gradients`` requires unique ids and raises :class:`StoreError` on duplicates
    (sum them first, e.g. with ``np.unique`` + ``index_add``). Unseen ids read as their
    deterministic init; a row is stored on its first write; ``peek`` never touches
    the buffers either. ``memtable_mb`` bounds RocksDB write buffers over all shards.
    ``max_id`` optionally bounds a table's ids to ``[0, max_id)``. ``host_cache_rows``
    bounds the write-back host cache over all tables (split evenly; 0 = off, every
    cold write goes straight to RocksDB).
    """

    def __init__(self, path: str, tables: dict[str, int], shards: int = 4, seed: int = 0,
                 device: str | torch.device = "cpu", hot_capacity_rows: int = 0,
                 lr: float = 0.05, eps: float = 1e-8, init_scale: float | Mapping[str, float] = 0.05,
                 block_cache_mb: int = 256, host_cache_rows: int = 0, read_only: bool = False,
                 max_id: dict[str, int] | None = None, sync: bool = False, memtable_mb: int = 64,
                 cache_admission: str = "frequency", cold: ColdTier | None = None):
        if not tables:
            raise StoreError("an EmbeddingStore needs at least one table")
        for name, dim in tables.items():
            if not isinstance(name, str) or not name:
                raise StoreError(f"table names must be non-empty strings, got {name!r}")
            if not isinstance(dim, (int, np.integer)) or dim <= 0:
                raise StoreError(f"table {name!r}: dim must be a positive int, got {dim!r}")
        if not 1 <= shards <= 256:
            raise StoreError(f"shards must be in 1..256, got {shards}")
        tags = {}
        for name in tables:
            t = table_tag(name)
            if t in tags:
                raise StoreError(f"tables {tags[t]!r} and {name!r} hash to the same key prefix; rename one")
            tags[t] = name
        self.path = Path(path)
        self.device = resolve_device(device)
        self.seed = int(seed)
        # one half-width for every table, or one per table (DLRM's sqrt(1/rows), ModelConfig.init_scales)
        scales = dict(init_scale) if isinstance(init_scale, Mapping) else {}
        self.lr, self.eps = float(lr), float(eps)
        self.init_scale = float(init_scale) if not isinstance(init_scale, Mapping) else 0.05
        self.hot_capacity_rows = int(hot_capacity_rows)
        if host_cache_rows < 0:
            raise StoreError(f"host_cache_rows must be >= 0, got {host_cache_rows}")
        self.host_cache_rows = int(host_cache_rows)
        self.read_only = read_only
        self.shards = shards
        manifest = read_manifest(self.path)
        if manifest is not None:
            check_manifest(self.path, manifest, dict(tables), shards, self.seed)
            all_tables = {**manifest["tables"], **{k: int(v) for k, v in tables.items()}}
            self._epoch = int(manifest.get("epoch", 0))
        else:
            if read_only:
                raise StoreError(f"no store at {self.path} (no {self.path / 'manifest.json'}); cannot open read-only")
            all_tables = {k: int(v) for k, v in tables.items()}
            self._epoch = 0
        if not read_only:
            self.path.mkdir(parents=True, exist_ok=True)
            self._manifest = {"format": FORMAT, "tables": all_tables, "shards": shards, "seed": self.seed,
                              "epoch": self._epoch}
        else:
            self._manifest = manifest
        if cold is None:  # a manifest is written only once every shard exists, so with one, each must be there
            cold = RocksDBColdTier(str(self.path), shards, block_cache_mb, read_only=read_only, sync=sync,
                                   memtable_mb=memtable_mb, existing=manifest is not None)
        self.cold: ColdTier = cold
        if not read_only:  # after the cold tier exists (see RocksDBColdTier's ``existing``)
            try:
                write_manifest(self.path, self._manifest)
            except BaseException:
                self.cold.close()
                raise
        self.tables = {n: _Table(n, int(d), self.device, (max_id or {}).get(n)) for n, d in tables.items()}
        for n, t in self.tables.items():
            t.init_scale = float(scales.get(n, self.init_scale))
            if not 0 < t.init_scale <= 1e3:
                self.cold.close()
                raise StoreError(f"table {n!r}: init scale must be in (0, 1000], got {t.init_scale!r}")
        self._by_tag = {t.tag: t for t in self.tables.values()}
        if self.host_cache_rows:
            per_table = max(1, self.host_cache_rows // len(self.tables))
            for t in self.tables.values():
                t.cache = HostCache(per_table, t.dtype, self._spiller(t), admission=cache_admission)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="store-prefetch")
        self.hot_hits = 0
        self.cold_hits = 0
        self.created = 0
        # per table: the last lookup's probe, for apply_gradients, and the last prefetch's, for lookup.
        # Per table, not one for the store: a training step looks up every table before it applies the
        # gradients of any (and prefetches every table of the next step), so one slot kept only the
        # last table's probe and the other 25 of `bench train`'s tables probed both indexes again
        self._memo: dict[str, _Probe] = {}
        self._pre: dict[str, _Probe] = {}
        self._closed = False

    @classmethod
    def from_config(cls, cfg, device, path: str | None = None, read_only: bool = False) -> "EmbeddingStore":
        dim = cfg.model.embedding_dim
        tables = {f.name: dim for f in cfg.model.fields}
        cap = hot_budget_rows(cfg)
        s = cfg.store
        return cls(path or s.path, tables, shards=s.shards, seed=cfg.model.seed, device=device,
                   hot_capacity_rows=cap, lr=s.adagrad_lr, eps=s.adagrad_eps, init_scale=cfg.model.init_scales(s.init_scale),
                   block_cache_mb=s.block_cache_mb, host_cache_rows=s.host_cache_rows, read_only=read_only,
                   cache_admission=s.cache_admission)

    # -- validation -----------------------------------------------------------------
    def _table(self, table: str) -> _Table:
        if self._closed:
            raise StoreError("the store is closed")
        t = self.tables.get(table)
        if t is None:
            raise StoreError(f"unknown table {table!r}; tables: {', '.join(sorted(self.tables))}")
        return t

    def _ids(self, t: _Table, ids, what: str = "ids") -> np.ndarray:
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        a = np.asarray(ids)
        if a.ndim != 1:
            raise StoreError(f"{t.name}: {what} must be a 1-D array, got shape {a.shape}")
        if a.dtype.kind not in "iu":
            if a.size == 0:
                return np.empty(0, dtype=np.int64)
            raise StoreError(f"{t.name}: {what} must be integers, got dtype {a.dtype}")
        if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
            raise StoreError(f"{t.name}: {what} must fit in int64; got {int(a.max())}")
        a = a.astype(np.int64, copy=False)
        if t.max_id is not None and a.size and (a.min() < 0 or a.max() >= t.max_id):
            bad = a[(a < 0) | (a >= t.max_id)][0]
            raise StoreError(f"{t.name}: id {int(bad)} is outside [0, {t.max_id})")
        return a

    def _unique_ids(self, t: _Table, ids) -> np.ndarray:
        a = self._ids(t, ids)
        if len(a) > 1:
            if not np.all(a[1:] > a[:-1]):  # sorted-unique fast path, else check properly
                s = np.sort(a)
                d = s[1:] == s[:-1]
                if d.any():
                    raise StoreError(f"{t.name}: ids must be unique here; id {int(s[1:][d][0])} repeats "
                                     "(sum the gradients of repeated ids first)")
        return a

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"store {self.path} is open read-only")

    # -- cold rows through the buffers ------------------------------------------------
    def _fetch(self, t: _Table, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Current records of unique cold ``ids`` (buffers first, then RocksDB)."""
        n = len(ids)
        recs = np.zeros(n, dtype=t.dtype)
        found = np.zeros(n, dtype=bool)
        have = np.zeros(n, dtype=bool)
        for b in reversed(t.buffers):
            b.take(ids, recs, found, have)
        if not have.all():
            rest = ~have
            r, f = self.cold.get(t.tag, t.salt, ids[rest], t.dtype)
            scatter(recs, rest, r)
            found[rest] = f
        return recs, found

    def _cold_rows(self, t: _Table, ids: np.ndarray, touch: bool, count: bool = True,
                   known: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Current ``(records, stored, cache slots)`` of unique cold ``ids``: host cache, then
        buffers, then RocksDB. A row never stored reads as its init record (acc 0, ts 0,
        epoch 0). ``touch`` marks cache hits as just used; ``count`` counts them as lookups."""
        c = t.cache
        if c is None:
            recs, found = self._fetch(t, ids)
            slots = np.full(len(ids), -1, dtype=np.int64)
        else:
            slots = c.lookup(ids, count, known) if touch else c.find(ids) if known is None else known
            hit = slots >= 0
            if hit.all():
                return gather(c.rec, slots), c.stored[slots], slots
            recs = np.empty(len(ids), dtype=t.dtype)
            found = np.empty(len(ids), dtype=bool)
            if hit.any():
                scatter(recs, hit, gather(c.rec, slots[hit]))
                found[hit] = c.stored[slots[hit]]
            miss = ~hit
            r, f = self._fetch(t, ids[miss])
            scatter(recs, miss, r)
            found[miss] = f
        if not found.all():
            recs["w"][~found] = init_rows(t.salt, self.seed, ids[~found], t.dim, t.init_scale)
        return recs, found, slots

    def _store_cold(self, t: _Table, ids: np.ndarray, new: np.ndarray, old: np.ndarray, found: np.ndarray,
                    slots: np.ndarray) -> None:
        """New records for cold rows: into the cache (dirty) when it is on, else straight to RocksDB."""
        c = t.cache
        if c is None:
            self._write(t, ids, new, old, found)
            return
        hit = slots >= 0
        if hit.any():
            c.update(slots[hit], gather(new, hit))
        if not hit.all():
            miss = ~hit
            c.insert(ids[miss], gather(new, miss), np.ones(int(miss.sum()), dtype=bool), dirty=True)

    def _spiller(self, t: _Table):
        def spill(ids: np.ndarray, recs: np.ndarray) -> None:
            self.cold.put(t.tag, t.salt, ids, recs)
            for b in t.buffers:
                b.on_write(ids, recs)
        return spill

    def _flush_caches(self) -> int:
        return sum(t.cache.flush() for t in self.tables.values() if t.cache is not None)

    def _remember(self, t: _Table, ids: np.ndarray, recs: np.ndarray, found: np.ndarray) -> None:
        t.buffers = [b for b in t.buffers if b.future is not None][-(_MAX_BUFFERS - 1):]
        t.buffers.append(RowBuffer(ids, recs=recs.copy(), found=found.copy()))

    def _write(self, t: _Table, ids, new, old, old_found) -> None:
        self.cold.write(t.tag, t.salt, ids, new, old, old_found)
        for b in t.buffers:
            b.on_write(ids, new)

    def _new_records(self, t: _Table, ids: np.ndarray) -> np.ndarray:
        r = np.zeros(len(ids), dtype=t.dtype)
        r["w"] = init_rows(t.salt, self.seed, ids, t.dim, t.init_scale)
        r["ts"] = time.time()
        r["ep"] = self._epoch + 1
        return r

    def _drain(self) -> None:
        """Finish background reads and forget the buffers (before scans and migrations)."""
        for t in self.tables.values():
            for b in t.buffers:
                b._settle()
            t.buffers = []

    # -- public API -------------------------------------------------------------------
    def init_rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        t = self._table(table)
        return init_rows(t.salt, self.seed, self._ids(t, ids), t.dim, t.init_scale)

    def hot_mask(self, table: str, ids: np.ndarray) -> np.ndarray:
        t = self._table(table)
        return t.hot.mask(self._ids(t, ids))

    def lookup(self, table: str, ids: np.ndarray) -> torch.Tensor:
        """Rows of ``ids`` (any order, repeats allowed) as ``[n, dim]`` float32 on the device.

        An unseen id reads as its deterministic init; the row is materialised in RocksDB
        by its first write (``apply_gradients``/``upsert_rows``/promotion), which is
        indistinguishable through this API from storing it here and saves one write
        per new row (new ids are most of the cold traffic under Zipf). Fetched cold
        rows are kept for the ``apply_gradients`` that usually follows.
        """
        return self._get(table, ids, remember=True)

    def peek(self, table: str, ids: np.ndarray) -> torch.Tensor:
        """Like ``lookup`` but never writes: unseen ids give their init vector."""
        return self._get(table, ids, remember=False)

    def _get(self, table: str, ids, remember: bool) -> torch.Tensor:
        t = self._table(table)
        ids = self._ids(t, ids)
        n = len(ids)
        pre = self._pre.pop(t.name, None)
        known = None
        if pre is not None and pre.valid_for(t, ids):
            slots, known = pre.hot, pre.cache  # prefetch(ids) already probed both indexes for these ids
        else:
            slots = t.hot.find(ids)
        is_hot = slots >= 0
        nh = int(is_hot.sum())
        self.hot_hits += nh
        self.cold_hits += n - nh
        self._memo.pop(t.name, None)
        if nh == n:
            return t.hot.w[torch.from_numpy(slots).to(self.device)]
        cold_pos = np.flatnonzero(~is_hot)
        cids = ids[cold_pos]
        if len(cids) < 2 or bool(np.all(cids[1:] > cids[:-1])):  # already sorted unique (the trainer's
            uniq, inv = cids, np.arange(len(cids))                  # usual call): skip np.unique
        else:
            uniq, inv = np.unique(cids, return_inverse=True)
        recs, found, slots_c = self._cold_rows(t, uniq, touch=remember, known=known)
        if remember:
            c = t.cache
            if c is not None:
                c.record(uniq)  # frequency admission counts every cold lookup
                miss = slots_c < 0
                refused, out_recs, out_found = False, None, None
                if miss.any():
                    slots_c = slots_c.copy()
                    slots_c[miss] = c.insert(uniq[miss], gather(recs, miss), found[miss], dirty=False)
                    hp = np.flatnonzero(~miss)  # an eviction (tiny cache) may have taken a row just hit
                    hs = slots_c[hp]
                    lost = hp[~c.used[hs] | (c.sid[hs] != uniq[hp])]
                    slots_c[lost] = -1
                    out = miss & (slots_c < 0)  # refused by admission: kept for the apply_gradients that follows
                    if out.any():
                        out_recs, out_found = recs[out], found[out]
                        self._remember(t, uniq[out], out_recs, out_found)
                    # admission decides row by row only for a batch that fits the cache (a bigger one is cut)
                    refused = c.freq is not None and int(np.count_nonzero(miss)) <= c.capacity and not len(lost)
                if uniq is cids:  # the usual call: remember where this batch's rows are for apply_gradients
                    # ids.copy(): the caller may refill its array
                    self._memo[t.name] = _Probe(t.name, ids.copy(), slots, slots_c, t.hot.gen, c.gen, refused,
                                                out_recs, out_found)
            else:
                self._remember(t, uniq, recs, found)
        cold_rows = torch.from_numpy(np.ascontiguousarray(recs["w"][inv.reshape(-1)]))
        if nh == 0:
            return cold_rows.to(self.device)
        out = torch.empty((n, t.dim), dtype=torch.float32, device=self.device)
        hot_pos = np.flatnonzero(is_hot)
        out[torch.from_numpy(hot_pos).to(self.device)] = t.hot.w[torch.from_numpy(slots[hot_pos]).to(self.device)]
        out[torch.from_numpy(cold_pos).to(self.device)] = cold_rows.to(self.device)
        return out

    def apply_gradients(self, table: str, ids: np.ndarray, grads: torch.Tensor) -> None:
        """Row-wise Adagrad on rows ``ids`` (unique) with ``grads [n, dim]`` float32."""
        self._writable()
        t = self._table(table)
        ids = self._unique_ids(t, ids)
        if isinstance(grads, np.ndarray):
            grads = torch.from_numpy(grads)
        if not isinstance(grads, torch.Tensor):
            raise StoreError(f"{table}: grads must be a torch.Tensor, got {type(grads).__name__}")
        if grads.dtype != torch.float32:
            raise StoreError(f"{table}: grads must be float32, got {grads.dtype}")
        if tuple(grads.shape) != (len(ids), t.dim):
            raise StoreError(f"{table}: grads must have shape ({len(ids)}, {t.dim}), got {tuple(grads.shape)}")
        if len(ids) == 0:
            return
        grads = grads.detach()
        gnp = grads.numpy() if grads.device.type == "cpu" else None  # host grads: numpy, no torch dispatch
        if not bool(np.isfinite(gnp).all() if gnp is not None else torch.isfinite(grads).all()):
            raise StoreError(f"{table}: grads contain NaN or inf; nothing was applied")
        now = time.time()
        memo = self._memo.pop(t.name, None)
        cslots = None
        memo_ok = memo is not None and memo.valid_for(t, ids)
        if memo_ok:
            slots, cslots = memo.hot, memo.cache  # where lookup(ids) just found or put these rows
        else:
            slots = t.hot.find(ids)
        is_hot = slots >= 0
        if is_hot.any():
            hp = np.flatnonzero(is_hot)
            s = slots[hp]
            if self.device.type == "cpu":  # numpy: same IEEE ops, no per-op dispatch cost
                hw, ha = t.hot.w.numpy(), t.hot.acc.numpy()
                g = gnp if gnp is not None else grads.cpu().numpy()
                g = g if len(hp) == len(ids) else g[hp]
                hw[s], ha[s] = adagrad_rows_np(hw[s], ha[s], g, self.lr, self.eps)
            else:
                st = torch.from_numpy(s).to(self.device)
                g = grads[torch.from_numpy(hp).to(grads.device)].to(self.device)
                w, acc = adagrad_rows(t.hot.w[st], t.hot.acc[st], g, self.lr, self.eps)
                t.hot.w[st] = w
                t.hot.acc[st] = acc
            t.hot.dirty[s] = True
            t.hot.ep[s] = self._epoch + 1
            t.hot.ts[s] = now
        if not is_hot.all():
            cp = np.flatnonzero(~is_hot)
            cids = ids[cp]
            cached = cslots is not None and bool((cslots >= 0).all())
            # lookup(ids) just ran frequency admission for these rows: the ones it refused go straight back
            # to RocksDB, as a refused dirty row does, instead of through a second admission (which compares
            # the same counts against the next, no weaker, candidates), and their records come from the probe
            refused_out = not cached and memo_ok and memo.refused
            if cached:
                old, found = gather(t.cache.rec, cslots), t.cache.stored[cslots]
            elif refused_out:
                t.cache.lookup(cids, count=False, slots=cslots)  # the hits are used again, as _cold_rows marks them
                hit = cslots >= 0
                old = np.empty(len(cids), dtype=t.dtype)
                found = np.empty(len(cids), dtype=bool)
                if hit.any():
                    scatter(old, hit, gather(t.cache.rec, cslots[hit]))
                    found[hit] = t.cache.stored[cslots[hit]]
                miss = ~hit
                scatter(old, miss, memo.refused_recs)
                found[miss] = memo.refused_found
            else:
                old, found, cslots = self._cold_rows(t, cids, touch=True, count=False, known=cslots)
            self.created += len(found) - int(np.count_nonzero(found))
            if gnp is not None:
                g = gnp if len(cp) == len(ids) else gnp[cp]
            else:
                g = grads[torch.from_numpy(cp).to(grads.device)].cpu().numpy()
            new = old if cached or refused_out else old.copy()  # old records are not needed again then
            new["w"], new["acc"] = adagrad_rows_np(old["w"], old["acc"], g, self.lr, self.eps)
            new["ts"] = now
            new["ep"] = self._epoch + 1
            if cached:  # every row already has its cache slot (lookup put it there): update in place
                t.cache.update(cslots, new)
            elif refused_out:
                t.cache.update(cslots[hit], gather(new, hit))
                t.cache.write_back(cids[miss], gather(new, miss))
            else:
                self._store_cold(t, cids, new, old, found, cslots)

    def upsert_rows(self, table: str, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Overwrite the vectors of rows ``ids`` (unique); optimizer state kept (zero if new)."""
        self._writable()
        t = self._table(table)
        self._memo.pop(table, None)  # a row written here may be one a remembered lookup refused
        ids = self._unique_ids(t, ids)
        if isinstance(vectors, torch.Tensor):
            vectors = vectors.detach().cpu().numpy()
        v = np.asarray(vectors)
        if v.dtype != np.float32:
            raise StoreError(f"{table}: vectors must be float32, got {v.dtype}")
        if v.shape != (len(ids), t.dim):
            raise StoreError(f"{table}: vectors must have shape ({len(ids)}, {t.dim}), got {v.shape}")
        if len(ids) == 0:
            return
        now = time.time()
        slots = t.hot.find(ids)
        is_hot = slots >= 0
        if is_hot.any():
            s = slots[is_hot]
            t.hot.w[torch.from_numpy(s).to(self.device)] = torch.from_numpy(v[is_hot]).to(self.device)
            t.hot.dirty[s] = True
            t.hot.ep[s] = self._epoch + 1
            t.hot.ts[s] = now
        if not is_hot.all():
            cids = ids[~is_hot]
            old, found, cslots = self._cold_rows(t, cids, touch=True)
            new = old.copy()
            new["w"] = v[~is_hot]
            new["ts"] = now
            new["ep"] = self._epoch + 1
            self._store_cold(t, cids, new, old, found, cslots)

    def prefetch(self, table: str, ids: np.ndarray) -> None:
        """Start reading the cold rows of ``ids`` in the background for a later lookup/apply."""
        t = self._table(table)
        ids = self._ids(t, ids)
        uniq = unique_sorted(ids)  # sorted first: the index searches below are fastest on sorted ids
        hslots = t.hot.find(uniq)
        cold = uniq[hslots < 0]
        if t.cache is not None and len(cold):
            cslots = t.cache.find(cold)
            # the usual next call is lookup(these unique ids): it reuses both probes
            self._pre[table] = _Probe(table, uniq, hslots, cslots, t.hot.gen, t.cache.gen)
            cold = cold[cslots < 0]  # cached rows need no read
        if len(cold) == 0:
            return
        fut = self._pool.submit(self.cold.get, t.tag, t.salt, cold, t.dtype)
        t.buffers.append(RowBuffer(cold, future=fut))
        if len(t.buffers) > _MAX_BUFFERS:
            t.buffers[0]._settle()
            t.buffers = t.buffers[-_MAX_BUFFERS:]

    def set_hot(self, hot: dict[str, np.ndarray]) -> dict:
        """Make ``hot`` the complete hot set (a table not named has no hot rows).

        Demoted rows (with their Adagrad state) are written to RocksDB; promoted rows are
        read from it (or initialised). No update is lost: all reads and writes happen here,
        in the caller's thread, after pending prefetches have settled.
        """
        self._writable()
        want = {}
        for name, ids in hot.items():
            t = self._table(name)
            want[name] = np.unique(self._ids(t, ids))
        total = sum(len(v) for v in want.values())
        if total > self.hot_capacity_rows:
            raise StoreError(f"hot set of {total} rows exceeds hot_capacity_rows={self.hot_capacity_rows}")
        self._drain()
        self._memo, self._pre = {}, {}
        stats = {"promoted": 0, "demoted": 0, "kept": 0, "created": 0, "hot_rows": total}
        t0 = time.perf_counter()
        for name, t in self.tables.items():
            new_ids = want.get(name, np.empty(0, dtype=np.int64))
            h = t.hot
            cur = h.slot_ids()
            stay = np.isin(cur, new_ids)
            # demote: write rows leaving the hot tier back to RocksDB
            dem_slots = np.flatnonzero(~stay)
            if len(dem_slots):
                self._spill_hot(t, cur[dem_slots], dem_slots)
            # promote: read rows entering the hot tier
            prom = new_ids[~np.isin(new_ids, cur)]
            recs, found = self.cold.get(t.tag, t.salt, prom, t.dtype)
            dirty = ~found
            if t.cache is not None and len(prom):  # cached rows move to the hot tier with their state
                hit, crec, cstored, cdirty = t.cache.take(prom)
                recs[hit], found[hit], dirty[hit] = crec, cstored, cdirty | ~cstored
            if not found.all():
                recs[~found] = self._new_records(t, prom[~found])
            keep_slots = np.flatnonzero(stay)
            kst = torch.from_numpy(keep_slots).to(self.device)
            w = torch.cat([h.w[kst], torch.from_numpy(recs["w"].copy()).to(self.device)])
            acc = torch.cat([h.acc[kst], torch.from_numpy(recs["acc"].copy()).to(self.device)])
            h.rebuild(np.concatenate([cur[keep_slots], prom]), w, acc,
                      np.concatenate([h.ep[keep_slots], recs["ep"].astype(np.int64)]),
                      np.concatenate([h.ts[keep_slots], recs["ts"]]),
                      np.concatenate([h.dirty[keep_slots], dirty]))
            stats["promoted"] += len(prom)
            stats["demoted"] += len(dem_slots)
            stats["kept"] += len(keep_slots)
            stats["created"] += int((~found).sum())
        stats["seconds"] = time.perf_counter() - t0
        return stats

    def _spill_hot(self, t, ids: np.ndarray, slots: np.ndarray) -> None:
        """Write hot ``slots`` (holding ``ids``) to RocksDB with their Adagrad state and times."""
        h = t.hot
        old, found = self.cold.get(t.tag, t.salt, ids, t.dtype)
        rec = np.zeros(len(ids), dtype=t.dtype)
        st = torch.from_numpy(slots).to(self.device)
        rec["w"] = h.w[st].cpu().numpy()
        rec["acc"] = h.acc[st].cpu().numpy()
        rec["ts"] = h.ts[slots]
        rec["ep"] = h.ep[slots]
        self.cold.write(t.tag, t.salt, ids, rec, old, found)

    def _write_back_hot(self) -> int:
        """Refresh RocksDB's backup copy of hot rows changed since the last write-back."""
        n = 0
        for t in self.tables.values():
            h = t.hot
            dirty = np.flatnonzero(h.dirty)
            if not len(dirty):
                continue
            sid = h.slot_ids()
            for lo in range(0, len(dirty), SPILL_CHUNK):  # chunks bound the transient memory
                d = dirty[lo:lo + SPILL_CHUNK]
                self._spill_hot(t, sid[d], d)
                h.dirty[d] = False
            n += len(dirty)
        return n

    def checkpoint(self, path: str) -> int:
        """Write a consistent, durable point to ``path`` (must not exist yet); returns its epoch.

        Rows changed after this call carry a higher epoch, so ``changed_rows(since=epoch)``
        gives exactly what changed after it.
        """
        self._writable()
        dest = Path(path)
        if dest.exists() and any(dest.iterdir()):
            raise StoreError(f"checkpoint directory {dest} already exists and is not empty")
        dest.mkdir(parents=True, exist_ok=True)
        self._drain()
        self._flush_caches()
        self._write_back_hot()
        epoch = self._epoch + 1
        self.cold.checkpoint(dest)
        hot = {name: t.hot.slot_ids() for name, t in self.tables.items()}
        save_npz(dest / "hot.npz", hot)  # not np.savez(**hot): tables may be named "file"
        write_manifest(dest, {**self._manifest, "epoch": epoch, "hot_capacity_rows": self.hot_capacity_rows})
        self._epoch = epoch
        self._manifest["epoch"] = epoch
        write_manifest(self.path, self._manifest)
        return epoch

    @classmethod
    def restore(cls, checkpoint_path: str, path: str | None = None, **kwargs) -> "EmbeddingStore":
        """Open the state of a checkpoint (classmethod).

        With ``path``, the checkpoint is copied there (replacing what is there) and the
        copy becomes the live store; without, the checkpoint directory itself is opened
        and becomes live. Tables, shards and seed come from the checkpoint's manifest
        unless given; the checkpoint's hot set is re-promoted (cut to ``hot_capacity_rows``).
        """
        src = Path(checkpoint_path)
        man = read_manifest(src)
        if man is None:
            raise StoreError(f"{src} is not a store checkpoint (no manifest.json)")
        if path is not None and Path(path).resolve() != src.resolve():
            if Path(path).exists():
                shutil.rmtree(path)
            shutil.copytree(src, path)
        else:
            path = str(src)
        kwargs.setdefault("tables", man["tables"])
        kwargs.setdefault("shards", man["shards"])
        kwargs.setdefault("seed", man["seed"])
        kwargs.setdefault("hot_capacity_rows", man.get("hot_capacity_rows", 0))
        store = cls(str(path), **kwargs)
        hot_file = Path(path) / "hot.npz"
        if hot_file.exists():
            with np.load(hot_file) as z:
                hot = {k: z[k] for k in z.files if k in store.tables}
            budget = store.hot_capacity_rows  # a smaller hot tier than the checkpoint's keeps a prefix
            for k in hot:
                hot[k] = hot[k][:budget]
                budget -= len(hot[k])
            if sum(len(v) for v in hot.values()) and not store.read_only:
                store.set_hot(hot)
                for t in store.tables.values():
                    t.hot.dirty[:] = False  # identical to the RocksDB copy just read
        return store

    def changed_rows(self, since: int | None = None) -> Iterator[pa.RecordBatch]:
        """Rows changed after checkpoint epoch ``since`` (None: all rows), as Arrow batches
        with columns ``table`` (string), ``id`` (int64), ``vector`` (fixed_size_list<float32>[dim])."""
        self._table(next(iter(self.tables)))
        self._drain()
        floor = -1 if since is None else int(since)
        for t in self.tables.values():
            h = t.hot
            sel = np.flatnonzero(h.ep > floor)
            if len(sel):
                w = h.w[torch.from_numpy(sel).to(self.device)].cpu().numpy()
                yield _batch(t.name, h.slot_ids()[sel], w)
            if t.cache is not None:  # the cache owns its rows: export them from there
                cids, crecs, cstored = t.cache.items()
                sel = np.flatnonzero(cstored & (crecs["ep"].astype(np.int64) > floor))
                if len(sel):
                    yield _batch(t.name, cids[sel], crecs["w"][sel])
        for t, ids, recs in self._scan_cold():
            keep = (recs["ep"].astype(np.int64) > floor) & ~t.hot.mask(ids)
            if t.cache is not None:
                keep &= t.cache.find(ids) < 0
            if keep.any():
                yield _batch(t.name, ids[keep], recs["w"][keep])

    def export_records(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """Every stored row with its optimizer state, as ``(table, ids, records)`` chunks: what a
        resharding moves. Open a checkpoint read-only for this (a checkpoint holds the hot rows in
        RocksDB too); on a live store, call :meth:`flush` after a checkpoint first."""
        for t, ids, recs in self._scan_cold():
            yield t.name, ids, recs

    def import_records(self, table: str, ids: np.ndarray, records: np.ndarray) -> None:
        """Store rows exactly as exported (vector, Adagrad state, timestamps); ``ids`` unique."""
        self._writable()
        t = self._table(table)
        self._memo.pop(table, None)  # a row written here may be one a remembered lookup refused
        ids = self._unique_ids(t, ids)
        if records.dtype != t.dtype or len(records) != len(ids):
            raise StoreError(f"{table}: {len(records)} records of {records.dtype} for {len(ids)} ids of {t.dtype}")
        if len(ids) == 0:
            return
        if t.hot.mask(ids).any():
            raise StoreError(f"{table}: import_records into hot rows (import before the hot set is applied)")
        old, found, cslots = self._cold_rows(t, ids, touch=False)
        self._store_cold(t, ids, records, old, found, cslots)

    def _scan_cold(self):
        """Every row stored in RocksDB, as ``(table, ids, records)`` chunks (a full scan)."""
        for tags, ids, vals in self.cold.scan():
            for tag in np.unique(tags):
                t = self._by_tag.get(int(tag))
                if t is None:
                    continue
                sel = np.flatnonzero(tags == tag)
                yield t, ids[sel], unpack_records([vals[i] for i in sel.tolist()], t.dtype)

    def expire(self, older_than_s: float) -> int:
        """Delete cold rows untouched for ``older_than_s`` seconds; returns how many."""
        self._writable()
        self._drain()
        self._memo, self._pre = {}, {}
        for t in self.tables.values():  # write cached rows back and forget them: RocksDB decides
            if t.cache is not None:
                t.cache.clear()
        cutoff = time.time() - float(older_than_s)
        n = 0
        for t, ids, recs in self._scan_cold():
            old = (recs["ts"] < cutoff) & ~t.hot.mask(ids)
            if old.any():
                self.cold.write(t.tag, t.salt, ids[old], None, recs[old], np.ones(int(old.sum()), bool))
                n += int(old.sum())
        return n

    def stats(self) -> dict:
        hot_rows = sum(len(t.hot) for t in self.tables.values())
        total = self.hot_hits + self.cold_hits
        caches = [t.cache for t in self.tables.values() if t.cache is not None]
        return {
            "cache_rows": sum(len(c) for c in caches),
            "cache_hits": sum(c.hits for c in caches),
            "cache_misses": sum(c.misses for c in caches),
            "cache_dirty": sum(c.dirty_count() for c in caches),
            "cache_evicted": sum(c.evicted for c in caches),
            "cache_written_back": sum(c.spilled for c in caches),
            "cache_bytes": sum(c.nbytes() for c in caches),
            "hot_rows": hot_rows,
            "cold_rows": self.cold.count_estimate(),
            **self.cold.io_stats(),
            "hot_hits": self.hot_hits,
            "cold_hits": self.cold_hits,
            "hot_hit_rate": self.hot_hits / total if total else 0.0,
            "created": self.created,
            "hot_bytes": sum(t.hot.nbytes() for t in self.tables.values()),
            "epoch": self._epoch,
            "device": str(self.device),
        }

    def flush(self) -> None:
        """Write dirty cached rows back, then make every write survive power loss (fsync the WALs)."""
        if not self.read_only:
            self._flush_caches()
        self.cold.sync_wal()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._drain()
            if not self.read_only:  # a clean close loses nothing: cached and hot rows go back
                self._flush_caches()
                self._write_back_hot()
        finally:
            self._pool.shutdown(wait=True)
            self.cold.close()
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _batch(table: str, ids: np.ndarray, w: np.ndarray) -> "pa.RecordBatch":
    import pyarrow as pa  # here, not at module level: ~25 MB resident that only export needs

    dim = w.shape[1]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(w, dtype=np.float32).reshape(-1)), dim)
    return pa.RecordBatch.from_arrays(
        [pa.array([table] * len(ids), type=pa.string()), pa.array(ids, type=pa.int64()), vec],
        names=["table", "id", "vector"])
