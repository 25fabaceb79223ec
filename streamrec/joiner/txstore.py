"""One partition's join state in the faust table, committed atomically per batch of input records.

State keys live in the table as ``<p>/s/<key>`` (JSON values). While a batch is joined, writes stay in a
buffer the reads see; :meth:`TxStore.commit` then writes ONE value, ``<p>/tx``: the batch's changes, the
input offsets after the batch and the output log's end offsets, and only then applies the changes to their
keys. faust sends table writes to changelog partition ``p`` in order, and a partition's sends arrive in
order, so a changelog cut short by a crash holds the state after some complete ``tx`` plus a part of the
applies that follow it: :meth:`TxStore.recover` applies the last ``tx`` again, which makes the state exactly
the state after that batch. ``at_partition`` makes faust route a write (and a read) to partition ``p``.
"""

from __future__ import annotations

import contextlib
import json
import time
import types
import weakref
from collections.abc import MutableMapping
from typing import Any, Iterator

_DEL = object()


class _PartitionEvent:
    """Stands in for faust's current event: faust reads and writes a table key in the current event's
    partition (its RocksDB partition and changelog partition)."""

    def __init__(self, topic: str, partition: int):
        self.message = types.SimpleNamespace(topic=topic, partition=partition, timestamp=time.time())


@contextlib.contextmanager
def at_partition(topic: str, p: int) -> Iterator[None]:
    from faust.streams import _current_event

    ev = _PartitionEvent(topic, p)
    token = _current_event.set(weakref.ref(ev))
    try:
        yield
    finally:
        _current_event.reset(token)


def _dumps(v: Any) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


class TxStore(MutableMapping):
    """Partition ``p``'s state keys over ``table`` (a faust Table, or any mapping of bytes in tests)."""

    def __init__(self, table, p: int, topic: str = "", on_hit=None):
        self.table = table
        self.p = p
        self.topic = topic
        self.prefix = f"{p}/s/".encode()
        self.tx_key = f"{p}/tx".encode()
        self.buf: dict[str, Any] = {}
        self.hit = on_hit or (lambda name: None)

    def _ctx(self):
        return at_partition(self.topic, self.p) if self.topic else contextlib.nullcontext()

    def _raw(self, key: str):
        with self._ctx():
            return self.table.get(self.prefix + key.encode())

    def __getitem__(self, key: str) -> Any:
        v = self.buf.get(key)
        if v is _DEL:
            raise KeyError(key)
        if v is not None:
            return v
        raw = self._raw(key)
        if raw is None:
            raise KeyError(key)
        return json.loads(raw)

    def __contains__(self, key) -> bool:
        v = self.buf.get(key)
        if v is not None:
            return v is not _DEL
        return self._raw(key) is not None

    def __setitem__(self, key: str, value: Any) -> None:
        self.buf[key] = json.loads(_dumps(value))  # a copy: later changes to ``value`` are not this write

    def __delitem__(self, key: str) -> None:
        self.buf[key] = _DEL

    def __iter__(self):
        return (k for k, _ in self.items())

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def items(self):
        """The committed keys (the buffer must be empty: read when the partition is restored)."""
        with self._ctx():
            pairs = list(self.table.items())
        for k, v in pairs:
            if isinstance(k, bytes) and k.startswith(self.prefix) and v is not None:
                yield k[len(self.prefix):].decode(), json.loads(v)

    def last_tx(self) -> dict | None:
        with self._ctx():
            raw = self.table.get(self.tx_key)
        return json.loads(raw) if raw is not None else None

    def commit(self, meta: dict) -> dict:
        """Write the batch's changes with ``meta`` (offsets, output ends, seq) as one ``tx``, then apply them."""
        changes = {k: (None if v is _DEL else v) for k, v in self.buf.items()}
        tx = dict(meta, ch=changes)
        with self._ctx():
            self.table[self.tx_key] = _dumps(tx)
        self.hit("join.after_tx")
        self._apply(changes)
        self.buf.clear()
        return tx

    def recover(self) -> dict | None:
        """Apply the last ``tx`` again (its applies may have been cut short); return it."""
        tx = self.last_tx()
        if tx is not None:
            self._apply(tx["ch"])
        return tx

    def _apply(self, changes: dict) -> None:
        with self._ctx():
            for i, (k, v) in enumerate(sorted(changes.items())):
                if i == 1:
                    self.hit("join.mid_apply")
                key = self.prefix + k.encode()
                if v is None:  # a tombstone also for a key this copy never saw: an older run's write of it
                    try:  # may sit in the changelog past where this copy's recovery stopped
                        del self.table[key]
                    except KeyError:
                        pass
                else:
                    self.table[key] = _dumps(v)
