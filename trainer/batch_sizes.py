"""The event counts a trainer derives from ``trainer.batch_size``, computed once per process.

``trainer.group_batch`` gives ``batch_size`` two meanings in a group of ``world`` ranks: ``"group"`` (the
default) makes it the group's step, so each rank trains ``batch_size // world`` events per step and polls
its share of a window; ``"rank"`` makes it each rank's step (TorchRec's and PERSIA's per-worker batch), so a
group step trains ``world x batch_size`` events. A single trainer is a group of one: both meanings agree.
:func:`batch_sizes` is the one place that derives them; the service, the group's rank and both cores take
the :class:`BatchSizes` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamrec.trainer.trainer_config import TrainerConfig


@dataclass(frozen=True)
class BatchSizes:
    """Events per step, per window and per hot wait of one process (one rank of ``world``)."""

    step: int  # events one training step of this process trains (a rank's share of a group step)
    window: int  # events one poll asks for: a window of ``trainer.window_batches`` steps
    hot_wait: int  # arrivals a hot mini-batch may wait for (``trainer.hot_wait_batches`` steps)
    world: int = 1

    @property
    def global_step(self) -> int:
        """Events one step of the whole group trains."""
        return self.step * self.world


def batch_sizes(trainer: TrainerConfig, world: int = 1) -> BatchSizes:
    """The sizes a process of a group of ``world`` (1: a single trainer) trains with (module doc)."""
    world = max(1, int(world))
    share = 1 if trainer.group_batch == "rank" else world
    step = max(1, int(trainer.batch_size) // share)
    window = max(1, int(trainer.batch_size) * int(trainer.window_batches) // share)
    return BatchSizes(step, window, round(step * trainer.hot_wait_batches), world)
