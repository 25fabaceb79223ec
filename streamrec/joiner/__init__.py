"""The delayed-feedback joiner: impressions and the actions that follow them in, labelled events out.

:class:`JoinState` is the join itself, a deterministic state machine over one partition's impressions and
actions (no Kafka); ``streamrec.joiner.app`` runs it as a faust worker with its state in RocksDB-backed
tables (``streamrec join``); :class:`DelayedStream` generates impressions and actions with delayed,
heavy-tailed feedback and the true label of every impression. The state's durable rows are declared in
``state_rows.py`` (:class:`ImpressionRow`, :class:`WatermarkRow`) and ``tx_row.py`` (:class:`BatchTx`, the
versioned batch record)."""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .delayed_stream import DelayedStream
    from .join_types import JoinMode
    from .machine import FEEDBACK_HEADER, Action, Example, JoinRules, JoinState, JoinStats, parse_action
    from .state_rows import ImpressionRow, WatermarkRow
    from .tx_row import BatchTx

_EXPORTS = {  # submodule: the public names it defines
    ".delayed_stream": "DelayedStream",
    ".join_types": "JoinMode",
    ".machine": "FEEDBACK_HEADER Action Example JoinRules JoinState JoinStats parse_action",
    ".state_rows": "ImpressionRow WatermarkRow",
    ".tx_row": "BatchTx",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
