"""The joiner's durable batch record: what a partition's ``<p>/tx`` row holds besides the batch's changes.

:class:`BatchTx` is written by :meth:`~.txstore.TxStore.commit` and read back by
:meth:`~.txstore.TxStore.last_tx` / :meth:`~.txstore.TxStore.recover`; nothing else reads or writes the row.
On disk (the partition's RocksDB database) and in the table's changelog it is one JSON object::

    {"v": 1, "seq": 7, "off": {"impressions": 120, "actions": null}, "ends": {"0": 31, "1": 29},
     "pending": ["3|r1|example|"], "ch": {...}}

``ch`` (the batch's changes) belongs to the store. A row without ``v`` (written before the row carried its
version) is read as version 1: its fields are the same. A row of a newer version is refused with a line
saying so (a newer streamrec wrote this state).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from streamrec.foundation import StreamrecError

TX_VERSION = 1


class TxVersionError(StreamrecError, ValueError):
    """A batch record of a version this streamrec does not know."""


@dataclass
class BatchTx:
    """One partition's last committed batch: where its inputs resume and how far the output log holds its
    examples."""

    seq: int  # batches committed so far (0: none joined yet)
    off: dict[str, int | None]  # input topic -> the next offset to read (None: from the topic's beginning)
    ends: dict[int, int]  # events partition -> the offset after this partition's last example there
    pending: list[str] = field(default_factory=list)  # example identities already in the output log, not re-sent
    version: int = TX_VERSION

    def to_row(self) -> dict[str, Any]:
        """The JSON object the row stores (without the store's ``ch``)."""
        return {"v": self.version, "seq": self.seq, "off": dict(self.off),
                "ends": {str(q): o for q, o in self.ends.items()}, "pending": list(self.pending)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "BatchTx":
        """The record a row holds; an unversioned row is version 1. TxVersionError: a newer version."""
        version = int(row.get("v", 1))
        if version > TX_VERSION:
            raise TxVersionError(f"join: the state holds a batch record of version {version}; this streamrec reads "
                                 f"up to {TX_VERSION}: run the streamrec that wrote it, or clear join.state_dir and "
                                 "the join table's changelog topic")
        return cls(seq=int(row["seq"]), off=dict(row["off"]), ends={int(q): int(o) for q, o in row["ends"].items()},
                   pending=list(row.get("pending", ())), version=version)
