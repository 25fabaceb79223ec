"""The rows one partition's join state holds (``<p>/s/<key>`` in the table, JSON), as declared types.

:class:`~.machine.JoinState` reads and writes them through the mapping it is given; the batch record that
commits them (:class:`~.tx_row.BatchTx`, its ``version``) versions their layout too, since a partition's
rows change only inside a committed batch. Keys:

* ``i/<request_id>``: :class:`ImpressionRow`, an impression held until its dedupe horizon passes;
* ``a/<request_id>``: a list of :data:`WaitingAction`, actions waiting for their impression;
* ``wm``: :class:`WatermarkRow`, the partition's two watermarks.
"""

from __future__ import annotations

from typing import Any, TypedDict

IMPRESSION = "i/"  # key prefix of an ImpressionRow
WAITING = "a/"  # key prefix of a list of WaitingAction
WATERMARKS = "wm"  # key of the WatermarkRow

WaitingAction = list  # [action ts (ms), action type, the action watermark when it arrived]: a JSON array


class ImpressionRow(TypedDict):
    """One impression in the join: its time, the impression watermark at its arrival, the unlabelled event,
    whether its window is open, the tasks a counting action labelled positive, whether its example is out."""

    ts: int
    wi: int
    ev: dict[str, Any]
    open: bool
    pos: list[str]
    done: bool


class WatermarkRow(TypedDict):
    """The largest impression time (``i``) and action time (``a``) the partition has seen (None: none yet)."""

    i: int | None
    a: int | None
