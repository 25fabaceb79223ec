"""One partition's join state in the faust table, committed atomically per batch of input records.

State keys live in the table as ``<p>/s/<key>`` (JSON values). While a batch is joined, writes stay in a
buffer the reads see; :meth:`TxStore.stage` closes the batch (its changes serialised, still read until the
local database holds them, so the next batch is joined on top of it while this one's examples are being
acknowledged); :meth:`TxStore.commit` then stages ONE value, ``<p>/tx``: the batch's changes, the
input offsets after the batch and the output log's end offsets (a :class:`~.tx_row.BatchTx`), followed by
the changes to their keys, in :attr:`TxStore.outbox`: the records the caller produces to changelog
partition ``p`` (one producer, one partition: they arrive in order). Only once the changelog acknowledged
them does :meth:`TxStore.persist` write them to the partition's RocksDB database, in one atomic write with
the changelog offset they reach and the :class:`Checkpoint` naming the ``tx`` record's place in the
changelog. So the local database always holds exactly the state the changelog holds up to its recorded
offset, and a restart reads the changelog only past it (:mod:`.local_state` checks the copy first).

A changelog cut short by a crash holds the state after some complete ``tx`` plus a part of the applies that
follow it: :meth:`TxStore.recover` stages the last ``tx`` and its applies again, which makes the state
exactly the state after that batch, in the changelog and then in the local copy.

With a faust Table the store reads and writes the partition's RocksDB database directly (the database
faust's own reads use and its changelog recovery writes), not through faust's per-write changelog buffer;
any other mapping of bytes (tests) is read and written as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson

from .tx_row import BatchTx

_DEL = object()
OFFSET_KEY = b"__faust\0offset__"  # where faust's RocksDB store keeps a partition's changelog offset


def digest(value: bytes) -> str:
    """A short fingerprint of a changelog record's value."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """Where the local copy stands in the changelog: the changelog topic, the offset of the last ``tx``
    record it holds and that record's fingerprint (the ``tx`` carries a nonce of the worker run that wrote
    it, so the same offset in another run's changelog, or another topic's, does not match)."""

    topic: str
    offset: int
    digest: str
    tx: dict | None = None  # that tx row without its changes (BatchTx.to_row): a restore reads it instead of the row

    def to_bytes(self) -> bytes:
        out = {"topic": self.topic, "offset": self.offset, "digest": self.digest}
        return dumps(out if self.tx is None else {**out, "tx": self.tx})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Checkpoint":
        """ValueError (or KeyError/TypeError): not a checkpoint."""
        row = loads(raw)
        tx = row.get("tx")
        return cls(str(row["topic"]), int(row["offset"]), str(row["digest"]), dict(tx) if tx is not None else None)


def dumps(v: Any) -> bytes:
    """Compact JSON; what orjson refuses (an integer beyond 64 bits) the standard library writes."""
    try:
        return orjson.dumps(v)
    except TypeError:
        return json.dumps(v, separators=(",", ":")).encode()


def loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def prefixed_items(rdict, prefix: bytes):
    """The (key, value) pairs of a RocksDB database (a rocksdict ``Rdict`` in raw mode, opened by faust or
    read-only by anyone) whose key starts with ``prefix``, in key order."""
    for k, v in rdict.items(from_key=prefix):
        if not k.startswith(prefix):
            return
        yield k, v


def state_prefix(p: int) -> bytes:
    """The key prefix of partition ``p``'s state keys in its database."""
    return f"{p}/s/".encode()


def tx_key(p: int) -> bytes:
    """The key of partition ``p``'s last ``tx`` row in its database."""
    return f"{p}/tx".encode()


def state_items(pairs, prefix: bytes):
    """The ``(key, value)`` pairs of state keys under ``prefix`` (:func:`state_prefix`) as state keys (the
    prefix dropped, decoded) with their values as stored; deleted ones (None) left out."""
    n = len(prefix)
    for k, v in pairs:
        if v is not None:
            yield k[n:].decode(), v


def fingerprint(get, p: int) -> tuple[bytes | None, bytes | None]:
    """What tells partition ``p``'s database content apart between two reads in one worker run, through its
    ``get``: faust's changelog offset and the last ``tx`` row. Every write to the database changes one of
    them: :meth:`TxStore.persist` writes each batch with its ``tx`` row (which carries the run's nonce and
    the batch number) and the changelog offset, and faust's changelog recovery moves the offset."""
    return get(OFFSET_KEY), get(tx_key(p))


class _Db:
    """Partition ``p``'s key-value database: the faust table's RocksDB database for ``p``, or the mapping."""

    FLUSH_BYTES = 8 << 20  # written since the last flush of the memtable: bounds the log a reopen replays

    def __init__(self, table, p: int):
        self.unflushed = 0
        store = getattr(table, "data", None)
        self.faust = store is not None and hasattr(store, "_db_for_partition")
        self.table = table
        self.p = p

    def _rocks(self):
        # the database faust's own reads use and its recovery writes (opened by that recovery; reopened if closed)
        return self.table.data._db_for_partition(self.p)  # faust's store has no public per-partition database

    def get(self, key: bytes) -> bytes | None:
        return self._rocks().get(key) if self.faust else self.table.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if self.faust:
            self._rocks().put(key, value)
        else:
            self.table[key] = value

    def delete(self, key: bytes) -> None:
        if self.faust:
            self._rocks().delete(key)
        else:
            self.table.pop(key, None)

    def items(self):
        return list(self._rocks().items()) if self.faust else list(self.table.items())

    def items_from(self, prefix: bytes):
        """The (key, value) pairs whose key starts with ``prefix`` (in key order with faust's table)."""
        if not self.faust:
            return [(k, v) for k, v in self.table.items() if isinstance(k, bytes) and k.startswith(prefix)]
        return self._prefixed(prefix)

    def _prefixed(self, prefix: bytes):
        return prefixed_items(self._rocks(), prefix)

    def write(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Write ``records`` in order, as one atomic write (RocksDB's WriteBatch) with faust's table."""
        if self.faust:
            import rocksdict

            target = rocksdict.WriteBatch(raw_mode=True)
        else:
            target = self
        for k, v in records:
            if v is None:
                target.delete(k)
            else:
                target.put(k, v)
        if self.faust:
            db = self._rocks()
            db.write(target)
            self.unflushed += sum(len(k) + len(v or b"") for k, v in records)
            if self.unflushed >= self.FLUSH_BYTES:  # in the background: a restart opens the database in
                db.flush(False)  # about the time of reading its files, not of replaying every write since
                self.unflushed = 0


class TxStore(MutableMapping):
    """Partition ``p``'s state keys over ``table`` (a faust Table, or any mapping of bytes in tests).

    Values are stored by reference until :meth:`commit` serialises them (as a dict does): a value changed
    after it was written must be written again to change the state, which is what :class:`~.machine.JoinState`
    does with every value it changes."""

    def __init__(self, table, p: int, topic: str = "", on_hit=None):
        self.db = _Db(table, p)
        self.p = p
        self.topic = topic
        self.prefix = state_prefix(p)
        self.tx_key = tx_key(p)
        self.ck_key = f"{p}/ck".encode()
        self.run = os.urandom(8).hex()  # in every tx row this store writes: its fingerprint is this run's
        self.buf: dict[str, Any] = {}
        # closed batches not in the local database yet: key -> (value or _DEL, its batch's stage number), read
        # after the buffer; their serialised changes by stage number until committed
        self.staged: dict[str, tuple[Any, int]] = {}
        self.stages: dict[int, dict[str, bytes | None]] = {}
        self.stage_no = 0
        self.outbox_stage = 0  # the newest stage committed to the outbox
        self.taken_stage = 0  # the newest stage in the records last taken from the outbox
        self.outbox: list[tuple[bytes, bytes | None]] = []  # changelog records not handed to a producer yet
        # id of a tx row committed and not persisted yet -> (the row, its head: BatchTx.to_row)
        self.heads: dict[int, tuple[bytes, dict]] = {}
        self.hit = on_hit or (lambda name: None)

    def _raw(self, key: str):
        return self.db.get(self.prefix + key.encode())

    def _unwritten(self, key: str) -> Any:
        """The key's value in the buffer, else in a closed batch not persisted yet (None: neither)."""
        v = self.buf.get(key)
        if v is None and key in self.staged:
            v = self.staged[key][0]
        return v

    def __getitem__(self, key: str) -> Any:
        v = self._unwritten(key)
        if v is _DEL:
            raise KeyError(key)
        if v is not None:
            return v
        raw = self._raw(key)
        if raw is None:
            raise KeyError(key)
        return loads(raw)

    def get(self, key: str, default: Any = None) -> Any:
        v = self._unwritten(key)
        if v is _DEL:
            return default
        if v is not None:
            return v
        raw = self._raw(key)
        return default if raw is None else loads(raw)

    def __contains__(self, key) -> bool:
        v = self._unwritten(key)
        if v is not None:
            return v is not _DEL
        return self._raw(key) is not None

    def __setitem__(self, key: str, value: Any) -> None:
        self.buf[key] = value

    def __delitem__(self, key: str) -> None:
        self.buf[key] = _DEL

    def __iter__(self):
        return (k for k, _ in self.items())

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def items(self):
        """The committed keys (the buffer must be empty: read when the partition is restored)."""
        for k, v in self.raw_items():
            yield k, loads(v)

    def raw_items(self):
        """The committed keys with their values as stored (JSON bytes, not decoded): what a restore reads."""
        return state_items(self.db.items_from(self.prefix), self.prefix)

    def fingerprint(self) -> tuple[bytes | None, bytes | None]:
        """The local database's :func:`fingerprint` as it is now (the buffer and closed batches not in it)."""
        return fingerprint(self.db.get, self.p)

    def _tx_row(self) -> dict | None:
        raw = self.db.get(self.tx_key)
        return loads(raw) if raw is not None else None

    def last_tx(self) -> BatchTx | None:
        """The last committed batch's record (None: no batch committed yet)."""
        row = self._tx_row()
        return BatchTx.from_row(row) if row is not None else None

    def stage(self) -> int:
        """Close the batch joined so far: its changes serialised as they are now, read on until the local
        database holds them (the next batch joins on top); returns its stage number, for :meth:`commit`."""
        self.stage_no += 1
        self.stages[self.stage_no] = {k: (None if v is _DEL else dumps(v)) for k, v in self.buf.items()}
        for k, v in self.buf.items():
            self.staged[k] = (v, self.stage_no)
        self.buf.clear()
        return self.stage_no

    def commit(self, tx: BatchTx, stage: int | None = None) -> BatchTx:
        """Stage the changes of closed batch ``stage`` (default: close the batch joined so far) with ``tx``
        (offsets, output ends, seq) as one ``tx`` row followed by their applies, in that order, in
        :attr:`outbox` (nothing is written before the changelog has them: :meth:`persist`). Batches are
        committed in the order they were closed. Returns ``tx``."""
        stage = self.stage() if stage is None else stage
        enc = self.stages.pop(stage)
        # the changes' values are serialised already: orjson writes them in place, in one call
        head = tx.to_row()
        row = orjson.dumps({**head, "run": self.run,
                            "ch": {k: (None if v is None else orjson.Fragment(v)) for k, v in enc.items()}})
        self.heads[id(row)] = (row, head)
        self.outbox.append((self.tx_key, row))
        self.hit("join.after_tx")
        self._apply(enc)
        self.outbox_stage = stage
        return tx

    def recover(self) -> BatchTx | None:
        """Stage the last ``tx`` and its applies again (the changelog's copy of them may have been cut
        short), unless this copy persisted that very ``tx`` (its checkpoint names it: the changelog had
        acknowledged all of the batch); return its record."""
        raw, ck = self.db.get(self.tx_key), self.db.get(self.ck_key)
        if raw is None:
            return None
        try:
            c = Checkpoint.from_bytes(ck) if ck is not None else None
        except (ValueError, KeyError, TypeError):
            c = None  # no usable checkpoint: staged again
        persisted = c is not None and c.digest == digest(raw)
        if persisted and c.tx is not None:  # the row's own offsets, without decoding the batch's changes
            return BatchTx.from_row(c.tx)  # a row of a version this streamrec cannot read is refused
        row = loads(raw)
        tx = BatchTx.from_row(row)  # a row of a version this streamrec cannot read is refused before any apply
        if persisted:
            return tx
        self.outbox.append((self.tx_key, raw))
        self._apply({k: (None if v is None else dumps(v)) for k, v in row["ch"].items()})
        return tx

    def _apply(self, changes: dict[str, bytes | None]) -> None:
        # a tombstone also for a key this copy never saw: an older run's write of it may sit in the changelog
        # past where this copy's recovery stopped
        prefix = self.prefix
        applies = [(prefix + k.encode(), changes[k]) for k in sorted(changes)]
        self.outbox += applies[:1]
        if len(applies) > 1:
            self.hit("join.mid_apply")  # the first apply staged, the others not
            self.outbox += applies[1:]

    def take_outbox(self) -> list[tuple[bytes, bytes | None]]:
        out, self.outbox = self.outbox, []
        self.taken_stage = self.outbox_stage
        return out

    def persist(self, records: list[tuple[bytes, bytes | None]], topic: str = "", first: int = -1,
                last: int = -1) -> None:
        """Write ``records`` (taken from :attr:`outbox`, a ``tx`` row first) to the local database once the
        changelog acknowledged them at offsets ``first`` to ``last`` of ``topic``: one atomic write with
        faust's changelog offset (``last``) and the :class:`Checkpoint` of that ``tx`` row (``first``).
        Without a changelog (``last`` < 0: tests) only the records are written."""
        extra: list[tuple[bytes, bytes | None]] = []
        if last >= 0 and records and records[0][0] == self.tx_key and records[0][1] is not None:
            row = records[0][1]
            known = self.heads.get(id(row))
            head = known[1] if known is not None and known[0] is row else None
            extra = [(OFFSET_KEY, str(last).encode()),
                     (self.ck_key, Checkpoint(topic, first, digest(row), head).to_bytes())]
        for k, v in records:  # these rows' heads are written (or not needed) now
            if k == self.tx_key and v is not None:
                self.heads.pop(id(v), None)
        self.db.write(list(records) + extra)
        # the closed batches these records hold are read from the database now
        self.staged = {k: e for k, e in self.staged.items() if e[1] > self.taken_stage}
