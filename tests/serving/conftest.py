"""Fixtures for the serving tests."""

from __future__ import annotations

import pytest

from tests.helpers.serving import serving_version_1


@pytest.fixture
def loaded(cfg, tmp_path):
    """A server with push and predict tokens, serving version 1; plus the trainer and events."""
    cfg.serving.max_batch = 50
    yield from serving_version_1(cfg, tmp_path)
