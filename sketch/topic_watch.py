"""The events topic's identity, read again while the sketch worker runs.

A topic deleted and recreated under the same name gets a new topic id (KIP-516).
Every offset a partition snapshot holds then points into a log that no longer
exists: resuming there would skip the new topic's first events, or count the
new records on top of the old topic's counts. :class:`TopicWatch` asks the
cluster for the topic's metadata (a Metadata request through the Kafka protocol,
version 10 or later, which carries topic ids: Apache Kafka 2.8+ and the embedded
broker answer it) each time it is called, the same id the trainer's consumer
compares (:func:`streamrec.ingest.topic_id`). The worker calls it from its
counting task and applies ``kafka.on_offsets_lost`` when the id changed
(``sketch/app.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicIdentity:
    topic_id: str | None  # None: the topic does not exist now (deleted, not yet recreated) or the broker has no ids
    partitions: int  # 0 while the topic does not exist


class TopicWatch:
    """Fresh metadata of one topic on demand (blocking: call it off the event loop)."""

    def __init__(self, bootstrap: str, topic: str, security: dict | None = None):
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security or {}  # kafka-python keyword arguments (streamrec.ingest.client_settings)
        self._consumer = None

    def read(self) -> TopicIdentity:
        """The topic's id and partition count as the cluster answers now (not a cached answer)."""
        from kafka import KafkaConsumer

        from streamrec.ingest import topic_id

        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                           client_id="streamrec-sketch-topic-watch", **self.security)
        c = self._consumer
        if self.topic not in c.topics():  # topics() sends a Metadata request: the cache is this answer's
            return TopicIdentity(None, 0)
        tid = topic_id(c, self.topic)
        return TopicIdentity(str(tid) if tid is not None else None, len(c.partitions_for_topic(self.topic) or ()))

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as e:  # closing a client whose broker is gone: nothing left to release
                log.debug("closing the topic watch's client: %s", e)
            self._consumer = None
