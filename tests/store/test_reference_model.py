"""Property test: random operation sequences against a plain-dict reference model.

The reference applies row-wise Adagrad one row at a time in numpy float32 with the
same arithmetic order as embedding_store.adagrad, so vectors and accumulators must
match float-exactly through lookups, gradient steps, hot-set migrations, prefetches,
upserts, checkpoints and restores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrec.embedding_store import EmbeddingStore, StoreSpec
from streamrec.embedding_store.rowpath import cold_rows
from tests.conftest import fuzz_examples

TABLES = {"a": 4, "b": 3}
LR, EPS = 0.05, 1e-8
ID = st.integers(min_value=-5, max_value=40)


class Reference:
    def __init__(self, init):
        self.rows: dict[tuple[str, int], tuple[np.ndarray, np.float32]] = {}
        self.init = init

    def get(self, table, i):
        if (table, i) not in self.rows:
            return self.init(table, i), np.float32(0)
        return self.rows[(table, i)]

    def apply(self, table, i, g):
        w, acc = self.get(table, i)
        sq = g * g
        s = sq[0]
        for j in range(1, len(g)):
            s = np.float32(s + sq[j])
        acc = np.float32(acc + s / np.float32(len(g)))
        w = (w - (np.float32(LR) * g) / (np.sqrt(acc) + np.float32(EPS))).astype(np.float32)
        self.rows[(table, i)] = (w, acc)

    def upsert(self, table, i, v):
        _, acc = self.get(table, i)
        self.rows[(table, i)] = (v.astype(np.float32), acc)


op = st.one_of(
    st.tuples(st.just("lookup"), st.sampled_from(sorted(TABLES)), st.lists(ID, max_size=12)),
    st.tuples(st.just("apply"), st.sampled_from(sorted(TABLES)), st.lists(ID, max_size=12, unique=True),
              st.integers(0, 2**31)),
    st.tuples(st.just("step"), st.sampled_from(sorted(TABLES)), st.lists(ID, max_size=12, unique=True),
              st.integers(0, 2**31)),  # the trainer's pattern: lookup then apply on the same sorted ids
    # a whole training step: look up every table, then apply each (each table keeps its own lookup's probe),
    # optionally with an upsert of table "a" in between (which must drop "a"'s probe)
    st.tuples(st.just("steps"), st.lists(ID, max_size=12, unique=True), st.lists(ID, max_size=12, unique=True),
              st.integers(0, 2**31), st.booleans()),
    st.tuples(st.just("hot"), st.lists(ID, max_size=8, unique=True), st.lists(ID, max_size=4, unique=True)),
    st.tuples(st.just("prefetch"), st.sampled_from(sorted(TABLES)), st.lists(ID, max_size=12)),
    st.tuples(st.just("upsert"), st.sampled_from(sorted(TABLES)), st.lists(ID, max_size=6, unique=True),
              st.integers(0, 2**31)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("restore"), st.integers(0, 10)),
)


def _check(store, ref, table, ids):
    got = store.lookup(table, np.asarray(ids, dtype=np.int64)).cpu().numpy()
    for k, i in enumerate(ids):
        assert np.array_equal(got[k], ref.get(table, i)[0]), (table, i)


def _check_acc(store, ref):
    """Optimizer state: every row the reference touched, from whichever tier owns it."""
    for (table, i), (w, acc) in ref.rows.items():
        t = store.tables[table]
        slot = t.hot.find(np.array([i]))[0]
        if slot >= 0:
            got = t.hot.acc[int(slot)].item()
        else:
            recs, found, _ = cold_rows(store, t, np.array([i]), touch=False)
            assert found[0]
            got = recs["acc"][0]
        assert np.float32(got) == acc, (table, i)


# host cache off (write-through), tiny (3 rows per table: batches overflow it, every
# step evicts) and small (12 per table: some hits, bulk evictions of 1 row)
# step evicts) and small (12 per table: some hits, bulk evictions of 1 row); frequency
# admission (the default: refused rows go straight to RocksDB) and plain LRU
@pytest.mark.parametrize("cache_rows,admission", [(0, "lru"), (6, "frequency"), (24, "frequency"), (24, "lru")])
@settings(max_examples=fuzz_examples(40), deadline=None, suppress_health_check=list(HealthCheck))  # 40 in CI
@given(ops=st.lists(op, min_size=1, max_size=25))
def test_store_matches_reference(cache_rows, admission, ops):
    root = Path(tempfile.mkdtemp(prefix="store-prop-"))
    kw = dict(shards=3, seed=11, hot_capacity_rows=12, lr=LR, eps=EPS, block_cache_mb=8,
              host_cache_rows=cache_rows, cache_admission=admission)
    store = EmbeddingStore(StoreSpec(str(root / "live"), TABLES, **kw))
    ref = Reference(lambda table, i: store.init_rows(table, np.array([i]))[0])
    checkpoints: list[tuple[str, dict]] = []
    try:
        for o in ops:
            kind = o[0]
            if kind == "lookup":
                _check(store, ref, o[1], o[2])
            elif kind == "apply":
                _, table, ids, seed = o
                g = np.random.default_rng(seed).normal(0, 1, (len(ids), TABLES[table])).astype(np.float32)
                store.apply_gradients(table, np.array(ids, dtype=np.int64), torch.from_numpy(g))
                for k, i in enumerate(ids):
                    ref.apply(table, i, g[k])
            elif kind == "step":
                _, table, ids, seed = o
                a = np.array(sorted(ids), dtype=np.int64)
                _check(store, ref, table, a.tolist())
                g = np.random.default_rng(seed).normal(0, 1, (len(a), TABLES[table])).astype(np.float32)
                store.apply_gradients(table, a, torch.from_numpy(g))
                for k, i in enumerate(a.tolist()):
                    ref.apply(table, i, g[k])
            elif kind == "steps":
                _, ids_a, ids_b, seed, upsert_between = o
                step = {"a": np.array(sorted(ids_a), dtype=np.int64), "b": np.array(sorted(ids_b), dtype=np.int64)}
                for table, a in step.items():
                    _check(store, ref, table, a.tolist())
                rng = np.random.default_rng(seed)
                if upsert_between and len(step["a"]):
                    v = rng.normal(0, 1, (1, TABLES["a"])).astype(np.float32)
                    store.upsert_rows("a", step["a"][:1], v)
                    ref.upsert("a", int(step["a"][0]), v[0])
                for table, a in step.items():
                    g = rng.normal(0, 1, (len(a), TABLES[table])).astype(np.float32)
                    store.apply_gradients(table, a, torch.from_numpy(g))
                    for k, i in enumerate(a.tolist()):
                        ref.apply(table, i, g[k])
            elif kind == "hot":
                store.set_hot({"a": np.array(o[1], dtype=np.int64), "b": np.array(o[2], dtype=np.int64)})
                assert store.hot_mask("a", np.array(o[1], dtype=np.int64)).all()
            elif kind == "prefetch":
                store.prefetch(o[1], np.array(o[2], dtype=np.int64))
            elif kind == "upsert":
                _, table, ids, seed = o
                v = np.random.default_rng(seed).normal(0, 1, (len(ids), TABLES[table])).astype(np.float32)
                store.upsert_rows(table, np.array(ids, dtype=np.int64), v)
                for k, i in enumerate(ids):
                    ref.upsert(table, i, v[k])
            elif kind == "flush":
                store.flush()
            elif kind == "reopen":  # a clean close writes every dirty cached row back
                store.close()
                store = EmbeddingStore(StoreSpec(str(root / "live"), TABLES, **kw))
            elif kind == "checkpoint":
                p = str(root / f"ckpt-{len(checkpoints)}")
                store.checkpoint(p)
                checkpoints.append((p, dict(ref.rows)))
            elif kind == "restore" and checkpoints:
                p, rows = checkpoints[o[1] % len(checkpoints)]
                hot_before = None if p != checkpoints[-1][0] else None
                store.close()
                store = EmbeddingStore.restore(p, path=str(root / "live"), **{k: v for k, v in kw.items()
                                                                             if k not in ("shards", "seed")})
                ref.rows = dict(rows)
                del hot_before
            for table in TABLES:
                _check(store, ref, table, sorted({i for (t, i) in ref.rows if t == table}))
        _check_acc(store, ref)
        # export of all rows agrees with the reference too
        exported = {}
        for b in store.changed_rows(None):
            for t, i, v in zip(b.column("table").to_pylist(), b.column("id").to_pylist(),
                               b.column("vector").to_pylist()):
                exported[(t, i)] = np.array(v, dtype=np.float32)
        for key, (w, _) in ref.rows.items():
            assert np.array_equal(exported[key], w), key
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


# STREAMREC_TEST_DEVICE=cpu runs the CUDA test's logic on the CPU (scripts/gpu_check.sh --dry-run)
TEST_DEVICE = os.environ.get("STREAMREC_TEST_DEVICE", "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(TEST_DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                    reason="needs a CUDA device (hot tier on GPU); STREAMREC_TEST_DEVICE=cpu runs its logic on the CPU")
def test_cuda_hot_tier_matches_reference(tmp_path):
    store = EmbeddingStore(StoreSpec(str(tmp_path / "s"), TABLES, shards=2, hot_capacity_rows=20, lr=LR, eps=EPS,
                                     device=TEST_DEVICE))
    ref = Reference(lambda table, i: store.init_rows(table, np.array([i]))[0])
    rng = np.random.default_rng(0)
    try:
        for step in range(60):
            if step % 7 == 0:
                store.set_hot({"a": rng.choice(40, 10, replace=False), "b": rng.choice(40, 5, replace=False)})
            # the second half as the trainer's step applies them: every table's device rows in one batch
            with store.fused_hot_updates() if step >= 30 else contextlib.nullcontext():
                for table, dim in TABLES.items():
                    ids = rng.choice(40, 12, replace=False).astype(np.int64)
                    g = rng.normal(0, 1, (12, dim)).astype(np.float32)
                    store.apply_gradients(table, ids, torch.from_numpy(g).to(TEST_DEVICE))
                    for k, i in enumerate(ids):
                        ref.apply(table, int(i), g[k])
        for table in TABLES:
            _check(store, ref, table, sorted({i for (t, i) in ref.rows if t == table}))
        _check_acc(store, ref)
    finally:
        store.close()
