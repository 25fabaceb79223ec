"""The joiner's faust table manager: faust's own, without the second it waits at start for late tables,
and closing the join state's read-ahead before it opens a table's databases.

faust's ``TableManager.on_start`` sleeps one second before it registers the tables' changelog channels and
starts their recovery, so that tables declared after the app starts are still registered; the consumer
does not subscribe (and the worker does not join its group) before that. The joiner declares its one
table in :func:`~.app.build_app`, before the app starts, so nothing comes late and the wait is dropped:
a restarted worker joins its group a second sooner.

The worker reads the heaps of its kept local databases while it joins its group
(:class:`~.state_prescan.StatePrescan`, :attr:`PromptTableManager.read_ahead`, started here once the
consumer is about to join), through read-only handles of its own; faust opens the same databases on a
rebalance, so each rebalance first stops that read and waits until its handles are closed (at once after
the first).
"""

from __future__ import annotations

import asyncio

from faust.tables import TableManager

from .state_prescan import StatePrescan


class PromptTableManager(TableManager):
    """faust's TableManager that registers the tables and starts their recovery at once."""

    read_ahead: StatePrescan | None = None  # the worker's read of its kept state (build_app sets it)

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()  # what faust's on_start does after its sleep (no public hook)
            await self.recovery.start()
            if self.read_ahead is not None:
                self.read_ahead.start()  # the consumer asks to join next: the read overlaps the group's forming

    async def on_rebalance(self, assigned, revoked, newly_assigned, generation_id: int = 0) -> None:
        prescan = self.read_ahead
        if prescan is not None:
            if prescan.reading():
                await asyncio.to_thread(prescan.finish)  # the loop goes on while the read stops
            else:
                prescan.finish()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
