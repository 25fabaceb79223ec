"""The training step's crash probe: which events kill a process that trains them.

After a process died in a training step, the crash-loop marker names the step's records
(``streamrec.ingest.inflight``). The restarted trainer trains those events again, one event per
step, in a child process (spawned: nothing of the parent's state but what is passed), on a copy
of the restored dense model with an in-memory embedding table initialised as the store initialises
rows (``MemoryDLRM``). An event whose step kills the child is a culprit; the child is restarted
after each death and goes on with the next event. A crash that does not depend on the event alone
(an operator's ``kill -9``, memory exhausted by the whole process) is not reproduced, so it pins
nothing. Cost: one child interpreter start per culprit plus one, then one small step per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from streamrec.foundation import EventBatch
from streamrec.ingest import probe_in_children

if TYPE_CHECKING:
    from streamrec.foundation import EventSchema
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.trainer.trainer_config import TrainerConfig


@dataclass(frozen=True)
class ProbeModel:
    """What a probe child rebuilds the trainer's model from: the sections the in-memory baseline reads
    (``reference.MemoryDLRM``)."""

    model: ModelConfig
    trainer: TrainerConfig
    store: StoreConfig


def _train_each(sections: ProbeModel, model_state, batch: EventBatch, conn) -> None:  # runs in the child process
    import torch

    from .reference import MemoryDLRM

    torch.set_num_threads(1)
    vocab = {f: batch.sparse[f].values for f in sections.model.field_names}
    m = MemoryDLRM(sections.model, sections.trainer, sections.store, vocab, device="cpu")
    if model_state is not None:
        m.model.load_state_dict(model_state)
    for i in range(len(batch)):
        conn.send(i)  # "about to train i": if the child dies now, event i killed it
        try:
            m.train_batch(batch.take(np.array([i])))
        except Exception:  # a non-finite step or any error is the trainer's business, not a crash
            pass
    conn.send(-1)


def probe_train(sections: ProbeModel, model_state: Mapping[str, Any] | None, batch: EventBatch,
                timeout_s: float = 300.0) -> list[int]:
    """Indices of the events of ``batch`` that kill a process training on them alone (``sections``: the
    model to train; ``model_state``: the dense model's ``state_dict`` to start from, on the CPU; None:
    freshly initialised)."""
    if not len(batch):
        return []
    state = None if model_state is None else {k: v.detach().cpu() for k, v in model_state.items()}
    plain = EventBatch(batch.ts, batch.labels, batch.dense, batch.sparse,  # what the step needs, nothing more
                       task_labels=batch.task_labels, task_names=batch.task_names)
    return probe_in_children(lambda start: (_train_each, (sections, state, plain.take(np.arange(start, len(plain))))),
                             len(plain), "event", "training", timeout_s)


def probe_records(sections: ProbeModel, schema: EventSchema, model_state: Mapping[str, Any] | None,
                  values: Sequence[bytes]) -> list[int]:
    """Indices of the Kafka record ``values`` holding an event that kills a process training it alone
    (``schema``: the events' decoding, the consumer's; records that do not decode hold none: the dead-letter
    path has them)."""
    from streamrec.ingest import Decoder

    decoder = Decoder(schema)
    batches, owner = [], []
    for i, v in enumerate(values):
        b, _ = decoder.decode_many([v])
        if b is not None and len(b):
            batches.append(b)
            owner.append(np.full(len(b), i, np.int64))
    if not batches:
        return []
    batch = EventBatch.concat(batches, schema.dense_dim, list(schema.fields))
    owner_of = np.concatenate(owner)
    return sorted({int(owner_of[e]) for e in probe_train(sections, model_state, batch)})
