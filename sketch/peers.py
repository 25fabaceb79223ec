"""The other workers' partitions, for a global hot set when several sketch workers split the stream.

Every worker already writes each of its partitions' sketch snapshots to the state
table, whose changelog topic Kafka keeps (key ``p<partition>``, the newest
snapshot wins). :class:`PeerSnapshots` follows that changelog with a plain
consumer (manual assignment, no group): the publishing worker merges its own
live partition sketches with the newest snapshot of every partition it does not
own, so the hot set it publishes is the one a single worker reading every
partition would choose (count-min sketches and heavy-hitter lists merge exactly),
only up to one checkpoint interval (``sketch.checkpoint_interval_s``) older for
the other workers' partitions.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class PeerSnapshots:
    """The newest snapshot bytes of every partition in the sketch table's changelog."""

    def __init__(self, bootstrap: str, topic: str, poll_ms: int = 200, security: dict | None = None):
        from kafka import KafkaConsumer

        self.topic = topic
        self._latest: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                       auto_offset_reset="earliest", fetch_max_bytes=64 << 20,
                                       max_partition_fetch_bytes=32 << 20, client_id="streamrec-sketch-peers",
                                       **(security or {}))
        self._assigned: set[int] = set()
        self._poll_ms = poll_ms
        self._thread = threading.Thread(target=self._run, name="sketch-peers", daemon=True)
        self._thread.start()

    def _assign(self) -> None:
        """Take any changelog partition not followed yet (the topic appears with the first snapshot)."""
        from kafka import TopicPartition

        parts = self._consumer.partitions_for_topic(self.topic) or set()
        if parts - self._assigned:
            self._assigned = set(parts)
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            self._consumer.assign(tps)
            self._consumer.seek_to_beginning(*tps)

    def _run(self) -> None:
        next_check = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_check:
                    self._assign()
                    next_check = time.monotonic() + 5.0
                if not self._assigned:
                    time.sleep(self._poll_ms / 1000)
                    continue
                polled = self._consumer.poll(timeout_ms=self._poll_ms)
            except Exception as e:  # a broker hiccup: keep what we have, retry
                if self._stop.is_set():
                    return
                log.warning("following %s failed: %s", self.topic, e)
                time.sleep(0.5)
                continue
            for recs in polled.values():
                for rec in recs:
                    self._offer(rec.key, rec.value)

    def _offer(self, key: bytes | None, value: bytes | None) -> None:
        if not key or not key.startswith(b"p") or not key[1:].isdigit():
            return
        with self._lock:
            if value:
                self._latest[int(key[1:])] = value
            else:  # a tombstone
                self._latest.pop(int(key[1:]), None)

    def snapshots(self, exclude: set[int]) -> dict[int, bytes]:
        """The newest snapshot of every partition not in ``exclude`` (the caller's own)."""
        with self._lock:
            return {p: b for p, b in self._latest.items() if p not in exclude}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._consumer.close()
        except Exception:
            pass
