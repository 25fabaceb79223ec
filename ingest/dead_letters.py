"""The dead-letter writer: bad records go to the DLQ topic with their reason, never silently dropped.

A dead letter carries the record's original bytes (a prefix, with the whole's size and sha256, when it is
bigger than ``ingest.dlq_max_bytes``), the reason in :data:`REASON_HEADER`, the record it came from in
:data:`SOURCE_HEADER` (``topic:partition:offset``) and the record's own headers. Every dead letter is
counted in the consumer's stats. :meth:`DeadLetterWriter.flush` waits until the broker answered each one
sent so far and raises :class:`DeadLetterError` if any was not taken: a caller flushes before it records
progress past a bad record, so a record refused by the DLQ is never skipped.
"""

from __future__ import annotations

import hashlib
import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING

from streamrec.foundation import EventBatch, StreamrecError

from .codec import encode_json

if TYPE_CHECKING:
    from kafka import KafkaProducer

    from .consumer_stats import ConsumerStats

log = logging.getLogger(__name__)

REASON_HEADER = "streamrec-error"
SOURCE_HEADER = "streamrec-source"
# a bad record bigger than ingest.dlq_max_bytes is dead-lettered truncated, with these two headers
ORIGINAL_SIZE_HEADER = "streamrec-original-bytes"
ORIGINAL_SHA256_HEADER = "streamrec-original-sha256"
_OWN_HEADERS = (REASON_HEADER, SOURCE_HEADER, ORIGINAL_SIZE_HEADER, ORIGINAL_SHA256_HEADER)
_MAX_REASON = 2000  # characters of the reason kept in its header


class DeadLetterError(StreamrecError, RuntimeError):
    """The dead-letter topic did not take a bad record: a caller must not record progress past it."""


class DeadLetterWriter:
    """Writes bad records to ``topic`` through ``producer`` (None: they are counted and logged only)."""

    def __init__(self, producer: "KafkaProducer | None", topic: str, max_bytes: int, stats: "ConsumerStats"):
        self.producer = producer
        self.topic = topic
        self.max_bytes = max_bytes
        self.stats = stats
        self.sent: list = []  # (send future or the error send raised, "topic:partition:offset") since the last flush

    def write(self, rec, reason: str) -> None:
        """Dead-letter one record (anything with ``topic partition offset key value headers``)."""
        self.stats.dead_letters += 1
        key = reason.split(":")[0][:60]
        self.stats.dead_letter_reasons[key] = self.stats.dead_letter_reasons.get(key, 0) + 1
        log.warning("dead letter %s:%d@%d: %s", rec.topic, rec.partition, rec.offset, reason)
        if self.producer is None:
            return
        source = f"{rec.topic}:{rec.partition}:{rec.offset}"
        value = rec.value if rec.value is not None else b""
        headers = [
            # backslashreplace: a reason quoting a lone surrogate must not fail the dead letter itself
            (REASON_HEADER, reason[:_MAX_REASON].encode("utf-8", "backslashreplace")),
            (SOURCE_HEADER, source.encode()),
        ]
        if len(value) > self.max_bytes:  # the DLQ topic would refuse it: keep a prefix, and say what the whole was
            headers += [(ORIGINAL_SIZE_HEADER, str(len(value)).encode()),
                        (ORIGINAL_SHA256_HEADER, hashlib.sha256(value).hexdigest().encode())]
            value = value[:self.max_bytes]
        headers += [(k, v) for k, v in (rec.headers or []) if k not in _OWN_HEADERS]
        try:
            sent = self.producer.send(self.topic, value, key=rec.key, headers=headers)
        except Exception as e:  # e.g. bigger than the producer's max_request_size: reported at the next flush
            sent = e
        self.sent.append((sent, source))

    def write_event(self, ev, topic: str, partition: int, offset: int, reason: str) -> None:
        """Dead-letter one decoded event as a JSON message, naming ``topic:partition:offset`` as its source."""
        self.write(SimpleNamespace(topic=topic, partition=partition, offset=offset, key=None, headers=None,
                                   value=encode_json(ev)), reason)

    def write_events(self, batch: EventBatch, reason: str, source: str) -> None:
        """Dead-letter decoded events a later stage refused, one JSON event per message: they are no longer
        the bytes they arrived as, but nothing is dropped silently."""
        for ev in batch.to_events():
            self.write_event(ev, source, -1, -1, reason)

    def flush(self) -> None:
        """Wait until the producer has sent every dead letter so far (the broker answered each); raise
        :class:`DeadLetterError` when one was not acknowledged."""
        if self.producer is None or not self.sent:
            return
        self.producer.flush(60)
        sent, self.sent = self.sent, []
        failed = [(src, s if isinstance(s, Exception) else s.exception or "not acknowledged within 60 s")
                  for s, src in sent if isinstance(s, Exception) or not s.succeeded()]
        if failed:
            src, why = failed[0]
            raise DeadLetterError(f"dead-letter topic {self.topic!r} did not take {len(failed)} bad record(s), "
                                  f"the first {src}: {why}; not recording progress past them")

    def close(self) -> None:
        """Send what is still buffered and close the producer."""
        if self.producer is not None:
            self.producer.flush(60)
            self.producer.close()
