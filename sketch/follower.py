"""Follow the compacted ``hot-set`` topic: the newest version wins, versions never go back.

Reads every partition from the beginning with manual assignment (no consumer
group, so no join delay) in a daemon thread. A record that is not a HotSet is
logged and skipped; an older version than the one held is ignored, so a
replayed or re-published old set can never roll the trainer back.
"""

from __future__ import annotations

import logging
import threading
import time

from .hotset import HotSet

log = logging.getLogger(__name__)


class HotSetFollower:
    def __init__(self, bootstrap: str, topic: str, poll_ms: int = 200, security: dict | None = None):
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self._latest: HotSet | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.bad_records = 0
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                       auto_offset_reset="earliest", fetch_max_bytes=64 << 20,
                                       max_partition_fetch_bytes=32 << 20, client_id="streamrec-hotset-follower",
                                       **(security or {}))
        parts = None
        deadline = time.monotonic() + 30
        while not parts:
            parts = self._consumer.partitions_for_topic(topic)
            if not parts:
                if time.monotonic() > deadline:
                    self._consumer.close()
                    raise RuntimeError(f"hot-set topic {topic!r} does not exist on {bootstrap}")
                time.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self._poll_ms = poll_ms
        self._thread = threading.Thread(target=self._run, name="hotset-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                polled = self._consumer.poll(timeout_ms=self._poll_ms)
            except Exception as e:  # broker hiccup: keep the last good set, retry
                if self._stop.is_set():
                    return
                log.warning("hot-set follower poll failed: %s", e)
                time.sleep(0.5)
                continue
            for recs in polled.values():
                for rec in recs:
                    self._offer(rec)

    def _offer(self, rec) -> None:
        try:
            hs = HotSet.from_bytes(rec.value)
        except ValueError as e:
            self.bad_records += 1
            log.warning("skipping bad hot-set record %s:%d@%d: %s", rec.topic, rec.partition, rec.offset, e)
            return
        with self._cond:
            # >=: the worker republishes an unchanged set under its version with fresher counts
            if self._latest is None or hs.version >= self._latest.version:
                self._latest = hs
                self._cond.notify_all()

    def latest(self) -> HotSet | None:
        """The newest version seen so far (None before the first)."""
        with self._cond:
            return self._latest

    def wait_for(self, min_version: int = 1, timeout: float = 30.0, predicate=None) -> HotSet | None:
        """Block until a version >= ``min_version`` (and ``predicate(hs)`` if given) arrives; None on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hs = self._latest
                if hs is not None and hs.version >= min_version and (predicate is None or predicate(hs)):
                    return hs
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._consumer.close(autocommit=False)
        except Exception:
            pass

    def __enter__(self) -> "HotSetFollower":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def latest_hotset(bootstrap: str, topic: str, timeout: float = 10.0, security: dict | None = None) -> HotSet | None:
    """The newest HotSet on the topic, reading only the last record of each partition (None if empty)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      fetch_max_bytes=64 << 20, max_partition_fetch_bytes=32 << 20, **(security or {}))
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return None
        c.assign(tps)
        ends = c.end_offsets(tps)
        want = {tp for tp in tps if ends[tp] > 0}
        for tp in want:
            c.seek(tp, ends[tp] - 1)
        best: HotSet | None = None
        deadline = time.monotonic() + timeout
        while want and time.monotonic() < deadline:
            for tp, recs in c.poll(200).items():
                for rec in recs:
                    try:
                        hs = HotSet.from_bytes(rec.value)
                    except ValueError:
                        continue
                    if best is None or hs.version > best.version:
                        best = hs
                if c.position(tp) >= ends[tp]:
                    want.discard(tp)
        return best
    finally:
        c.close()
