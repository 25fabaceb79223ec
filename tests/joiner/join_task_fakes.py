"""In-memory stand-ins for what :class:`streamrec.joiner.join_task.JoinTask` reads and writes (its reader,
producer and table), so its read-merge-join-commit loop runs without a broker, with the fetch order a test
chooses."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from types import SimpleNamespace

from streamrec.joiner.join_task import JoinTask
from streamrec.joiner.records import Joiner

EVENTS = "events"


class FakeReader:
    """A reader over ``logs`` (topic -> partition -> [(key, value)]) that fetches in the worst order: every
    unpaused partition of ``first`` before any record of another topic; a topic partition's high watermark
    is known only once a fetch of it answered."""

    def __init__(self, logs: dict, first: str):
        self.logs, self.first = logs, first
        self.pos: dict = {}
        self.paused_tps: set = set()
        self.known: set = set()  # topic partitions a fetch answered for

    def assign(self, tps) -> None:
        self.pos = {tp: self.pos.get(tp, 0) for tp in tps}

    def seek(self, tp, offset: int) -> None:
        self.pos[tp] = offset

    async def seek_to_beginning(self, tp) -> None:
        self.pos[tp] = 0

    def pause(self, *tps) -> None:
        self.paused_tps |= set(tps)

    def resume(self, *tps) -> None:
        self.paused_tps -= set(tps)

    def highwater(self, tp):
        return len(self.logs[tp.topic][tp.partition]) if tp in self.known else None

    async def getmany(self, timeout_ms: int = 0, max_records: int = 1000) -> dict:
        order = sorted(self.pos, key=lambda tp: (tp.topic != self.first, tp.topic, tp.partition))
        for tp in order:
            log = self.logs[tp.topic][tp.partition]
            if tp in self.paused_tps or self.pos[tp] >= len(log):
                continue
            self.known.add(tp)
            start = self.pos[tp]
            recs = [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=o, key=k, value=v)
                    for o, (k, v) in enumerate(log[start:start + max_records], start)]
            self.pos[tp] = start + len(recs)
            return {tp: recs}
        await asyncio.sleep(timeout_ms / 1000.0)
        return {}


class FakeClients:
    """JoinClients over one output partition (the events log) and an in-memory changelog."""

    def __init__(self, reader: FakeReader):
        self.reader = reader
        self.out: dict[str, list] = {}
        self.prod = SimpleNamespace(send=self._send)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def output_ends(self) -> dict[int, int]:
        return {0: len(self.out.get(EVENTS, []))}

    async def written_since(self, ends_of: dict[int, dict[int, int]]) -> dict[int, set[str]]:
        return {p: set() for p in ends_of}

    async def partitioner(self):
        return lambda keys: [0] * len(keys)

    async def produce(self, topic: str, q: int, records: list) -> list:
        log = self.out.setdefault(topic, [])
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(offset=len(log)))
        log.extend(records)
        return [(fut, len(records))] if records else []

    async def _send(self, topic, value, key=None, headers=None):
        (fut, _n), = await self.produce(topic, 0, [(key, value, headers)])
        return fut  # as the producer's send: the future of the record's acknowledgement


class FakeTable(dict):
    """The join table as a plain mapping of bytes, with the changelog names the task asks for."""

    changelog_topic = SimpleNamespace(get_topic_name=lambda: "join-changelog")


def logs_of(cfg, imps: dict, acts: dict) -> dict:
    """Each partition's impressions and actions (``make_streams``' lists) as their topics' records."""
    logs = {cfg.join.impressions_topic: {}, cfg.join.actions_topic: {}}
    for p in imps:
        logs[cfg.join.impressions_topic][p] = [
            (rid.encode(), json.dumps({"ts": ts, "dense": [0.5, 0.25, 1.0], "sparse": {"user": ev["sparse"]["user"]},
                                       "request_id": rid}).encode()) for rid, ts, ev in imps[p]]
        logs[cfg.join.actions_topic][p] = [
            (a.request_id.encode(), json.dumps({"request_id": a.request_id, "ts": a.ts, "type": a.type}).encode())
            for a in acts[p]]
    return logs


async def join_all(cfg, schema, logs: dict, first: str, want: int, timeout_s: float = 60.0,
                   keep_all: bool = False) -> list | dict:
    """Run the join task over ``logs`` (fetched ``first`` topic first) until ``want`` examples are out; the
    output messages' ``(key, value, headers)`` in the order they were written (``keep_all``: every topic's,
    by topic: the dead letters too)."""
    clients = FakeClients(FakeReader(logs, first))
    task = JoinTask(FakeTable(), Joiner(cfg.join, schema), clients, cfg.kafka, cfg.join)
    await task.assigned(set(logs[first]))
    runner = asyncio.create_task(task.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(clients.out.get(EVENTS, [])) < want and not runner.done():
            assert loop.time() < deadline, f"{len(clients.out.get(EVENTS, []))} of {want} examples"
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    return clients.out if keep_all else clients.out.get(EVENTS, [])


def kinds(out: list) -> Counter:
    """The output messages as the oracle counts them: (request id, kind, (("click", label),))."""
    got: Counter = Counter()
    for _key, value, headers in out:
        ev = json.loads(value)
        got[(ev["request_id"], dict(headers)["streamrec-feedback"].decode(), (("click", ev["label"]),))] += 1
    return got
