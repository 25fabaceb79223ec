"""Commit-on-checkpoint: the sketch worker's snapshot offsets, committed to its consumer group.

The worker's snapshots (the faust table, ``sketch/app.py``) are the source of truth for where
counting resumes; the consumer group's committed offsets mirror them so that the tools that
watch consumer groups (``kafka-consumer-groups``, Burrow, Kafka UI, lag alerts) see the worker's
real position, as Flink and Kafka Streams commit their checkpointed offsets.

:class:`CheckpointCommits` holds, per partition, the offset of the newest snapshot not committed
yet, and commits them together after each snapshot, in the background: a commit never holds up
counting. A commit that fails or takes longer than its timeout is logged as one warning line
(then nothing more until commits work again, which is logged once too) and its offsets stay
pending for the next snapshot's commit; it never stops the worker. Committed offsets never
decide where the worker reads.

:func:`group_committer` commits through faust's own group member (its aiokafka consumer, in
faust's consumer thread): a broker accepts offset commits for a group with live members only from
a member of the current generation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

CommitFn = Callable[[dict[int, int]], Awaitable[None]]


class CheckpointCommits:
    """The offsets of one topic's snapshots, committed to the consumer group after each snapshot.

    ``commit(offsets)`` commits ``{partition: next offset}`` and raises on failure; each call is
    bounded by ``timeout_s``. ``offer`` and ``forget`` run on the event loop that runs the commits."""

    def __init__(self, topic: str, commit: CommitFn, timeout_s: float = 10.0):
        self.topic = topic
        self._commit = commit
        self.timeout_s = timeout_s
        self.pending: dict[int, int] = {}  # partition -> snapshot offset not committed yet
        self.committed: dict[int, int] = {}  # partition -> offset this worker committed last
        self.failures = 0  # failed commits in a row
        self._task: asyncio.Task | None = None

    def offer(self, partition: int, offset: int) -> None:
        """A snapshot of ``partition`` holds ``offset`` (the next record to count): commit it, with any
        offsets still pending, unless a commit is running (its end commits what arrived meanwhile)."""
        self.pending[partition] = int(offset)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sketch-offset-commit")

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions this worker no longer owns: their new owner commits them."""
        for p in partitions:
            self.pending.pop(p, None)
            self.committed.pop(p, None)

    async def _run(self) -> None:
        while self.pending:
            offsets = dict(self.pending)
            try:
                await asyncio.wait_for(self._commit(offsets), self.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failures += 1
                if self.failures == 1:
                    log.warning("committing the snapshot offsets of %s to the consumer group failed (%s); retried "
                                "at the next snapshot, counting goes on (the snapshots decide where it resumes)",
                                self.topic, _reason(e))
                return
            for p, o in offsets.items():
                if self.pending.get(p) == o:
                    del self.pending[p]
                self.committed[p] = o
            if self.failures:
                log.info("committing the snapshot offsets of %s to the consumer group works again (after %d failed "
                         "commits)", self.topic, self.failures)
                self.failures = 0

    async def idle(self) -> None:
        """Wait until no commit is running."""
        if self._task is not None:
            await asyncio.wait([self._task])

    async def close(self) -> None:
        """Stop a running commit (what it had not committed stays pending)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._task = None


def _reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def group_committer(app, topic: str) -> CommitFn:
    """``commit(offsets)`` through faust's consumer of ``app``: an OffsetCommit of the group member with
    its current generation. Partitions not assigned to it are left out (their new owner commits them);
    a failure raises (faust's own commit path would crash the app instead). Cancelling the call
    cancels the commit in faust's consumer thread."""

    async def commit(offsets: dict[int, int]) -> None:
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        assigned = {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}
        mine = {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items() if p in assigned}
        if not mine:
            return
        # faust commits only the offsets its own streams acked: the group member (faust's aiokafka consumer, on
        # its consumer thread's loop) is reached through faust's internals to commit the snapshots' offsets
        thread = app.consumer._thread  # faust's AIOKafkaConsumerThread: no public accessor
        consumer = thread._ensure_consumer()  # faust's aiokafka consumer of the group: no public accessor
        fut = asyncio.run_coroutine_threadsafe(consumer.commit(mine), thread.thread_loop)
        await asyncio.wrap_future(fut)

    return commit
