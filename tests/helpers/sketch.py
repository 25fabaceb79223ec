"""Shared helpers for the sketch tests: an event-time origin and Zipf-distributed ids."""

from __future__ import annotations

import numpy as np

from streamrec.ingest.synthetic import rank_to_id, zipf_ranks

T0 = 1_700_000_000_000  # ms


def zipf_ids(n, card=100_000, s=1.1, seed=1):
    return rank_to_id("item", zipf_ranks(np.random.default_rng(seed), n, card, s))
