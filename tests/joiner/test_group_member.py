"""A restarted joiner worker removes its killed predecessor from the consumer group before it joins: the
group's members of the client id kept in the worker's state dir are sent a LeaveGroup, no other member is."""

from __future__ import annotations

import asyncio

import pytest

from streamrec.app.config import load_config
from streamrec.ingest.faust_worker import Cluster
from streamrec.joiner.group_member import leave_as_before, worker_client_id

pytestmark = [pytest.mark.broker]


def test_a_state_dir_keeps_its_client_id(tmp_path):
    first = worker_client_id(tmp_path / "a")
    assert worker_client_id(tmp_path / "a") == first and worker_client_id(tmp_path / "b") != first


def test_the_members_of_this_client_id_are_removed_from_the_group(tmp_path, bootstrap):
    from aiokafka import AIOKafkaConsumer

    from streamrec.ingest import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec("member-t", 2)])
    group, mine, other = "member-g", worker_client_id(tmp_path / "mine"), worker_client_id(tmp_path / "other")

    async def started(client_id: str) -> AIOKafkaConsumer:
        c = AIOKafkaConsumer("member-t", bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             client_id=client_id, session_timeout_ms=6_000, rebalance_timeout_ms=1_000,
                             heartbeat_interval_ms=300)
        await c.start()
        return c

    async def members_after(s: float, consumers) -> list[str]:
        await asyncio.gather(*(c.getmany(timeout_ms=int(s * 1000)) for c in consumers))
        return [c._coordinator.member_id for c in consumers]

    loop = asyncio.new_event_loop()
    consumers = []
    try:
        consumers = [loop.run_until_complete(started(cid)) for cid in (mine, other)]
        before = loop.run_until_complete(members_after(4.0, consumers))  # both joined and synced
        assert all(before)
        cluster = Cluster.of(bootstrap, load_config(None, {}, env={}).kafka)
        assert leave_as_before(cluster, group, mine) == [before[0]]
        # the broker no longer knows that member: its next heartbeat fails and it joins again, as a new member;
        # the other client's member stays
        after = loop.run_until_complete(members_after(4.0, consumers))
        assert after[0] not in (before[0], "") and after[0].startswith(mine)
        assert after[1] == before[1]
    finally:
        for c in consumers:
            loop.run_until_complete(c.stop())
        loop.close()
