"""The trainer's loop, one for a single process and for each rank of a group.

Each turn the host (:class:`~.service.TrainerService`, or a group's rank,
:class:`~.group.GroupTrainerService`) reads and trains what arrived and says what is due
(:class:`~.run_timers.Due`, from the loop's :class:`~.run_timers.RunTimers`) and whether the run ends;
the loop then checkpoints, pushes and records in that order, the same way for both. A run that ends
trains its tail, checkpoints what is not durable yet, pushes the final model and writes its last
record. A group's rank decides from rank 0's clock, so every rank takes the same turns.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Protocol

from .run_timers import Due, RunTimers


def freeze_heap() -> None:
    """Freeze what exists now (torch, the model, the store, every module) out of the cyclic GC for a
    training loop's life (``gc.unfreeze()`` when it ends): a full collection no longer walks it.
    Decoding one-event JSON records allocates objects per record, which triggers full collections;
    frozen, those walk only what the loop itself keeps, not every object of the process."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Turn:
    """What one turn's training left to the loop: what is due, and why the run ends ("" while it goes on)."""

    due: Due = field(default_factory=Due)
    reason: str = ""


class LoopHost(Protocol):
    """What :class:`RunLoop` needs of a trainer process or rank."""

    @property
    def trained_events(self) -> int:
        """Events trained so far (a group's: every rank's)."""
        ...

    def turn(self, timers: RunTimers) -> Turn:
        """Read and train what arrived (noting it in ``timers``); what is due, and whether the run ends."""
        ...

    def wind_down(self, reason: str) -> None:
        """The run ends for ``reason``: train what still waits where that is the host's rule."""
        ...

    def save(self) -> None:
        """Write a checkpoint."""
        ...

    def push_due(self) -> bool:
        """Push a snapshot now; False when none was built (the last push is still pending)."""
        ...

    def push_final(self) -> int | None:
        """The run ends: serving gets the model the final checkpoint holds and acknowledges it (its version;
        None where it did not, or where this process does not publish)."""
        ...

    def emit(self) -> object:
        """Write a metrics record."""
        ...

    def close(self) -> None:
        ...


class RunLoop:
    """Runs ``host`` turn by turn until it ends (module doc); :meth:`run` returns the reason."""

    def __init__(self, host: LoopHost, timers: RunTimers):
        self.host, self.timers = host, timers

    def run(self) -> str:
        freeze_heap()
        try:
            while True:
                turn = self.host.turn(self.timers)
                self._after(turn)
                if turn.reason:
                    return turn.reason
        finally:
            gc.unfreeze()
            self.host.close()

    def _after(self, turn: Turn) -> None:
        """Checkpoint, push and record as ``turn`` asks; at the run's end, every one of them."""
        host, timers, ending = self.host, self.timers, bool(turn.reason)
        if ending:
            host.wind_down(turn.reason)
        if turn.due.checkpoint or (ending and timers.dirty):
            host.save()
            timers.checkpointed(host.trained_events)
        if ending:
            host.push_final()  # every stop: serving gets the model the final checkpoint holds
        elif turn.due.push and host.push_due():
            timers.pushed(host.trained_events)
        if turn.due.log or ending:
            host.emit()
            timers.logged()
