"""When a trainer's checkpoint, push, metrics record and idle exit are due: one clock for every loop.

A checkpoint is due once events arrived since the last one and either ``trainer.checkpoint_every_events``
were trained or ``trainer.checkpoint_every_s`` passed; a push every ``serving.push_every_s`` (0: pushes
follow the checkpoints instead) when the model changed or serving asked for a full snapshot; a record
every ``trainer.log_every_s``; the idle exit after ``trainer.idle_exit_s`` (0: never) without events. The
loops call :meth:`RunTimers.busy` while a fetch's high watermark shows records no fetch has brought yet, so a
slow fetch (a loaded host, a saturated link) is not taken for the end of the stream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamrec.trainer.trainer_config import TrainerConfig


@dataclass(frozen=True)
class Due:
    """What one loop turn does besides training (a trainer group's turn: what rank 0's clock decided)."""

    checkpoint: bool = False
    push: bool = False
    log: bool = False
    idle: bool = False


class RunTimers:
    """The clock of one training loop (module doc); ``events`` are the trained events it counts from."""

    def __init__(self, trainer: TrainerConfig, push_every_s: float, events: int):
        now = time.monotonic()
        self.checkpoint_every_events = int(trainer.checkpoint_every_events)
        self.checkpoint_every_s = float(trainer.checkpoint_every_s)
        self.log_every_s = float(trainer.log_every_s)
        self.idle_exit_s = float(trainer.idle_exit_s)
        self.push_every_s = float(push_every_s)
        self.checkpoint_at = self.log_at = self.push_at = self.busy_at = now
        self.events_at_checkpoint = self.events_at_push = int(events)
        self.dirty = False  # events arrived since the last checkpoint

    def busy(self) -> None:
        """Events arrived or trained now: the idle exit counts from here."""
        self.busy_at = time.monotonic()

    def received(self) -> None:
        """Events arrived: the next checkpoint has something to hold."""
        self.dirty = True

    def due(self, events: int, wants_full: bool | None) -> Due:
        """What is due now, ``events`` trained so far; ``wants_full``: whether the publisher wants a full
        snapshot (None: no publisher, nothing is pushed)."""
        now = time.monotonic()
        checkpoint = self.dirty and (events - self.events_at_checkpoint >= self.checkpoint_every_events
                                     or now - self.checkpoint_at >= self.checkpoint_every_s)
        push = (wants_full is not None and self.push_every_s > 0 and now - self.push_at >= self.push_every_s
                and (events != self.events_at_push or wants_full))
        idle = bool(self.idle_exit_s) and now - self.busy_at > self.idle_exit_s
        return Due(checkpoint, push, now - self.log_at >= self.log_every_s, idle)

    def checkpointed(self, events: int) -> None:
        self.events_at_checkpoint, self.checkpoint_at, self.dirty = int(events), time.monotonic(), False

    def pushed(self, events: int) -> None:
        self.events_at_push, self.push_at = int(events), time.monotonic()

    def logged(self) -> None:
        self.log_at = time.monotonic()
