"""The trainer's side of the crash-loop breaker for training steps (:mod:`streamrec.ingest.inflight`,
phase "step").

:func:`arm_step_breaker` makes the consumer mark each training step's records before the step runs and
gives it the probe that trains a dead predecessor's step records one by one in a child process as Kafka
delivers them again. The events of those records restored from the checkpoint into the partition merge
or the batcher are not delivered again, so they are handled here, at start: probed at the first death
(the ones that kill the probe are dead-lettered), all of them dead-lettered at a later death; the rest
stay and train. Dead letters are flushed before training goes on: their offsets are already committed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .crash_probe import ProbeModel

log = logging.getLogger(__name__)


def arm_step_breaker(sections: ProbeModel, core, consumer, merger) -> None:
    """Mark each of ``core``'s training steps through ``consumer`` (an ``EventConsumer``), give the
    consumer the training-step probe (it trains ``sections``' model), and quarantine the restored events a
    dead predecessor's step held (in ``merger`` and ``core.batcher``)."""
    from .crash_probe import probe_records

    core.step_marker = consumer
    consumer.step_probe = lambda values: probe_records(sections, consumer.schema, core.model.state_dict(), values)
    quarantine_restored(sections, core, consumer, merger)


def quarantine_restored(sections: ProbeModel, core, consumer, merger) -> None:
    """The events restored into the merge and the batcher whose records a training step died holding:
    probed (trained one by one in a child process) at the first death, the ones that kill it dead-lettered;
    at a later death, all of them. The rest stay and train."""
    from streamrec.foundation import EventBatch
    from streamrec.ingest import STEP_CRASH_REASON, holds_any

    sus = consumer.suspect_step()
    if sus is None:
        return
    ranges, deaths = sus
    topic = consumer.topic
    holders = [h for h in (merger, core.batcher) if len(h)]
    hits = [np.flatnonzero(holds_any(ranges, topic, h.part, h.off)) for h in holders]
    if not sum(len(x) for x in hits):
        return
    if deaths == 0:
        from .crash_probe import probe_train

        waiting = EventBatch.concat([h.buffer.take(x) for h, x in zip(holders, hits)], sections.model.dense_dim,
                                    sections.model.field_names)
        src = [(np.asarray(h.part[x], np.int64), np.asarray(h.off[x], np.int64)) for h, x in zip(holders, hits)]
        part, off = np.concatenate([p for p, _ in src]), np.concatenate([o for _, o in src])
        log.warning("probing %d restored events whose records a training step died holding", len(waiting))
        bad = probe_train(sections, core.model.state_dict(), waiting)
        culprit = {(int(part[i]), int(off[i])) for i in bad}
        hits = [x[[(int(h.part[i]), int(h.off[i])) in culprit for i in x]] if len(x) else x
                for h, x in zip(holders, hits)]
        why = STEP_CRASH_REASON
    else:
        why = (f"crashed the trainer: {deaths + 1} processes died in training steps holding this record "
               "(restored from the checkpoint, quarantined with the records in flight with it)")
    for h, x in zip(holders, hits):
        if len(x):
            out = h.remove(x)
            log.error("quarantined %d restored events of records %s: %s", len(out),
                      sorted(set(zip(out.source_partitions.tolist(), out.source_records.tolist()))), why)
            consumer.quarantine_events(out, out.source_partitions, out.source_records, why)
    consumer.flush_dead_letters()  # their offsets are committed: the DLQ must hold them before going on
