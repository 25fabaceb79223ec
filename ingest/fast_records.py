"""Fast record parsing for kafka-python consumers: fetched record batches parsed in C.

kafka-python turns the bytes of a fetch response into records in pure Python
(``Fetcher.PartitionRecords._unpack_records`` over ``kafka.record.DefaultRecordBatch``),
the largest share of a one-JSON-event-per-message trainer's CPU (``streamrec bench ingest``).
aiokafka (already installed: faust's client) ships the same record format parsed in
Cython (``aiokafka.record._crecords``). This module keeps kafka-python for everything
(metadata, group, fetch requests, positions, pause/resume, commits) and swaps only the
step that turns one partition's fetched bytes into ``ConsumerRecord`` values, for
one consumer: :func:`install` sets the consumer's fetcher's ``PartitionRecords`` class
(an instance attribute, nothing global is patched) to :class:`FastPartitionRecords`.

It yields exactly what kafka-python yields (the same ``ConsumerRecord`` fields) and
keeps its bookkeeping (``next_fetch_offset``, ``leader_epoch``, control batches
skipped, the records before the fetch offset dropped by kafka-python's own
``dropwhile``). Batch CRCs are checked with the C parser's ``validate_crc`` when
``check_crcs`` is on (the default). Anything it does not handle the same way is left
to kafka-python's own parser for that fetch:

- a deserializer configured, ``read_committed`` isolation (aborted transactions),
  a message format before v2 or a batch shorter than a v2 header: before any record;
- any error of the C parser (a CRC mismatch, a codec aiokafka cannot decompress, a
  malformed batch): kafka-python re-parses the same bytes from the first record not
  yet handed out, so it raises its own error or returns the records; nothing is lost
  or repeated. One warning per reason per process.

Two forms: :class:`FastPartitionRecords` yields one ``ConsumerRecord`` per record, as
kafka-python does; ``RunPartitionRecords`` (``install(consumer, runs=True)``, what
``EventConsumer`` uses) yields one :class:`RecordRun` per fetch -- the C parser's own
record objects in a list, no tuple per record -- so the consumer takes values, offsets
and timestamps a list at a time (its records, when asked for, are the same
``ConsumerRecord`` values), which costs the trainer's consumer (``poll_batch``) less CPU
per one-event JSON record than a record object each.

Differences, none in the records: ``bytes_read`` (fetch metrics only) counts the
bytes of the batches that yielded records rather than the sum of record sizes.

:func:`install` checks the kafka-python internals it relies on and the version range
it was tested with (:data:`TESTED_KAFKA_PYTHON`); if either differs, or aiokafka's C
extension is missing, it leaves the consumer on kafka-python's parser and warns once.
"""

from __future__ import annotations

import bisect
import inspect
import logging
import struct
from typing import NamedTuple

log = logging.getLogger(__name__)

TESTED_KAFKA_PYTHON = ("3.0.",)  # version prefixes whose Fetcher internals this hook was checked against
_V2_HEADER = 61  # bytes of a v2 record batch header (base offset .. record count)
_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


class _Fallback(Exception):
    """The fast path does not handle this fetch (or this batch): kafka-python parses it."""


class _KafkaPython(NamedTuple):
    """The kafka-python internals the hook builds on, checked by :func:`_kafka_python`."""

    base: type  # Fetcher.PartitionRecords: the class the hook subclasses
    consumer_record: type  # ConsumerRecord (a namedtuple)
    memory_records: type  # MemoryRecords: a fetch's bytes, re-read by kafka-python on a fallback
    read_uncommitted: object  # IsolationLevel.READ_UNCOMMITTED: the only isolation the C path handles


_RECORD_FIELDS = ("topic", "partition", "leader_epoch", "offset", "timestamp", "timestamp_type", "key", "value",
                  "headers", "checksum", "serialized_key_size", "serialized_value_size", "serialized_header_size")


def _kafka_python() -> tuple[_KafkaPython | None, str | None]:
    """kafka-python's fetcher internals, or (None, why not) when it is not a version and shape this hook
    was checked against."""
    try:
        import kafka
        from kafka.consumer import fetcher as kf
        from kafka.record import MemoryRecords
    except Exception as e:  # pragma: no cover - kafka-python is a dependency
        return None, f"kafka-python not importable ({e})"
    version = getattr(kafka, "__version__", "?")
    if not version.startswith(TESTED_KAFKA_PYTHON):
        return None, f"kafka-python {version} is not a version this hook was tested with {TESTED_KAFKA_PYTHON}"
    base = getattr(getattr(kf, "Fetcher", None), "PartitionRecords", None)
    try:
        ok = (base is not None and hasattr(kf, "ConsumerRecord") and hasattr(kf, "IsolationLevel")
              and list(inspect.signature(_kafka_unpack(base)).parameters)
              == ["self", "tp", "records", "key_deserializer", "value_deserializer"]
              and {"fetch_offset", "tp", "records", "check_crcs", "isolation_level"}
              <= set(inspect.signature(base.__init__).parameters)
              and kf.ConsumerRecord._fields == _RECORD_FIELDS  # namedtuple's public field list (underscored)
              and "_buffer" in getattr(MemoryRecords, "__slots__", ()))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        return None, f"kafka-python {version}: Fetcher.PartitionRecords internals differ from what this hook expects"
    return _KafkaPython(base, kf.ConsumerRecord, MemoryRecords, kf.IsolationLevel.READ_UNCOMMITTED), None


def _kafka_unpack(base: type):
    """kafka-python's own record parser (``PartitionRecords._unpack_records``): what the hook replaces and
    falls back to. A private method of a third-party class, read because the hook swaps exactly this step
    (checked by :func:`_kafka_python` against the tested versions)."""
    return base._unpack_records  # kafka-python internals: the one step the hook replaces


def _fetched_bytes(records):
    """The bytes of one partition's fetch (``MemoryRecords``), without a copy: kafka-python has no public
    accessor, and the C parser reads record batches straight from this buffer (its presence is checked by
    :func:`_kafka_python`)."""
    return records._buffer  # kafka-python internals, read for speed (no copy of the fetch)


def _c_batch_class():
    """aiokafka's C record batch parser, or (None, why not)."""
    try:
        from aiokafka.record._crecords.default_records import DefaultRecordBatch as CBatch
    except Exception as e:
        return None, f"aiokafka's C record parser is not available ({e})"
    return CBatch, None


def _load():
    """((FastPartitionRecords, RunPartitionRecords), None) or (None, why not)."""
    kp, why = _kafka_python()
    if kp is None:
        return None, why
    cbatch, why = _c_batch_class()
    if cbatch is None:
        return None, why
    fast = _fast_partition_records_class(kp, cbatch)
    return (fast, _run_partition_records_class(kp, fast)), None


def _batches_method(CBatch: type):
    """The ``_batches`` method of the hook's PartitionRecords classes, over aiokafka's C batch parser."""
    unpack_header = struct.Struct(">qiib").unpack_from  # base offset, length, leader epoch, magic
    unpack_length = struct.Struct(">i").unpack_from
    unpack_offset = struct.Struct(">q").unpack_from

    def _batches(self, buf):
        """Each record batch of a fetch that holds records, checked (size, format v2, CRC), with its
        leader epoch and size in bytes; once all are taken the next fetch starts after the last batch,
        as kafka-python's does (even if compaction emptied its end). Control batches are skipped."""
        check = self.check_crcs
        view = memoryview(buf)
        end_all = len(buf)
        pos = 0
        last_next = None
        while end_all - pos >= 12:
            length = unpack_length(buf, pos + 8)[0]
            end = pos + 12 + length
            if end > end_all:
                break  # a partial batch at the end of the fetch (kafka-python stops there too)
            if length + 12 < _V2_HEADER:
                raise _Fallback(f"record batch of {length + 12} bytes at offset {unpack_offset(buf, pos)[0]}")
            base_offset, length, epoch, magic = unpack_header(buf, pos)
            if magic != 2:
                raise _Fallback(f"message format v{magic} at offset {base_offset}")
            batch = CBatch(view[pos:end])
            pos = end
            if check and not batch.validate_crc():
                raise _Fallback(f"record batch failed its CRC check at offset {base_offset}")
            self.leader_epoch = epoch
            last_next = batch.next_offset
            if batch.is_control_batch:
                self.next_fetch_offset = last_next
                continue
            yield batch, epoch, length + 12
        if last_next is not None:
            self.next_fetch_offset = last_next
        self.drain()

    return _batches


def _fast_partition_records_class(kp: _KafkaPython, CBatch: type) -> type:
    """kafka-python's PartitionRecords with the record batches parsed by aiokafka's C parser (one
    ``ConsumerRecord`` per record)."""
    ConsumerRecord = kp.consumer_record
    MemoryRecords = kp.memory_records
    READ_UNCOMMITTED = kp.read_uncommitted
    kafka_unpack = _kafka_unpack(kp.base)
    new = tuple.__new__

    class FastPartitionRecords(kp.base):
        """kafka-python's PartitionRecords with the record batches parsed by aiokafka's C parser."""

        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            return self._records(tp, records, key_deserializer, value_deserializer)

        def _records(self, tp, records, key_deserializer, value_deserializer):
            """The records of a fetch: the C parser's, or kafka-python's where it does not handle them."""
            if key_deserializer is not None or value_deserializer is not None:
                yield from kafka_unpack(self, tp, records, key_deserializer, value_deserializer)
                return
            if self.isolation_level != READ_UNCOMMITTED:
                _warn_once("isolation", "fast record parsing: isolation level %s is parsed by kafka-python",
                           self.isolation_level)
                yield from kafka_unpack(self, tp, records, key_deserializer, value_deserializer)
                return
            buf = _fetched_bytes(records)
            try:
                yield from self._fast(tp, buf)
            except Exception as e:  # not GeneratorExit: a closed iterator just stops
                why = str(e) if isinstance(e, _Fallback) else f"{type(e).__name__}: {e}"
                _warn_once(why.split(" at offset")[0], "fast record parsing: %s; kafka-python parses %s "
                           "from offset %d", why, tp, self.next_fetch_offset)
                resume = self.next_fetch_offset  # the first record not handed out yet
                for rec in kafka_unpack(self, tp, MemoryRecords(buf), None, None):
                    if rec.offset >= resume:
                        yield rec

        _batches = _batches_method(CBatch)

        def _fast(self, tp, buf):
            topic, partition = tp.topic, tp.partition
            for batch, epoch, size in self._batches(buf):
                n = 0
                for r in batch:
                    key, value, headers = r.key, r.value, r.headers
                    offset = r.offset
                    n += 1
                    self.records_read += 1
                    self.next_fetch_offset = offset + 1
                    yield new(ConsumerRecord, (
                        topic, partition, epoch, offset, r.timestamp, r.timestamp_type, key, value, headers, None,
                        len(key) if key is not None else -1, len(value) if value is not None else -1,
                        sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0) for k, v in headers)
                        if headers else -1))
                if n:
                    self.bytes_read += size

    FastPartitionRecords.__qualname__ = "FastPartitionRecords"
    return FastPartitionRecords


def _run_partition_records_class(kp: _KafkaPython, fast: type) -> type:
    """The ``fast`` parsing handed out as one :class:`RecordRun` per fetch."""
    MemoryRecords = kp.memory_records
    READ_UNCOMMITTED = kp.read_uncommitted
    kafka_unpack = _kafka_unpack(kp.base)

    class RunPartitionRecords(fast):
        """The same parsing, handed out as one :class:`RecordRun` per fetch instead of a ``ConsumerRecord``
        per record (``consumer.poll`` then returns ``{tp: [RecordRun]}``): no Python object is built per
        record beyond the C parser's own, and the consumer reads a run's values, offsets and timestamps as
        lists. Same bookkeeping and fallbacks; the records before the fetch offset are dropped here (the
        run's ``offset`` is its first record's, so kafka-python's ``dropwhile`` passes it)."""

        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            recs: list = []
            epochs: list = []  # (index in recs, leader epoch) where a batch of another epoch starts
            kind = _C
            buf = _fetched_bytes(records)
            error = None  # kafka-python's own error (a corrupt batch...): raised after the records before it
            if (key_deserializer is not None or value_deserializer is not None
                    or self.isolation_level != READ_UNCOMMITTED):
                kind = _KP
                try:
                    recs.extend(self._records(tp, records, key_deserializer, value_deserializer))
                except Exception as e:
                    error = e
            else:
                try:
                    self._fast_run(tp, buf, recs, epochs)
                except Exception as e:  # as the record path: kafka-python from the first record not taken
                    recs, kind, error = self._after_fallback(e, tp, buf, recs, epochs)
            lo = 0
            fetch_offset = self.fetch_offset
            while lo < len(recs) and recs[lo].offset < fetch_offset:  # kafka-python's dropwhile, per record
                lo += 1
            if lo < len(recs):
                yield RecordRun(tp.topic, tp.partition, epochs, recs, kind, lo)
            if error is not None:
                raise error

        def _after_fallback(self, e: Exception, tp, buf, recs: list, epochs: list):
            """(records, kind, error) once the C parser failed with ``e`` after ``recs``: kafka-python
            parses the fetch again from the first record not taken."""
            why = str(e) if isinstance(e, _Fallback) else f"{type(e).__name__}: {e}"
            _warn_once(why.split(" at offset")[0], "fast record parsing: %s; kafka-python parses %s "
                       "from offset %d", why, tp, self.next_fetch_offset)
            resume = self.next_fetch_offset
            slow: list = []
            error = None
            try:
                for r in kafka_unpack(self, tp, MemoryRecords(buf), None, None):
                    if r.offset >= resume:
                        slow.append(r)
            except Exception as e2:
                error = e2
            if recs and slow:  # C records, then kafka-python's: one run of ConsumerRecords
                return RecordRun(tp.topic, tp.partition, epochs, recs, _C).records() + slow, _KP, error
            if slow:
                return slow, _KP, error
            return recs, _C, error

        def _fast_run(self, tp, buf, out: list, epochs: list) -> None:
            for batch, epoch, size in self._batches(buf):
                got = list(batch)  # the whole batch parsed before any of it is taken (an error: none is)
                if got:
                    if not epochs or epochs[-1][1] != epoch:
                        epochs.append((len(out), epoch))
                    out.extend(got)
                    self.records_read += len(got)
                    self.next_fetch_offset = got[-1].offset + 1
                    self.bytes_read += size

    RunPartitionRecords.__qualname__ = "RunPartitionRecords"
    return RunPartitionRecords


_BIG = 1 << 62
_C, _KP = "c", "kafka-python"  # what a run holds: aiokafka's C records, or kafka-python ConsumerRecords


class RecordRun:
    """Consecutive records of one partition, in offset order, from one fetch (a view ``lo:hi`` of
    ``recs``): what ``EventConsumer`` keeps and decodes instead of one ``ConsumerRecord`` each.

    ``recs`` are aiokafka's C records (``kind`` "c": ``offset``, ``timestamp``, ``key``, ``value``,
    ``headers``) or kafka-python ``ConsumerRecord`` values (``kind`` "kafka-python", e.g. after a
    fallback, or a consumer without the hook); :meth:`record` gives a ``ConsumerRecord`` either way.
    ``epochs``: for C records, (index in ``recs``, leader epoch) where a batch of a new epoch starts."""

    __slots__ = ("topic", "partition", "epochs", "recs", "kind", "lo", "hi")

    def __init__(self, topic: str, partition: int, epochs: list, recs: list, kind: str, lo: int = 0,
                 hi: int | None = None):
        self.topic, self.partition, self.epochs, self.recs, self.kind = topic, partition, epochs, recs, kind
        self.lo, self.hi = lo, len(recs) if hi is None else hi

    @classmethod
    def of_records(cls, records: list) -> "RecordRun":
        """A run of kafka-python ``ConsumerRecord`` values (one partition, offset order)."""
        r0 = records[0]
        return cls(r0.topic, r0.partition, [], records, _KP)

    @property
    def offset(self) -> int:  # the first record's (kafka-python's dropwhile reads it)
        return self.recs[self.lo].offset

    @property
    def last_offset(self) -> int:
        return self.recs[self.hi - 1].offset

    def __len__(self) -> int:
        return self.hi - self.lo

    def __iter__(self):
        return iter(self.recs[self.lo:self.hi])

    def split(self, k: int) -> tuple["RecordRun", "RecordRun"]:
        """The first ``k`` records and the rest (views of the same list)."""
        at = self.lo + k
        return (RecordRun(self.topic, self.partition, self.epochs, self.recs, self.kind, self.lo, at),
                RecordRun(self.topic, self.partition, self.epochs, self.recs, self.kind, at, self.hi))

    def values(self) -> list:
        return [r.value for r in self.recs[self.lo:self.hi]]

    def newest_ms(self) -> int:
        return max([r.timestamp or 0 for r in self.recs[self.lo:self.hi]], default=0)

    def record(self, i: int):
        """Record ``i`` of the run as a kafka-python ``ConsumerRecord`` (dead letters, quarantine)."""
        at = self.lo + i
        r = self.recs[at]
        if self.kind == _KP:
            return r
        k = bisect.bisect_right(self.epochs, (at, _BIG)) - 1
        return _as_consumer_record(r, self.topic, self.partition, self.epochs[k][1] if k >= 0 else -1)

    def records(self) -> list:
        return [self.record(i) for i in range(len(self))]


def _as_consumer_record(r, topic: str, partition: int, epoch: int):
    from kafka.consumer.fetcher import ConsumerRecord

    key, value, headers = r.key, r.value, r.headers
    return ConsumerRecord(topic, partition, epoch, r.offset, r.timestamp, r.timestamp_type, key, value, headers,
                          None, len(key) if key is not None else -1, len(value) if value is not None else -1,
                          sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0) for k, v in headers)
                          if headers else -1)


_CLASS, _WHY_NOT = None, None
_loaded = False


def _classes():
    global _CLASS, _WHY_NOT, _loaded
    if not _loaded:
        _CLASS, _WHY_NOT = _load()
        _loaded = True
    if _CLASS is None:
        _warn_once("unavailable", "fast record parsing is off: %s; kafka-python parses records", _WHY_NOT)
    return _CLASS


def fast_partition_records(runs: bool = False):
    """The :class:`FastPartitionRecords` class (``runs``: the one handing out :class:`RecordRun`
    values), or None (with the reason logged once) where unsafe."""
    classes = _classes()
    return None if classes is None else classes[1 if runs else 0]


def install(consumer, runs: bool = False) -> bool:
    """Make ``consumer`` (a ``kafka.KafkaConsumer``) parse fetched record batches with aiokafka's C
    parser; ``runs``: its polls then return ``{tp: [RecordRun, ...]}`` (one run per fetch) instead of
    ``ConsumerRecord`` lists. Returns False, changing nothing, where the hook is unavailable or the
    consumer's internals are not the expected ones."""
    cls = fast_partition_records(runs)
    fetcher = getattr(consumer, "_fetcher", None)  # kafka-python internals: the fetcher's parser is what is swapped
    if cls is None or fetcher is None or not isinstance(fetcher, _fetcher_class()):
        if cls is not None:
            _warn_once("consumer", "fast record parsing is off: %r has no kafka-python Fetcher", type(consumer))
        return False
    fetcher.PartitionRecords = cls
    return True


def installed(consumer) -> bool:
    """Whether ``consumer`` parses with the fast path (records or runs)."""
    return _CLASS is not None and getattr(getattr(consumer, "_fetcher", None), "PartitionRecords", None) in _CLASS


def _fetcher_class():
    from kafka.consumer.fetcher import Fetcher
    return Fetcher
