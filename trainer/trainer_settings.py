"""What a trainer service reads: its sections as loaded, and the values derived from several, once.

The application builds one (``streamrec.app.wiring.trainer_settings``) from the whole configuration; a
trainer group's rank replaces its ``store`` and ``trainer`` sections with its own (``rank_sections``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.budget import HotBudget
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.ingest.ingest_config import IngestConfig, KafkaConfig
    from streamrec.joiner.join_config import JoinConfig

    from .snapshots import SnapshotForm
    from .trainer_config import TrainerConfig


@dataclass(frozen=True)
class TrainerSettings:
    model: ModelConfig
    trainer: TrainerConfig
    store: StoreConfig
    kafka: KafkaConfig
    ingest: IngestConfig
    join: JoinConfig
    hot_budget: HotBudget  # the device tier's budget (``hot_budget(hot, model)``)
    snapshot_form: SnapshotForm  # the rows' precision and the model line a snapshot names (``[serving]``)
    push_every_s: float  # a delta push this often (``serving.push_every_s``; 0: only after checkpoints)
    push_targets: tuple[str, ...]  # the serving replicas snapshots go to
    model_hash: str  # what makes two models compatible (``ModelConfig.model_hash``)
