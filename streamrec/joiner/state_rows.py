"""The rows one partition's join state holds (``<p>/s/<key>`` in the table, JSON), as declared types.

:class:`~.machine.JoinState` reads and writes them through the mapping it is given; the batch record that
commits them (:class:`~.tx_row.BatchTx`, its ``version``) versions their layout too, since a partition's
rows change only inside a committed batch. Keys:

* ``i/<request_id>``: :class:`ImpressionRow`, an impression held until its dedupe horizon passes;
* ``a/<request_id>``: a list of :data:`WaitingAction`, actions waiting for their impression;
* ``wm``: :class:`WatermarkRow`, the partition's two watermarks.

A restore reads every row to rebuild the join's due-time heaps; :func:`impression_due` reads what those
need of an impression row (its ``ts`` and whether it is open) from the row's stored JSON without decoding
the event it holds.
"""

from __future__ import annotations

import re
from typing import Any, NotRequired, TypedDict

from .txstore import loads

IMPRESSION = "i/"  # key prefix of an ImpressionRow
WAITING = "a/"  # key prefix of a list of WaitingAction
WATERMARKS = "wm"  # key of the WatermarkRow

WaitingAction = list  # [action ts (ms), action type, the action watermark when it arrived]: a JSON array


class ImpressionRow(TypedDict):
    """One impression in the join: its time, the impression watermark at its arrival, the unlabelled event
    (while its window is open: a closed row keeps no event, since no example of it is written after the close),
    whether its window is open, the tasks a counting action labelled positive, whether its example is out."""

    ts: int
    wi: int
    ev: NotRequired[dict[str, Any]]
    open: bool
    pos: list[str]
    done: bool


class WatermarkRow(TypedDict):
    """The largest impression time (``i``) and action time (``a``) the partition has seen (None: none yet)."""

    i: int | None
    a: int | None


# an ImpressionRow as the store writes it (compact JSON, keys in the order the row is built): its ``ts`` the
# first key, ``open``, ``pos`` and ``done`` the last three. Inside a JSON string every quote is escaped, so
# ``,"open":`` found last is the row's own key, and the tail's match from there to the end is the row's.
_HEAD = re.compile(rb'\{"ts":(-?\d+),')
_TAIL = re.compile(rb',"open":(true|false),"pos":\[[^\]]*\],"done":(?:true|false)\}')


def decoded(val: Any) -> Any:
    """A row's value: decoded from its stored JSON bytes (:func:`~.txstore.loads`, which reads what the store's
    ``dumps`` writes), or as it is (a mapping of decoded values)."""
    return loads(val) if isinstance(val, (bytes, bytearray, memoryview)) else val


def impression_due(val: Any) -> tuple[int, bool]:
    """An :class:`ImpressionRow`'s ``ts`` and ``open``, from the row or its stored JSON bytes: read from the
    bytes' first key and last three when the row has the layout the store writes (its event not decoded),
    else from the decoded row."""
    if isinstance(val, bytes):
        head = _HEAD.match(val)
        at = val.rfind(b',"open":')
        tail = _TAIL.fullmatch(val, at) if head is not None and at > 0 else None
        if tail is not None:
            return int(head.group(1)), tail.group(1) == b"true"
    row = decoded(val)
    return row["ts"], row["open"]
