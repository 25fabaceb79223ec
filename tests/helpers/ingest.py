"""Shared helpers for the ingest tests: hand-made Arrow IPC records, and reading a topic
back through EventConsumer."""

from __future__ import annotations

import json
import time
import uuid


def arrow_ipc(cols) -> bytes:
    """One Arrow IPC stream message holding the table of ``cols`` (column name -> pyarrow array)."""
    import pyarrow as pa

    t = pa.table(cols)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def poll_events(consumer, expected_events, timeout=20.0, max_events=4096) -> list:
    """Poll ``consumer`` until ``expected_events`` arrived (or ``timeout``); returns the batches."""
    batches = []
    deadline = time.monotonic() + timeout
    while sum(len(b) for b in batches) < expected_events and time.monotonic() < deadline:
        b = consumer.poll_batch(max_events, timeout=0.5)
        if b is not None:
            batches.append(b)
    return batches


def consume_all(bootstrap, cfg, expected_events, mode="assign", group=None, timeout=20.0, settle=0.0, **opts):
    """Read until ``expected_events`` arrived (or timeout); returns (batches, consumer stats).

    ``settle`` > 0: the same consumer then polls for ``settle`` more seconds, and whatever arrives
    meanwhile is in the batches and the stats, so a test can assert that nothing else arrives."""
    from streamrec.ingest import EventConsumer, EventSchema

    c = EventConsumer(bootstrap, cfg.kafka, cfg.ingest, EventSchema.from_sections(cfg.model, cfg.ingest),
                      group or f"g-{uuid.uuid4().hex[:6]}", mode=mode, **opts)
    try:
        batches = poll_events(c, expected_events, timeout)
        settle_until = time.monotonic() + settle
        while time.monotonic() < settle_until:
            b = c.poll_batch(4096, timeout=0.25)
            if b is not None:
                batches.append(b)
        c.mark_durable({})  # flush dead letters
        return batches, c.stats
    finally:
        c.close()


def events_of(batches):
    """Events in a canonical order (partitions interleave), for comparisons."""
    evs = [ev for b in batches for ev in b.to_events()]
    return sorted(evs, key=lambda e: json.dumps(e, sort_keys=True))
