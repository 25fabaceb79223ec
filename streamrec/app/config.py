"""The whole configuration: every part's section in one file, loaded once by the application.

Only ``streamrec.app`` sees :class:`Config`; it hands each part the section it owns (or values derived
from several, computed once in the application's wiring). Loading is the foundation's generic loader
(``streamrec.foundation.config``); the sections are defined beside the code that acts on them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from streamrec.embedding_store.store_config import StoreConfig
from streamrec.foundation.budget import HotConfig
from streamrec.foundation.config import load_sections, replace_checked, save_sections
from streamrec.foundation.model_config import ModelConfig
from streamrec.ingest.ingest_config import GeneratorConfig, IngestConfig, KafkaConfig, move_generator_keys
from streamrec.joiner.join_config import JoinConfig
from streamrec.serving.serving_config import ServingConfig
from streamrec.sketch.sketch_config import SketchConfig
from streamrec.trainer.trainer_config import TrainerConfig


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    sketch: SketchConfig = field(default_factory=SketchConfig)
    hot: HotConfig = field(default_factory=HotConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    join: JoinConfig = field(default_factory=JoinConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_hash(self) -> str:
        """Hash of what makes two models compatible (``[model]``'s fields, sizes, seed, tasks, network)."""
        return self.model.model_hash()

    def serving_target(self) -> str:
        return self.serving.serving_target()

    def push_targets(self) -> list[str]:
        """Where the trainer pushes snapshots: ``serving.push_targets`` (deduplicated), else ``serving_target()``."""
        return self.serving.push_targets_list()

    def with_values(self, **sections: Mapping[str, Any]) -> "Config":
        """A copy with ``section={key: value, ...}`` changed, each value coerced and checked as a loaded one
        is (the way the commands apply their flags to a loaded config)."""
        changed = {name: replace_checked(getattr(self, name), **values) for name, values in sections.items()}
        return dataclasses.replace(self, **changed)


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Build the config: file, then ``STREAMREC_SECTION__KEY`` env vars, then ``overrides``.

    ``overrides`` maps ``"section.key"`` to a value (already typed, or a string).
    """
    return load_sections(Config, path, overrides, env, migrate=move_generator_keys)


def save_config(cfg: Config, path: str | os.PathLike) -> Path:
    """Write the full config as TOML (what child processes of the demo read)."""
    return save_sections(cfg, path)
