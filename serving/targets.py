"""Where clients connect and where a trainer pushes snapshots, from the serving section alone."""

from __future__ import annotations

from streamrec.serving.serving_config import ServingConfig


def serving_target(serving: ServingConfig) -> str:
    """Where clients connect: ``serving.target``, else ``serving.host:serving.port``."""
    return serving.serving_target()


def push_targets(serving: ServingConfig) -> list[str]:
    """Every replica a trainer pushes snapshots to: ``serving.push_targets`` (comma-separated, deduplicated in
    order), else :func:`serving_target`."""
    return serving.push_targets_list()
