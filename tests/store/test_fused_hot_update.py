"""``fused_hot_update``: several tables' device-tier Adagrad in one batch of kernels gives, bit for bit,
what one ``adagrad_rows`` call per table gives (and so what the host path's numpy arithmetic gives).
Runs on CPU tensors here; tests/store/test_reference_model.py runs the store's fused path on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store.adagrad import adagrad_rows, adagrad_rows_np
from streamrec.embedding_store.optimizer import fused_hot_update

LR, EPS = 0.05, 1e-8


def _tables(rng, dims):
    return [(torch.from_numpy(rng.normal(0, 0.1, (50, d)).astype(np.float32)),
             torch.from_numpy(rng.uniform(0, 1, 50).astype(np.float32))) for d in dims]


def test_fused_equals_one_call_per_table():
    rng = np.random.default_rng(0)
    dims = [4, 4, 8, 4, 8]  # two widths: grouped by width, each group one call
    fused = _tables(rng, dims)
    single = [(w.clone(), a.clone()) for w, a in fused]
    parts = []
    for (w, a), d in zip(fused, dims):
        slots = rng.choice(50, int(rng.integers(0, 20)), replace=False).astype(np.int64)  # may be empty
        g = torch.from_numpy(rng.normal(0, 1, (len(slots), d)).astype(np.float32))
        parts.append((w, a, slots, g))
    fused_hot_update(parts, LR, EPS, torch.device("cpu"))
    for (w, a), (_, _, slots, g) in zip(single, parts):
        st = torch.from_numpy(slots)
        w_new, a_new = adagrad_rows(w[st], a[st], g, LR, EPS)
        w[st], a[st] = w_new, a_new
    for (wf, af), (ws, as_), (_, _, slots, g) in zip(fused, single, parts):
        assert torch.equal(wf, ws) and torch.equal(af, as_)
    assert any(len(s) for _, _, s, _ in parts)  # something was updated


def test_fused_matches_numpy_host_path():
    rng = np.random.default_rng(1)
    (w, a), = _tables(rng, [8])
    w0, a0 = w.numpy().copy(), a.numpy().copy()
    slots = np.array([3, 7, 11, 40], np.int64)
    g = rng.normal(0, 1, (4, 8)).astype(np.float32)
    fused_hot_update([(w, a, slots, torch.from_numpy(g))], LR, EPS, torch.device("cpu"))
    want_w, want_a = adagrad_rows_np(w0[slots], a0[slots], g, LR, EPS)
    assert np.array_equal(w.numpy()[slots], want_w) and np.array_equal(a.numpy()[slots], want_a)
    untouched = np.setdiff1d(np.arange(50), slots)
    assert np.array_equal(w.numpy()[untouched], w0[untouched])
