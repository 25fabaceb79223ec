"""The joiner's faust table manager: faust's own, without the second it waits at start for late tables.

faust's ``TableManager.on_start`` sleeps one second before it registers the tables' changelog channels and
starts their recovery, so that tables declared after the app starts are still registered; the consumer
does not subscribe (and the worker does not join its group) before that. The joiner declares its one
table in :func:`~.app.build_app`, before the app starts, so nothing comes late and the wait is dropped:
a restarted worker joins its group a second sooner.
"""

from __future__ import annotations

from faust.tables import TableManager


class PromptTableManager(TableManager):
    """faust's TableManager that registers the tables and starts their recovery at once."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()  # what faust's on_start does after its sleep (no public hook)
            await self.recovery.start()
