"""The crash-loop breaker: which records were in flight when a consumer process died.

A record that crashes the process (a native crash in a decoder or in a training
step, an abort, an out-of-memory kill on one huge record) is read again by the
restarted process, which dies again, forever. So the process keeps a small marker
file naming what it is handling: before a consumer decodes records it writes their
position ranges (the ``decode`` phase), before it hands records to its caller it
writes them again (``train``), and before each training step the trainer writes
exactly the records of that step (``step``: every event carries its record's
partition and offset through the partition merge and the batcher). A clean exit
removes the marker. A start that finds one knows the previous process died
holding exactly those records:

- ``decode``: the records are decoded again, one at a time, in a child process
  (:func:`probe_decode`); the ones that kill the child are quarantined to the
  dead-letter topic with reason "crashed the consumer", the rest go on as usual.
  (A crash the probe cannot reproduce that strikes again with the same records in
  flight gets them quarantined together, as below.)
- ``step``: the process died in a training step. The step's records are trained
  again, one at a time, in a child process (the trainer's probe); the ones that
  kill it are quarantined ("crashed the trainer") at this first death, wherever
  they wait: still in Kafka, or restored from the checkpoint into the merge or the
  batcher. A death the probe cannot reproduce (an operator's ``kill -9``, a machine
  out of memory) only counts; if a step holding the same records dies again, they
  are quarantined together.
- ``train``: the process died after decoding, outside a training step (the
  merge, a checkpoint); the first such death only counts, and records in flight
  at the next death too are quarantined together.

So a record that kills its decoder or a training step on its own never kills a
second process, and any other crash kills at most two: forward progress whatever
the input. The marker costs one small file write per poll and per training step,
no fsync (a killed process's writes survive in the page cache; a machine crash
loses only this hint, never data).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

DECODE = "decode"
TRAIN = "train"
STEP = "step"
IDLE = "idle"  # a trainer between training steps
_IDLE_BODY = json.dumps({"phase": IDLE, "deaths": 0, "ranges": []})


@dataclass(frozen=True)
class InflightRange:
    topic: str
    partition: int
    first: int  # offsets first..last, inclusive
    last: int

    def holds(self, topic: str, partition: int, offset: int) -> bool:
        return topic == self.topic and partition == self.partition and self.first <= offset <= self.last


def ranges_of(runs: Iterable) -> list[InflightRange]:
    """The offset ranges (per partition) of runs of Kafka records (``fast_records.RecordRun``: ``topic``,
    ``partition``, ``offset`` of the first record and ``last_offset``, each run in offset order)."""
    span: dict[tuple[str, int], list[int]] = {}
    for r in runs:
        lo, hi = r.offset, r.last_offset
        s = span.setdefault((r.topic, r.partition), [lo, hi])
        s[0], s[1] = min(s[0], lo), max(s[1], hi)
    return [InflightRange(t, p, lo, hi) for (t, p), (lo, hi) in sorted(span.items())]


def exact_runs(partitions, offsets):
    """The records named by per-event ``partitions`` and record ``offsets`` (arrays; several events may
    share a record) as the fewest runs holding exactly those records: an int64 array of rows
    ``(partition, first, last)``, by partition then offset."""
    import numpy as np

    p = np.asarray(partitions, np.int64)
    o = np.asarray(offsets, np.int64)
    if not len(p):
        return np.zeros((0, 3), np.int64)
    order = np.lexsort((o, p))  # by partition, then offset
    p, o = p[order], o[order]
    new = np.ones(len(p), bool)
    new[1:] = (np.diff(p) != 0) | (np.diff(o) != 0)  # the events of one record: the record once
    p, o = p[new], o[new]
    brk = np.flatnonzero((np.diff(p) != 0) | (np.diff(o) != 1)) + 1
    starts = np.concatenate([[0], brk])
    ends = np.concatenate([brk, [len(p)]]) - 1
    return np.stack([p[starts], o[starts], o[ends]], axis=1)


def exact_ranges(topic: str, partitions, offsets) -> list[InflightRange]:
    """:func:`exact_runs` as ranges of ``topic``."""
    return [InflightRange(topic, p, a, b) for p, a, b in exact_runs(partitions, offsets).tolist()]


def holds_any(ranges: Sequence[InflightRange], topic: str, partitions, offsets):
    """Per event (``partitions``, record ``offsets``: arrays): whether one of ``ranges`` holds its record."""
    import numpy as np

    p = np.asarray(partitions, np.int64)
    o = np.asarray(offsets, np.int64)
    hit = np.zeros(len(p), bool)
    for r in ranges:
        if r.topic == topic:
            hit |= (p == r.partition) & (o >= r.first) & (o <= r.last)
    return hit


class InflightMarker:
    """The marker file of one consumer (``path``); ``found`` is what a dead predecessor left."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.found: tuple[str, list[InflightRange], int] | None = self._read()  # (phase, ranges, deaths before)
        self._fd: int | None = None  # the marker file, kept open: a mark is one pwrite, not a create and a rename
        self._size = 0  # bytes in the file: a shorter mark is padded with blanks over the rest

    def _read(self) -> tuple[str, list[InflightRange], int] | None:
        try:
            d = json.loads(self.path.read_text())
            if "runs" in d:  # a training step's (mark_runs): one topic, rows (partition, first, last)
                ranges = [InflightRange(str(d["topic"]), int(p), int(a), int(b)) for p, a, b in d["runs"]]
            else:
                ranges = [InflightRange(str(t), int(p), int(a), int(b)) for t, p, a, b in d["ranges"]]
            if d["phase"] == IDLE or not ranges:  # between training steps: nothing in flight
                return None
            return str(d["phase"]), ranges, int(d.get("deaths", 0))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:  # a torn marker: nothing reliable to act on
            log.warning("ignoring unreadable in-flight marker %s: %s", self.path, e)
            return None

    def _write(self, body: str | bytes) -> None:
        """The whole marker in one ``pwrite`` at offset 0 (padded with blanks, which JSON ignores, over a
        longer previous one). A process that dies on its own (a segfault, an abort) dies outside the
        system call, so its last mark is whole; only a kill from outside during a mark longer than a page
        could tear it, and a torn marker is ignored (the hint is lost, never data)."""
        data = body.encode() if isinstance(body, str) else body
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size
        if len(data) < self._size:
            data += b" " * (self._size - len(data))
        os.pwrite(self._fd, data, 0)
        self._size = len(data)

    def mark(self, phase: str, ranges: Sequence[InflightRange], deaths: int = 0) -> None:
        """Record that these records are being handled (``phase``) from now on; ``deaths``: how many
        processes already died with (some of) them in flight."""
        self._write(json.dumps({"pid": os.getpid(), "phase": phase, "deaths": deaths,
                                "ranges": [[r.topic, r.partition, r.first, r.last] for r in ranges]}))

    def mark_runs(self, phase: str, topic: str, runs, deaths: int = 0) -> None:
        """:meth:`mark` for runs of ``topic`` given as an int64 array of rows ``(partition, first, last)``
        (:func:`exact_runs`), serialised straight from the array (once per training step, so no Python
        object per range)."""
        import orjson

        self._write(orjson.dumps({"pid": os.getpid(), "phase": phase, "deaths": deaths, "topic": topic,
                                  "runs": runs}, option=orjson.OPT_SERIALIZE_NUMPY))

    def idle(self) -> None:
        """Nothing in flight for now (between training steps); a start that finds this acts on nothing."""
        self._write(_IDLE_BODY)

    def clear(self) -> None:
        """Nothing in flight (a clean stop): the file is removed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for p in (self.path, self.path.with_name(self.path.name + ".tmp")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def _decode_each(schema, values: list[bytes], conn) -> None:  # runs in the child process
    from .codec import Decoder

    decoder = Decoder(schema)
    for i, v in enumerate(values):
        conn.send(i)  # "about to decode i": if the child dies now, record i killed it
        try:
            decoder.decode(v)
        except Exception:  # a contract error is the normal dead-letter path's business, not a crash
            pass
    conn.send(-1)


def probe_decode(schema, values: list[bytes], timeout_s: float = 120.0) -> list[int]:
    """Indices of ``values`` that kill a process decoding them (decoded one by one in a child process,
    restarted after each death). Costs one child interpreter start per culprit plus one."""
    return probe_in_children(lambda start: (_decode_each, (schema, values[start:])), len(values),
                             "record", "decoding", timeout_s)


def probe_in_children(job: Callable[[int], tuple[Callable, tuple]], n: int, item: str, doing: str,
                      timeout_s: float) -> list[int]:
    """Indices in ``0..n-1`` of the items that kill a process handling them one at a time.

    ``job(start)`` gives ``(target, args)`` for a spawned child that handles the items from ``start`` on:
    ``target(*args, conn)`` sends each item's index (relative to ``start``) before handling it and -1 when
    done, so the index last sent when the child dies names the item that killed it. The child is restarted
    after each death with the next item. A child that dies before its first item (it could not start)
    names nothing and ends the probe: nothing is blamed on an item it never reached."""
    ctx = multiprocessing.get_context("spawn")
    culprits: list[int] = []
    start = 0
    while start < n:
        recv, send = ctx.Pipe(duplex=False)
        target, args = job(start)
        child = ctx.Process(target=target, args=(*args, send), daemon=True)
        child.start()
        send.close()
        last, done = None, False
        while recv.poll(timeout_s):
            try:
                msg = recv.recv()
            except EOFError:
                break
            if msg == -1:
                done = True
                break
            last = msg
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
        if done:
            break
        if last is None:
            log.warning("%s probe child exited with %s before %s; no %s blamed", doing, child.exitcode, doing, item)
            break
        culprits.append(start + last)
        log.error("%s %d of %d killed a process %s it (exit %s)", item, start + last, n, doing, child.exitcode)
        start += last + 1
    return culprits
