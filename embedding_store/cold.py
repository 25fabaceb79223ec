"""The built-in cold tier (``store_types.ColdTier``): rows in N RocksDB shards (separate
databases in one directory).

Why these RocksDB options (rows are ~80-byte random point reads/writes):
- bloom filters (10 bits/key, whole-key): a miss (a never-seen id, common with
  unbounded ids) is answered without touching data blocks;
- one LRU block cache shared by all shards, sized by ``block_cache_mb``, with index
  and filter blocks cached and L0 ones pinned;
- LZ4 only for the bottom level, none above: float rows barely compress, and
  uncompressed upper levels keep point reads cheap;
- write buffers bounded over all shards (``memtable_mb``): they are most of the
  tier's resident memory;
- small blocks (4 KiB) because reads are single rows, not scans;
- WAL on, ``sync=False``: a SIGKILL loses nothing that ``write`` acknowledged (the
  WAL is in the OS page cache); ``sync=True`` (``durable_sync``) survives power loss too.

Atomicity across shards: one logical write (a batch of rows of one table) becomes one
``WriteBatch`` per shard it touches. Each of those batches also carries an *undo
record* (the rows' previous bytes, the write's sequence number and the set of shards
taking part). On open, if the newest write reached only some of its shards (a kill
between shard writes), the shards that did apply it are rolled back — so the store
always reopens to a prefix of acknowledged writes, never half of one. The host cache's
write-backs (``put``) skip the undo record: with the cache on, only checkpoints are
consistent points anyway (see store.py), and the undo record would cost a read per row.

Reads of ids never stored skip RocksDB entirely through an in-memory stored-key filter
(``keyset.py``, 4 B/row, built by a key scan at open). The block cache and the write
buffers are sized for the resident-memory budget, not for speed: random single-row
reads are served by the OS page cache (outside the process) as well as by the block
cache. Write buffers have a 2 MB floor per buffer (two per shard). Cache write-backs
keep the WAL: a SIGKILL loses no acknowledged ``put`` either.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import rocksdict as rd

from .errors import StoreError, StoreMismatchError
from .keyset import StoredKeys
from .rows import KEY_BYTES, decode_keys, encode_keys, pack_records, scatter, shard_of, unpack_records

MANIFEST = "manifest.json"
UNDO_KEY = b"~undo"  # meta keys are not 13 bytes long, so they never collide with rows
FORMAT = 1
_UNDO_HEAD = struct.Struct("<QII")  # seq, n rows, record size


def _options(cache: rd.Cache | None, read_only: bool, write_buffer_mb: int) -> rd.Options:
    o = rd.Options(raw_mode=True)
    o.create_if_missing(not read_only)
    t = rd.BlockBasedOptions()
    t.set_bloom_filter(10, False)
    t.set_block_size(4096)
    if cache is not None:
        t.set_block_cache(cache)
    t.set_cache_index_and_filter_blocks(True)
    t.set_pin_l0_filter_and_index_blocks_in_cache(True)
    o.set_block_based_table_factory(t)
    o.set_compression_type(rd.DBCompressionType.none())
    o.set_bottommost_compression_type(rd.DBCompressionType.lz4())
    o.set_write_buffer_size(write_buffer_mb << 20)
    o.set_max_write_buffer_number(2)
    o.set_max_background_jobs(2)
    o.set_level_compaction_dynamic_level_bytes(True)
    o.set_keep_log_file_num(2)
    return o


def read_manifest(path: str | os.PathLike) -> dict | None:
    p = Path(path) / MANIFEST
    return json.loads(p.read_text()) if p.exists() else None


def write_manifest(path: str | os.PathLike, manifest: dict) -> None:
    p = Path(path) / MANIFEST
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, p)


def check_manifest(path, have: dict, tables: dict[str, int], shards: int, seed: int) -> None:
    """Raise StoreMismatchError naming every difference between a directory and the request."""
    problems = []
    if have.get("format") != FORMAT:
        problems.append(f"format {have.get('format')} != {FORMAT}")
    if have["shards"] != shards:
        problems.append(f"shards: directory has {have['shards']}, asked for {shards}")
    if have["seed"] != seed:
        problems.append(f"seed: directory has {have['seed']}, asked for {seed}")
    for name, dim in tables.items():
        old = have["tables"].get(name)
        if old is not None and old != dim:
            problems.append(f"table {name!r}: directory has dim {old}, asked for dim {dim}")
    if problems:
        raise StoreMismatchError(f"store directory {path} was created with another layout: " + "; ".join(problems))


def _timed(counter: str):
    """Add the wall time of each call to ``self.<counter>`` (the store's I/O split, see ``stats``)."""
    def wrap(fn):
        @functools.wraps(fn)
        def timed(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) + time.perf_counter() - t0)
        return timed
    return wrap


class RocksDBColdTier:
    """Sharded RocksDB rows of every table; batched, shard-atomic-as-a-whole writes.

    The built-in :class:`~streamrec.embedding_store.store_types.ColdTier`. ``existing``:
    the directory holds a store already (its manifest exists), so every shard must be
    there; a missing one is lost data, which RocksDB would silently re-create empty.
    """

    def __init__(self, path: str, shards: int, block_cache_mb: int, read_only: bool = False,
                 sync: bool = False, memtable_mb: int = 64, existing: bool = False):
        self.path = Path(path)
        if existing:
            missing = [f"shard-{i:03d}" for i in range(shards) if not (self.path / f"shard-{i:03d}" / "CURRENT").exists()]
            if missing:
                raise StoreError(f"store {self.path} is incomplete: {', '.join(missing)} missing (removed or "
                                 "half-copied); restore it from a checkpoint")
        wb_mb = max(2, memtable_mb // (2 * shards))  # two write buffers per shard
        self.shards = shards
        self.read_only = read_only
        self._cache = rd.Cache(max(1, block_cache_mb) << 20)
        self.dbs: list[rd.Rdict] = []
        access = rd.AccessType.read_only() if read_only else rd.AccessType.read_write()
        for i in range(shards):
            shard = self.path / f"shard-{i:03d}"
            try:
                self.dbs.append(rd.Rdict(str(shard), _options(self._cache, read_only, wb_mb), access_type=access))
            except Exception as e:  # rocksdict's errors name no path: say which shard (disk full, read-only, ...)
                for db in self.dbs:
                    db.close()
                raise StoreError(f"cannot open RocksDB shard {shard}: {e}") from e
        self._wopt = rd.WriteOptions()
        self._wopt.sync = sync
        self._lock = threading.Lock()  # one logical write at a time (undo records assume it)
        self.seq = 0
        self.bytes_written = 0
        self.reads = 0
        self.rows_written = 0
        self.read_s = 0.0  # wall time inside get / write+put: where a batch's RocksDB time goes
        self.write_s = 0.0
        self._after_shard_write = None  # test hook: called with the shard index after each shard write
        self._recover()
        self.stored = StoredKeys()  # which keys may exist: never-stored ids skip RocksDB (keyset.py)
        self.skipped = 0  # reads answered "not stored" by the filter alone
        self._load_keys()

    def _load_keys(self) -> None:
        """Fill the stored-key filter from every shard (after recovery: one key scan)."""
        for db in self.dbs:
            chunk: list[bytes] = []
            for k in db.keys():
                if len(k) == KEY_BYTES:
                    chunk.append(k)
                    if len(chunk) >= 65536:
                        self._add_keys(chunk)
                        chunk = []
            if chunk:
                self._add_keys(chunk)

    def _add_keys(self, keys: list[bytes]) -> None:
        tags, ids = decode_keys(keys)
        for tag in np.unique(tags):
            self.stored.add(int(tag), ids[tags == tag])

    # -- recovery ---------------------------------------------------------------------
    def _undo_of(self, i: int):
        raw = self.dbs[i].get(UNDO_KEY)
        if raw is None:
            return None
        seq, n, rsz = _UNDO_HEAD.unpack_from(raw, 0)
        off = _UNDO_HEAD.size
        members = np.frombuffer(raw, dtype=np.uint8, count=self.shards, offset=off)
        return seq, n, rsz, members, raw, off + self.shards

    def _recover(self) -> None:
        undos = [self._undo_of(i) for i in range(self.shards)]
        seqs = [u[0] if u else 0 for u in undos]
        top = max(seqs) if seqs else 0
        self.seq = top
        if top == 0:
            return
        # the write's shard set from every shard that holds it: a shard already rolled back by an
        # interrupted earlier recovery keeps `top` with an empty set, and trusting that one alone
        # left the other shards' half of the write applied for good
        members = np.zeros(self.shards, dtype=np.uint8)
        for u in undos:
            if u and u[0] == top:
                members |= u[3]
        torn = any(members[j] and seqs[j] < top for j in range(self.shards))
        if not torn:
            return
        if self.read_only:
            raise StoreMismatchError(f"store {self.path} has a torn write; open it read-write once to roll it back")
        for i, u in enumerate(undos):
            if not u or u[0] != top:
                continue
            _, n, rsz, _, raw, off = u
            keys = [raw[off + k * KEY_BYTES: off + (k + 1) * KEY_BYTES] for k in range(n)]
            off += n * KEY_BYTES
            present = raw[off: off + n]
            off += n
            wb = rd.WriteBatch(raw_mode=True)
            for k in range(n):
                if present[k]:
                    wb.put(keys[k], raw[off + k * rsz: off + (k + 1) * rsz])
                else:
                    wb.delete(keys[k])
            # the rolled-back shard keeps seq `top` with an empty undo: re-running recovery is a no-op
            wb.put(UNDO_KEY, _UNDO_HEAD.pack(top, 0, 0) + bytes(self.shards))
            self.dbs[i].write(wb, self._wopt)

    # -- reads ------------------------------------------------------------------------
    @_timed("read_s")
    def get(self, tag: int, salt: int, ids: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Records of ``ids`` (unique) and a bool ``found`` mask; missing rows are zero records."""
        n = len(ids)
        out = np.zeros(n, dtype=dtype)
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return out, found
        self.reads += n
        cand = np.flatnonzero(self.stored.may_contain(tag, ids))  # the rest were never stored
        self.skipped += n - len(cand)
        if len(cand) == 0:
            return out, found
        cids = ids[cand]
        keys = encode_keys(tag, cids)
        order, bounds = self._by_shard(salt, cids)
        for i in range(self.shards):
            sel = order[bounds[i]:bounds[i + 1]]
            if len(sel) == 0:
                continue
            pos = cand[sel]
            vals = self.dbs[i][[keys[p] for p in sel.tolist()]]
            hit = np.fromiter((v is not None for v in vals), dtype=bool, count=len(vals))
            if hit.any():
                got = pos[hit]
                scatter(out, got, unpack_records([v for v in vals if v is not None], dtype))
                found[got] = True
        return out, found

    # -- writes -----------------------------------------------------------------------
    @_timed("write_s")
    def write(self, tag: int, salt: int, ids: np.ndarray, new: np.ndarray | None,
              old: np.ndarray, old_found: np.ndarray) -> None:
        """Atomically (across shards) set rows ``ids`` to records ``new`` (None = delete).

        ``old``/``old_found`` are the rows' current records (the caller has read them
        already); they form the undo record that makes a torn multi-shard write
        roll back on reopen.
        """
        if not self._writable(ids):
            return
        keys = encode_keys(tag, ids)
        vals = pack_records(new) if new is not None else None
        old_vals = old.view(f"S{old.dtype.itemsize}")
        rsz = old.dtype.itemsize
        order, bounds = self._by_shard(salt, ids)
        members = np.zeros(self.shards, dtype=np.uint8)
        members[(bounds[1:] - bounds[:-1]) > 0] = 1
        with self._lock:
            if vals is not None:
                self.stored.add(tag, ids)  # before the write: the filter stays a superset
            self.seq += 1
            head_tail = members.tobytes()
            for i in range(self.shards):
                pos = order[bounds[i]:bounds[i + 1]]
                if len(pos) == 0:
                    continue
                pl = pos.tolist()
                wb = rd.WriteBatch(raw_mode=True)
                kk = [keys[p] for p in pl]
                undo = b"".join([_UNDO_HEAD.pack(self.seq, len(pl), rsz), head_tail, b"".join(kk),
                                 old_found[pos].astype(np.uint8).tobytes(), old_vals[pos].tobytes()])
                wb.put(UNDO_KEY, undo)
                if vals is not None:
                    for p, k in zip(pl, kk):
                        wb.put(k, vals[p])
                else:
                    for k in kk:
                        wb.delete(k)
                self._commit(i, wb)
            self.rows_written += len(ids)

    def _writable(self, ids: np.ndarray) -> bool:
        """False when there is nothing to write; raises on a read-only store."""
        if self.read_only:
            raise PermissionError(f"store {self.path} is open read-only")
        return len(ids) > 0

    def _commit(self, shard: int, wb: "rd.WriteBatch") -> None:
        """Write one shard's batch (one atomic RocksDB write), counting its bytes."""
        self.bytes_written += wb.size_in_bytes()
        self.dbs[shard].write(wb, self._wopt)
        if self._after_shard_write is not None:
            self._after_shard_write(shard)

    def _by_shard(self, salt: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``ids`` grouped by shard: shard i owns ``order[bounds[i]:bounds[i + 1]]``."""
        sh = shard_of(salt, ids, self.shards)
        order = np.argsort(sh, kind="stable")
        return order, np.searchsorted(sh[order], np.arange(self.shards + 1))

    @_timed("write_s")
    def put(self, tag: int, salt: int, ids: np.ndarray, new: np.ndarray) -> None:
        """Set rows ``ids`` to records ``new`` with no undo record: the host cache's write-back.

        With the write-back cache on, only checkpoints are consistent points (see
        store.py), so a kill between shard writes here needs no roll-back, and skipping
        the undo record saves reading every row's old bytes first. Each shard's part is
        still one WriteBatch, so no row is ever torn.
        """
        if not self._writable(ids):
            return
        keys = encode_keys(tag, ids)
        vals = pack_records(new)
        order, bounds = self._by_shard(salt, ids)
        with self._lock:
            self.stored.add(tag, ids)  # before the write: the filter stays a superset
            for i in range(self.shards):
                pl = order[bounds[i]:bounds[i + 1]].tolist()
                if not pl:
                    continue
                wb = rd.WriteBatch(raw_mode=True)
                for p in pl:
                    wb.put(keys[p], vals[p])
                self._commit(i, wb)
            self.rows_written += len(ids)

    # -- scans, maintenance -----------------------------------------------------------
    def scan(self) -> Iterator[tuple[np.ndarray, np.ndarray, list[bytes]]]:
        """Yield ``(tags, ids, values)`` chunks of every row (meta keys skipped)."""
        for keys, vals in self._scan_keys():
            tags, ids = decode_keys(keys)
            yield tags, ids, vals

    def _scan_keys(self) -> Iterator[tuple[list[bytes], list[bytes]]]:
        for db in self.dbs:
            keys: list[bytes] = []
            vals: list[bytes] = []
            it = db.iter()
            it.seek_to_first()
            while it.valid():
                k = it.key()
                if len(k) == KEY_BYTES:
                    keys.append(k)
                    vals.append(it.value())
                    if len(keys) >= 65536:
                        yield keys, vals
                        keys, vals = [], []
                it.next()
            del it
            if keys:
                yield keys, vals

    def count_estimate(self) -> int:
        total = 0
        for db in self.dbs:
            v = db.property_int_value("rocksdb.estimate-num-keys")
            total += int(v or 0)
        return total

    def io_stats(self) -> dict[str, float]:
        return {
            "cold_reads": self.reads,
            "cold_reads_skipped": self.skipped,  # never-stored ids answered by the key filter
            "cold_rows_written": self.rows_written,
            "cold_read_s": self.read_s,  # wall time inside RocksDB reads / writes (any thread)
            "cold_write_s": self.write_s,
            "bytes_written": self.bytes_written,
        }

    def checkpoint(self, dest: Path) -> None:
        """RocksDB checkpoint of every shard (hard links where possible) into ``dest``."""
        with self._lock:
            for i, db in enumerate(self.dbs):
                db.flush_wal(True)
                rd.Checkpoint(db).create_checkpoint(str(dest / f"shard-{i:03d}"))

    def sync_wal(self) -> None:
        for db in self.dbs:
            db.flush_wal(True)

    def close(self) -> None:
        for db in self.dbs:
            try:
                db.close()
            except Exception:  # already closed
                pass
        self.dbs = []
