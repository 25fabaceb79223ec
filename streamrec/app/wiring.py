"""The application's wiring: each part's settings taken from the whole configuration, in one place.

Only the application sees the whole ``Config``. Here it picks the sections each service reads and computes
the values several sections decide (the device tier's budget, where snapshots go, the model's hash) once;
the services below take those typed settings and nothing else.
"""

from __future__ import annotations

from streamrec.app.config import Config
from streamrec.foundation.budget import hot_budget
from streamrec.serving import ServerSettings
from streamrec.trainer.trainer_settings import TrainerSettings


def server_settings(cfg: Config) -> ServerSettings:
    """The sections a server reads: ``[serving]``, ``[store]`` (its versions' stores) and
    ``ingest.dense_abs_max`` (requests are held to what training accepts)."""
    return ServerSettings(cfg.serving, cfg.store, float(cfg.ingest.dense_abs_max))


def trainer_settings(cfg: Config) -> TrainerSettings:
    """What a trainer service (one process or a group's rank) reads."""
    return TrainerSettings(model=cfg.model, trainer=cfg.trainer, store=cfg.store, kafka=cfg.kafka, ingest=cfg.ingest,
                           join=cfg.join, hot_budget=hot_budget(cfg.hot, cfg.model), snapshot_form=cfg.serving,
                           push_every_s=cfg.serving.push_every_s, push_targets=tuple(cfg.push_targets()),
                           model_hash=cfg.model_hash())
