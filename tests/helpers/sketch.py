"""Shared helpers for the sketch tests: an event-time origin and Zipf-distributed ids."""

from __future__ import annotations

import numpy as np

from streamrec.ingest.synthetic import rank_to_id, zipf_ranks

T0 = 1_700_000_000_000  # ms


def zipf_ids(n, card=100_000, s=1.1, seed=1):
    return rank_to_id("item", zipf_ranks(np.random.default_rng(seed), n, card, s))


# -- what a monitoring tool sees of a sketch worker (third-party clients: confluent-kafka, Prometheus text) --

def group_committed_offsets(bootstrap: str, group: str, topic: str, partitions: int,
                            timeout: float = 10.0) -> dict[int, int | None]:
    """The consumer group's committed offset of each partition of ``topic`` (None: never committed), read
    as lag monitors read it: an OffsetFetch through confluent-kafka's AdminClient."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka._model import ConsumerGroupTopicPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    got = admin.list_consumer_group_offsets([req], request_timeout=timeout)[group].result(timeout)
    out: dict[int, int | None] = {p: None for p in range(partitions)}
    for tp in got.topic_partitions:
        if tp.error is not None:
            raise RuntimeError(f"offset fetch of {topic}[{tp.partition}] for {group}: {tp.error}")
        out[tp.partition] = tp.offset if tp.offset >= 0 else None
    return out


def end_offsets(bootstrap: str, topic: str, partitions: int, timeout: float = 10.0) -> dict[int, int]:
    """Each partition's end offset (the offset after its last record), through confluent-kafka: the
    ListOffsets answer, checked by reading the partition's tail to its end (some brokers -- the embedded
    tansu -- answer ListOffsets with one less than the log end after a batched produce)."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamrec-test-watermarks",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in range(partitions)}
        todo = set(range(partitions))
        c.assign([TopicPartition(topic, p, max(0, ends[p] - 1)) for p in sorted(todo)])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the tail of {topic}: partitions {sorted(todo)} unfinished")
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends[msg.partition()] = max(ends[msg.partition()], msg.offset())  # EOF's offset: the log end
                    todo.discard(msg.partition())
                continue
            ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)
        return ends
    finally:
        c.close()


def snapshot_offsets(bootstrap: str, changelog: str, timeout: float = 10.0) -> dict[int, int]:
    """The offset each partition's newest sketch snapshot holds (the ``next_offset`` in its meta), read from
    the worker's state-table changelog (key ``p<partition>``, the newest record wins) with confluent-kafka."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    from streamrec.sketch import PopularitySketch

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamrec-test-changelog",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        meta = c.list_topics(changelog, timeout=timeout).topics.get(changelog)
        if meta is None or meta.error is not None or not meta.partitions:
            return {}
        ends = {p: c.get_watermark_offsets(TopicPartition(changelog, p), timeout=timeout)[1] for p in meta.partitions}
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(changelog, p, 0) for p in sorted(todo)])
        latest: dict[int, bytes | None] = {}
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {changelog} to its end: partitions {sorted(todo)} unfinished")
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                continue  # e.g. a partition-EOF event
            key = msg.key() or b""
            if key.startswith(b"p") and key[1:].isdigit():
                latest[int(key[1:])] = msg.value()
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
    finally:
        c.close()
    return {p: int(PopularitySketch.from_bytes_with_meta(blob)[1]["next_offset"])
            for p, blob in latest.items() if blob}


def scrape_lag(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> dict[int, float]:
    """The sketch worker's ``streamrec_sketch_partition_lag_records`` per partition, from its ``/metrics``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "streamrec_sketch_partition_lag_records":
            for s in fam.samples:
                out[int(s.labels["partition"])] = s.value
    return out


# -- a sketch worker as a process (`streamrec sketch`) --

def write_config(cfg, path):
    """``cfg`` as a TOML config file at ``path``; returns the path."""
    import tomli_w

    path.write_text(tomli_w.dumps(cfg.to_dict()))
    return path


def start_worker(config, bootstrap: str, log, env: dict | None = None):
    """``streamrec sketch`` with ``config`` as a child process, stdout and stderr appended to ``log``."""
    import subprocess
    import sys
    from pathlib import Path

    streamrec = str(Path(sys.executable).with_name("streamrec"))
    with open(log, "ab") as f:
        return subprocess.Popen([streamrec, "sketch", "--config", str(config), "--bootstrap", bootstrap],
                                stdout=f, stderr=subprocess.STDOUT, env=env)


def stop_worker(proc, wait: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after ``wait`` s; True when it exited on SIGTERM alone (or had exited)."""
    import subprocess

    if proc.poll() is not None:
        return True
    proc.terminate()
    try:
        proc.wait(wait)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


def produce_events(cfg, bootstrap: str, n: int, seed: int = 0) -> int:
    """Send ``n`` synthetic events (event times now) to ``cfg.kafka.events_topic``; returns ``n``."""
    import time

    from streamrec.ingest import EventProducer, EventSchema, SyntheticStream

    import copy

    cfg = copy.deepcopy(cfg)
    cfg.generator.seed = seed
    p = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    try:
        for b in SyntheticStream(cfg).batches(n):
            b.ts[:] = int(time.time() * 1000)
            p.send_batch(b)
    finally:
        p.close()
    return n


def sketch_state(cfg, **kwargs):
    """A :class:`~streamrec.sketch.SketchState` for ``cfg``, with what the application hands the worker."""
    from streamrec.app.commands.sketch import counting_spec
    from streamrec.sketch import SketchState

    return SketchState(counting_spec(cfg), **kwargs)


def sketch_cluster(cfg, bootstrap: str | None = None):
    """The :class:`~streamrec.ingest.faust_worker.Cluster` a worker of ``cfg`` connects to."""
    from streamrec.ingest.faust_worker import Cluster

    return Cluster.of(bootstrap or cfg.kafka.bootstrap, cfg.kafka)
