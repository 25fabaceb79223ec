"""The demo run that tests/e2e/test_demo.py (one trainer) and tests/e2e/test_metrics_endpoints.py both
check, started once per session by whichever of them runs first (tests/helpers/demo.py says why)."""

from __future__ import annotations

import pytest

from tests.helpers.demo import ScrapedDemo, run_scraped_demo


@pytest.fixture(scope="session")
def scraped_demo(bootstrap, tmp_path_factory) -> ScrapedDemo:
    return run_scraped_demo(bootstrap, tmp_path_factory.mktemp("scraped-demo") / "run")
