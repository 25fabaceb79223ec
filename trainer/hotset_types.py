"""The trainer's hot-set source: the extension point it reads the hot set from.

:class:`HotSetSource` is what ``TrainerService`` asks for the newest hot set. The
built-in implementation is ``trainer.hotset.TopicHotSource``, which follows the
sketch worker's compacted ``hot-set`` topic (``streamrec.sketch.HotSetFollower``);
``SampleHotSource`` (counts in-process) and ``NoHotSource`` (no hot tier) are the
other built-in choices of ``trainer.hot_source``, made by ``make_hot_source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only
    import numpy as np

    from streamrec.foundation import EventBatch


@dataclass
class HotUpdate:
    """One hot set to apply: every table's hot ids (a table not named has none)."""

    version: int
    tables: dict[str, np.ndarray]
    coverage: float = float("nan")  # estimated fraction of lookups the set covers
    hit_rate: float = float("nan")


@runtime_checkable
class HotSetSource(Protocol):
    """Where the trainer's hot set comes from.

    ``observe`` sees every batch the trainer trains on, in order (a source that counts
    popularity itself uses it; one that follows a topic ignores it). ``poll`` returns a
    set whose rows differ from the last one returned, or None; it never blocks on I/O.
    ``version`` is the version last returned; the trainer sets it after a restore so a
    source does not hand back the set the checkpoint already holds. A source that holds
    a connection also has ``close()``, which the trainer calls when it stops.
    """

    version: int

    def observe(self, batch: EventBatch) -> None: ...

    def poll(self) -> HotUpdate | None: ...
