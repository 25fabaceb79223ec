"""Where the trainer's wall time goes, stage by stage.

A :class:`StageClock` adds the seconds of each named stage of the training pipeline
(``with clock.stage("ids"): ...``). The trainer always has one; it costs two
``perf_counter`` calls per stage and step, so it stays on. ``bench train --host-ceiling``
reads it to tell the work that stays on the host (decode, batching, id bookkeeping, the
store's cold rows, copies, metrics) from the work a device does (``DEVICE_STAGES``).

On a CUDA device the device stages only *launch* kernels (they return before the kernels
finish), so there their seconds are launch overhead, not kernel time; the host stages
are host time on every device.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

STAGES = ("decode", "batching", "ids", "lookup", "copies", "device", "update", "scores", "metrics")
"""Every stage a clock may be asked for, in pipeline order:

- ``decode``: record values to columnar batches (the consumer's, or a bench's own decode);
- ``batching``: FAE hot/cold classification of arriving events and forming mini-batches;
- ``ids``: a step's keyed jagged ids, hot-slot resolution, unique cold ids, admission counts;
- ``lookup``: the store's cold rows (host cache, prefetch buffers, RocksDB);
- ``copies``: packing a step's host arrays and copying them to the device (none on a CPU);
- ``device``: the arithmetic a device runs: unique, gather, pooling, forward, backward, the
  hot rows' and the dense network's updates;
- ``update``: the cold rows' updates on the host and the hot rows' bookkeeping;
- ``scores``: the step's scores and guard flags read back to the host;
- ``metrics``: progressive validation (AUC, logloss) of the trained events.
"""

DEVICE_STAGES = frozenset({"device"})
"""The stages whose work runs on the device when there is one."""


class StageClock:
    """Seconds per stage since the clock was made (or :meth:`reset`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the block's wall time to ``name`` (one of :data:`STAGES`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def reset(self) -> None:
        self.seconds.clear()

    def host_seconds(self) -> float:
        """Seconds of every stage that stays on the host."""
        return sum(s for k, s in self.seconds.items() if k not in DEVICE_STAGES)

    def device_seconds(self) -> float:
        """Seconds of the device stages (kernel launches only, on CUDA)."""
        return sum(s for k, s in self.seconds.items() if k in DEVICE_STAGES)
