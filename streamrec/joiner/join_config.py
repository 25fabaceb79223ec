"""``[join]``: the delayed-feedback joiner's topics, attribution window, labels and state."""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamrec.foundation.config import InvalidValue, check_choice, check_metrics_endpoint
from streamrec.ingest.ingest_config import check_topic_name

from .join_types import JoinMode


@dataclass
class JoinConfig:
    mode: JoinMode = "window"  # window (one example per impression: a positive when its action arrives in the window, a negative when the window closes in event time) | fake_negative (a negative at once, a positive when the action arrives)
    impressions_topic: str = "impressions"  # topic of unlabelled events (request_id required); the producer chooses each record's form: one JSON impression keyed by its request_id, or an Arrow record of many (kafka.codec's Arrow columns without label, labels, feedback) sent to the partition their request_ids hash to
    actions_topic: str = "actions"  # topic of actions (request_id, ts, type, optional value), keyed by request_id; co-partitioned with impressions_topic
    group: str = "streamrec-joiner"  # consumer group (faust app id) of the joiner workers
    label_action: str = "click"  # the action type that makes an impression a positive (single-task output: `label`)
    task_actions: str = ""  # multi-task output: "task=action_type[@window_s],..." (e.g. "click=click,conversion=purchase@86400"); each task's label is 1 when its action arrived in the task's window (its @window_s, else join.window_s); the impression's window closes with the longest ("" = label_action only)
    window_s: float = 3600.0  # attribution window: an action counts when its ts is at most this many seconds after the impression's ts (event time)
    allowed_lateness_s: float = 60.0  # the window closes when the actions' event-time watermark passes impression ts + window_s + this
    orphan_wait_s: float = 300.0  # an action that arrives before its impression waits until the impressions' watermark passes its ts + this (event time)
    merge_wait_ms: float = 500.0  # ms after which a partition's topic that delivered nothing (and is not known to hold more) no longer holds back the other in the merge of impressions and actions by event time (one that delivered nothing since the worker took the partition holds only while the broker says it holds more); 10x this bounds the wait on a topic the broker says holds more
    idle_close_s: float = 0.0  # a partition that received no impression and no action for this many seconds of wall time while it holds open windows or waiting actions has its event time (both watermarks) advanced by the wall time passed, closing what is then due (0 = off; wall-time dependent: see docs/joining.md)
    state_dir: str = "data/joiner"  # faust table state (RocksDB) of the joiner
    batch_records: int = 2000  # input records joined per state commit (an Arrow record counts its impressions; one record is never split) (one atomic write per partition and batch: its examples are acknowledged before it; that write holds the batch's state changes: they must fit the changelog topic's max.message.bytes)
    metrics_port: int = 0  # Prometheus HTTP port of the joiner, 0 = off
    metrics_host: str = "127.0.0.1"  # address the joiner's Prometheus endpoint binds (0.0.0.0 to publish it)

    def __post_init__(self) -> None:
        check_choice("join", self, "mode", JoinMode)
        check_metrics_endpoint("join", self)
        for key in ("impressions_topic", "actions_topic"):
            check_topic_name("join", self, key)
        if self.impressions_topic == self.actions_topic:
            raise InvalidValue("actions_topic", "must differ from join.impressions_topic", "join")
        if not self.label_action:
            raise InvalidValue("label_action", "must name an action type", "join")
        self._check_task_actions()
        if self.window_s <= 0:
            raise InvalidValue("window_s", "must be > 0", "join")
        if self.batch_records < 1:
            raise InvalidValue("batch_records", "must be >= 1", "join")
        for key in ("allowed_lateness_s", "orphan_wait_s", "merge_wait_ms", "idle_close_s"):
            if not getattr(self, key) >= 0:  # NaN fails this too
                raise InvalidValue(key, "must be >= 0", "join")

    def _check_task_actions(self) -> None:
        if not self.task_actions.strip():
            return
        tasks = [task for task, _, _ in self._task_items()]
        if len(set(tasks)) != len(tasks):
            raise InvalidValue("task_actions", f"duplicate task names in {tasks}", "join")

    def _task_items(self) -> list[tuple[str, str, float | None]]:
        """``task_actions`` parsed: ``(task, action type, window in s or None)`` in order; InvalidValue names
        the item that is not ``task=action_type[@window_s]`` with a positive finite window."""
        out = []
        for item in self.task_actions.split(","):
            task, eq, rest = item.strip().partition("=")
            action, at, window = rest.partition("@")
            if not eq or not task.strip() or not action.strip():
                raise InvalidValue("task_actions", f"{item.strip()!r} is not task=action_type[@window_s]", "join")
            secs = None
            if at:
                try:
                    secs = float(window)
                except ValueError:
                    secs = math.nan
                if not math.isfinite(secs) or secs <= 0:
                    raise InvalidValue("task_actions", f"{item.strip()!r}: the window after @ must be a positive "
                                       "number of seconds", "join")
            out.append((task.strip(), action.strip(), secs))
        return out

    @property
    def tasks(self) -> dict[str, str]:
        """Task name -> the action type that labels it, in output order (``task_actions``, else the one
        ``label_action`` task named as its action type)."""
        if not self.task_actions.strip():
            return {self.label_action: self.label_action}
        return {task: action for task, action, _ in self._task_items()}

    @property
    def task_windows(self) -> dict[str, float]:
        """Task name -> its attribution window in s (its ``@window_s`` in ``task_actions``, else ``window_s``),
        in output order."""
        if not self.task_actions.strip():
            return {self.label_action: self.window_s}
        return {task: self.window_s if secs is None else secs for task, _, secs in self._task_items()}

    @property
    def longest_window_s(self) -> float:
        """The longest task window: an impression's window closes, and its held score is released, after it."""
        return max(self.task_windows.values())
