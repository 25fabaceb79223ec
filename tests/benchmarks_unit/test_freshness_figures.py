"""The freshness bench's version rate: a figure only when there is an interval to measure it over."""

from __future__ import annotations

import pytest

from benchmarks.bench_freshness import versions_per_s


@pytest.mark.parametrize("seen_at", [[], [5.0], [5.0, 5.0]])
def test_too_few_versions_give_no_rate(seen_at):
    assert versions_per_s(seen_at) is None


def test_the_rate_counts_intervals_between_versions():
    assert versions_per_s([10.0, 12.0, 11.0, 14.0]) == pytest.approx(3 / 4)
