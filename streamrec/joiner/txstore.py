"""One partition's join state in the faust table, committed atomically per batch of input records.

State keys live in the table as ``<p>/s/<key>`` (JSON values). While a batch is joined, writes stay in a
buffer the reads see; :meth:`TxStore.commit` then writes ONE value, ``<p>/tx``: the batch's changes, the
input offsets after the batch and the output log's end offsets (a :class:`~.tx_row.BatchTx`), and only
then applies the changes to their keys. The writes go to the partition's RocksDB database at once and, in
the same order, to :attr:`TxStore.outbox`: the records the caller produces to changelog partition ``p``
(one producer, one partition: they arrive in order). A changelog cut short by a crash therefore holds the
state after some complete ``tx`` plus a part of the applies that follow it: :meth:`TxStore.recover` applies the last ``tx``
again, which makes the state exactly the state after that batch.

With a faust Table the store reads and writes the partition's RocksDB database directly (the database
faust's own reads use and its changelog recovery writes), not through faust's per-write changelog buffer;
any other mapping of bytes (tests) is read and written as it is.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import orjson

from .tx_row import BatchTx

_DEL = object()


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


class _Db:
    """Partition ``p``'s key-value database: the faust table's RocksDB database for ``p``, or the mapping."""

    def __init__(self, table, p: int):
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


class TxStore(MutableMapping):
    """Partition ``p``'s state keys over ``table`` (a faust Table, or any mapping of bytes in tests).

    Values are stored by reference until :meth:`commit` serialises them (as a dict does): a value changed
    after it was written must be written again to change the state, which is what :class:`~.machine.JoinState`
    does with every value it changes."""

    def __init__(self, table, p: int, topic: str = "", on_hit=None):
        self.db = _Db(table, p)
        self.p = p
        self.topic = topic
        self.prefix = f"{p}/s/".encode()
        self.tx_key = f"{p}/tx".encode()
        self.buf: dict[str, Any] = {}
        self.outbox: list[tuple[bytes, bytes | None]] = []  # changelog records not handed to a producer yet
        self.hit = on_hit or (lambda name: None)

    def _raw(self, key: str):
        return self.db.get(self.prefix + key.encode())

    def __getitem__(self, key: str) -> Any:
        v = self.buf.get(key)
        if v is _DEL:
            raise KeyError(key)
        if v is not None:
            return v
        raw = self._raw(key)
        if raw is None:
            raise KeyError(key)
        return loads(raw)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.buf.get(key)
        if v is _DEL:
            return default
        if v is not None:
            return v
        raw = self._raw(key)
        return default if raw is None else loads(raw)

    def __contains__(self, key) -> bool:
        v = self.buf.get(key)
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
        for k, v in self.db.items():
            if isinstance(k, bytes) and k.startswith(self.prefix) and v is not None:
                yield k[len(self.prefix):].decode(), loads(v)

    def _tx_row(self) -> dict | None:
        raw = self.db.get(self.tx_key)
        return loads(raw) if raw is not None else None

    def last_tx(self) -> BatchTx | None:
        """The last committed batch's record (None: no batch committed yet)."""
        row = self._tx_row()
        return BatchTx.from_row(row) if row is not None else None

    def commit(self, tx: BatchTx) -> BatchTx:
        """Write the batch's changes with ``tx`` (offsets, output ends, seq) as one ``tx`` row, then apply them;
        the changelog records, in that order, are appended to :attr:`outbox`. Returns ``tx``."""
        enc = {k: (None if v is _DEL else dumps(v)) for k, v in self.buf.items()}
        ch = b",".join(dumps(k) + b":" + (b"null" if v is None else v) for k, v in enc.items())
        head = dumps(tx.to_row())
        row = head[:-1] + (b"," if len(head) > 2 else b"") + b'"ch":{' + ch + b"}}"
        self.db.put(self.tx_key, row)
        self.outbox.append((self.tx_key, row))
        self.hit("join.after_tx")
        self._apply(enc)
        self.buf.clear()
        return tx

    def recover(self) -> BatchTx | None:
        """Apply the last ``tx`` again (its applies may have been cut short); return its record."""
        row = self._tx_row()
        if row is None:
            return None
        tx = BatchTx.from_row(row)  # a row of a version this streamrec cannot read is refused before any apply
        self._apply({k: (None if v is None else dumps(v)) for k, v in row["ch"].items()})
        return tx

    def _apply(self, changes: dict[str, bytes | None]) -> None:
        for i, k in enumerate(sorted(changes)):
            if i == 1:
                self.hit("join.mid_apply")
            key, v = self.prefix + k.encode(), changes[k]
            if v is None:  # a tombstone also for a key this copy never saw: an older run's write of it
                self.db.delete(key)  # may sit in the changelog past where this copy's recovery stopped
            else:
                self.db.put(key, v)
            self.outbox.append((key, v))

    def take_outbox(self) -> list[tuple[bytes, bytes | None]]:
        out, self.outbox = self.outbox, []
        return out
