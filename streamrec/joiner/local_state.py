"""Whether a joiner worker may restore its partitions from the local RocksDB copies it finds at start.

A partition's local database is the changelog's state up to a recorded offset (:meth:`~.txstore.TxStore.persist`
writes a batch there only after the changelog acknowledged it, atomically with faust's changelog offset and
a :class:`~.txstore.Checkpoint`), so faust's recovery may read the changelog only past that offset. That
holds only when the copy was written against THIS changelog: :func:`check_local_state` keeps a partition's
copy when it opens, holds a checkpoint of this changelog topic and the changelog still holds that very
``tx`` record at the recorded offset (same key, same fingerprint: the record carries the writing run's
nonce); otherwise (unreadable, no checkpoint, another topic, a changelog that was deleted, recreated,
truncated or compacted past it) the copy is removed and faust rebuilds the partition from the changelog.
A stale copy (another worker committed batches since) is kept: the changelog past its offset holds them.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

from .txstore import OFFSET_KEY, Checkpoint, digest

log = logging.getLogger(__name__)


def partition_dbs(state_dir: str | Path, table: str) -> dict[int, Path]:
    """The local databases of ``table`` under ``state_dir`` (faust's ``<version>/tables/<table>-<p>.db``)."""
    out: dict[int, Path] = {}
    pattern = re.compile(rf"{re.escape(table)}-(\d+)\.db")
    for path in Path(state_dir).glob("*/tables/*.db"):
        m = pattern.fullmatch(path.name)
        if m:
            out[int(m.group(1))] = path
    return out


def read_checkpoint(path: Path, p: int) -> tuple[Checkpoint | None, str]:
    """The checkpoint partition ``p``'s database at ``path`` holds, or (None, why it cannot be used)."""
    import rocksdict

    try:
        db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only())
    except Exception as e:  # rocksdict raises its own exception types for a corrupt or foreign database
        return None, f"unreadable ({str(e)[:200]})"
    try:
        raw, offset = db.get(f"{p}/ck".encode()), db.get(OFFSET_KEY)
    except Exception as e:
        return None, f"unreadable ({str(e)[:200]})"
    finally:
        db.close()
    if raw is None or offset is None:
        return None, "no checkpoint (no batch persisted, or written by a streamrec that kept none)"
    try:
        ck = Checkpoint.from_bytes(raw)
        if int(offset) < ck.offset:
            return None, "its changelog offset is before its checkpoint"
    except (ValueError, KeyError, TypeError):
        return None, "a corrupt checkpoint"
    return ck, ""


def changelog_records(bootstrap: str, security: dict, topic: str, wanted: dict[int, int],
                      timeout_s: float = 10.0) -> dict[int, tuple[int, bytes | None, bytes | None]]:
    """For each partition ``p`` of ``topic`` in ``wanted``: the (offset, key, value) of the first record at
    or after offset ``wanted[p]`` (absent: none within ``timeout_s``, or the topic does not exist)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", **security)
    out: dict[int, tuple[int, bytes | None, bytes | None]] = {}
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = {TopicPartition(topic, p): o for p, o in wanted.items() if p in parts}
        if not tps:
            return out
        c.assign(list(tps))
        for tp, o in tps.items():
            c.seek(tp, o)
        deadline = time.monotonic() + timeout_s
        while len(out) < len(tps) and time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=200, max_records=100).items():
                for r in recs:
                    if tp.partition not in out and r.offset >= tps[tp]:
                        out[tp.partition] = (r.offset, r.key, r.value)
                if tp.partition in out:
                    c.pause(tp)
    finally:
        c.close()
    return out


def check_local_state(state_dir: str | Path, table: str, topic: str, bootstrap: str, security: dict) -> dict[int, str]:
    """Keep or remove each local partition database of ``table`` (changelog ``topic``); returns partition ->
    "kept" or the reason it was removed."""
    dbs = partition_dbs(state_dir, table)
    verdict: dict[int, str] = {}
    cks: dict[int, Checkpoint] = {}
    for p, path in sorted(dbs.items()):
        ck, why = read_checkpoint(path, p)
        if ck is None:
            verdict[p] = why
        elif ck.topic != topic:
            verdict[p] = f"written against changelog {ck.topic}, not {topic}"
        else:
            cks[p] = ck
    found = changelog_records(bootstrap, security, topic, {p: ck.offset for p, ck in cks.items()}) if cks else {}
    for p, ck in cks.items():
        rec = found.get(p)
        if rec is None:
            verdict[p] = f"the changelog holds no record at its checkpoint offset {ck.offset}"
        elif rec[0] != ck.offset or rec[1] != f"{p}/tx".encode() or rec[2] is None or digest(rec[2]) != ck.digest:
            verdict[p] = (f"the changelog's record at offset {ck.offset} is not the batch record it persisted "
                          "(another run's changelog, or compacted)")
        else:
            verdict[p] = "kept"
    for p, why in sorted(verdict.items()):
        if why != "kept":
            log.info("partition %d: the local join state is not used (%s); it is rebuilt from %s", p, why, topic)
            shutil.rmtree(dbs[p])
    return verdict
