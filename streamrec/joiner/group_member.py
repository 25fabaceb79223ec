"""A restarted joiner worker takes its killed predecessor's place in the consumer group at once.

A worker killed with ``kill -9`` stays a member of ``join.group`` until the broker's session timeout expires;
a worker started on its state in the meantime joins a group that still counts the dead member (the embedded
broker may even make the dead member the group's leader, whose assignment never comes), so the join waits
for that member's expiry and a second rebalance. Each worker therefore has a client id of its own, kept in
its ``join.state_dir`` (:func:`worker_client_id`), and a group member's id begins with its client's id
(``<client id>-<uuid>``, as Kafka assigns them). :func:`leave_as_before`, at start, asks the group for its
members and sends a LeaveGroup for each member of this client id, as the dead worker would have on a clean
stop, so the group rebalances among the live members only. Each worker has its own state dir, so no live
worker has that client id; two workers sharing one state dir are not supported.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

from streamrec.ingest.faust_worker import Cluster

log = logging.getLogger(__name__)

CLIENT_FILE = "client-id"  # in join.state_dir: the worker's Kafka client id, the prefix of its group member ids


def worker_client_id(state_dir: str | Path) -> str:
    """The Kafka client id of the worker on ``state_dir``: the one kept there, else a new one (kept)."""
    path = Path(state_dir) / CLIENT_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"streamrec-join-{uuid.uuid4().hex[:16]}")
    tmp.replace(path)
    return path.read_text().strip()


def leave_as_before(cluster: Cluster, group: str, client_id: str, timeout_s: float = 5.0) -> list[str]:
    """Remove from ``group`` every member of client ``client_id`` (an earlier run of this worker): the
    member ids sent a LeaveGroup (none: no such member, or no answer in ``timeout_s``)."""
    loop = asyncio.new_event_loop()  # its own loop, not set as the thread's: faust's worker sets up its own
    try:
        gone = loop.run_until_complete(asyncio.wait_for(_leave(cluster, group, client_id), timeout_s))
    except Exception as e:  # the group then waits for the member's session timeout, as without this step
        log.info("join: could not remove the previous run's group member (%s: %s)", type(e).__name__, e)
        return []
    finally:
        loop.close()
    for member in gone:
        log.info("join: the previous run's group member %s is sent out of group %s", member, group)
    return gone


async def _leave(cluster: Cluster, group: str, client_id: str) -> list[str]:
    from aiokafka.client import AIOKafkaClient, CoordinationType
    from aiokafka.protocol.admin import DescribeGroupsRequest
    from aiokafka.protocol.group import LeaveGroupRequest

    client = AIOKafkaClient(bootstrap_servers=cluster.bootstrap, client_id=f"{client_id}-leave", **cluster.aiokafka)
    try:
        await client.bootstrap()
        node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        described = await client.send(node, DescribeGroupsRequest([group]))
        members = [m[0] for g in described.groups if g[0] == 0 for m in g[-1]]  # (error, ..., members)
        mine = [m for m in members if m.startswith(f"{client_id}-")]
        for member in mine:
            await client.send(node, LeaveGroupRequest(group, member))
        return mine
    finally:
        await client.close()
