"""Durability: SIGKILL of a writing child process, torn multi-shard writes, checkpoints.

Host cache off: the live directory reopens at a prefix of acknowledged writes.
Host cache on (write-back): the last checkpoint is the consistent point; the live
directory holds every row untorn, at some acknowledged value no older than it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore

ROWS = np.arange(0, 400, dtype=np.int64)  # spread over every shard
DIM = 8


def _vectors(k: int) -> np.ndarray:
    """Batch k sets every row to a value that encodes k (so a mix of batches is visible)."""
    return (np.float32(k) + ROWS[:, None].astype(np.float32) / np.float32(1000)
            + np.zeros((1, DIM), np.float32)).astype(np.float32)


CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_store_durability import ROWS, DIM, _vectors
    from streamrec.embedding_store import EmbeddingStore
    s = EmbeddingStore({path!r}, {{"t": DIM}}, shards=4, host_cache_rows={cache})
    crash_at = {crash_at}
    if crash_at:
        # die between shard writes of batch `crash_at`: a torn multi-shard write
        state = {{"n": 0}}
        def hook(i):
            state["n"] += 1
            if s.cold.seq == crash_at and state["n"] >= 1:
                os.kill(os.getpid(), signal.SIGKILL)
        s.cold._after_shard_write = hook
    for k in range(1, 100000):
        s.upsert_rows("t", ROWS, _vectors(k))
        if {ckpt_every} and k % {ckpt_every} == 0:
            s.checkpoint({path!r} + f"-ckpt-{{k}}")
            print("ckpt", k, flush=True)
        print(k, flush=True)
""")


def _run_child(path, crash_at=0, cache=0, ckpt_every=0):
    code = CHILD.format(tests=os.path.dirname(__file__), path=str(path), crash_at=crash_at, cache=cache,
                        ckpt_every=ckpt_every)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _batch_of(store) -> int:
    got = store.peek("t", ROWS).numpy()
    ks = np.floor(got[:, 0]).astype(np.int64)
    assert len(set(ks.tolist())) == 1, f"torn state: rows hold batches {sorted(set(ks.tolist()))}"
    assert np.array_equal(got, _vectors(int(ks[0]))), "a row is torn"
    return int(ks[0])


def test_sigkill_mid_write_reopens_to_a_prefix(tmp_path):
    child = _run_child(tmp_path / "s")
    acked = 0
    deadline = time.monotonic() + 60
    try:
        for line in child.stdout:
            acked = int(line)
            if acked >= 40 or time.monotonic() > deadline:
                break
        time.sleep(0.05)  # kill somewhere inside a later write
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read().split()
        if rest:
            acked = int(rest[-1])
    finally:
        child.kill()
        child.wait(10)
    assert acked >= 40, "child never got going"
    with EmbeddingStore(str(tmp_path / "s"), {"t": DIM}, shards=4) as s:
        k = _batch_of(s)
        assert acked <= k <= acked + 1, (acked, k)


def test_sigkill_with_write_back_cache_restores_last_checkpoint(tmp_path):
    """Cache of 100 rows, batches of 400: every batch evicts and writes back (no undo
    records); the checkpoint flushes the rest. Kill, then: the last acknowledged
    checkpoint restores exactly, and the live directory has no torn row."""
    child = _run_child(tmp_path / "s", cache=100, ckpt_every=5)
    acked, ckpt = 0, 0
    deadline = time.monotonic() + 60
    try:
        for line in child.stdout:
            parts = line.split()
            if parts[0] == "ckpt":
                ckpt = int(parts[1])
            else:
                acked = int(parts[0])
            if ckpt >= 20 or time.monotonic() > deadline:
                break
        time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        for line in child.stdout.read().splitlines():
            parts = line.split()
            if parts[0] == "ckpt":
                ckpt = int(parts[1])
            else:
                acked = int(parts[0])
    finally:
        child.kill()
        child.wait(10)
    assert ckpt >= 20, "child never got going"
    with EmbeddingStore(str(tmp_path / "s"), {"t": DIM}, shards=4, host_cache_rows=100) as live:
        got = live.peek("t", ROWS).numpy()
        ks = np.floor(got[:, 0]).astype(np.int64)
        assert ks.min() >= ckpt and ks.max() <= acked + 1, (ckpt, acked, sorted(set(ks.tolist())))
        for k in set(ks.tolist()):  # each row whole: exactly the value of one batch
            sel = ks == k
            assert np.array_equal(got[sel], _vectors(k)[sel]), f"a row of batch {k} is torn"
    with EmbeddingStore.restore(str(tmp_path / "s") + f"-ckpt-{ckpt}", path=str(tmp_path / "r"),
                                host_cache_rows=100) as r:
        assert _batch_of(r) == ckpt


def test_torn_multishard_write_rolls_back(tmp_path):
    child = _run_child(tmp_path / "s", crash_at=7)
    out = child.communicate(timeout=60)[0].split()
    assert child.returncode == -signal.SIGKILL
    assert int(out[-1]) == 6
    with EmbeddingStore(str(tmp_path / "s"), {"t": DIM}, shards=4) as s:
        assert _batch_of(s) == 6  # batch 7 reached one shard only: rolled back
        s.upsert_rows("t", ROWS, _vectors(8))
    with EmbeddingStore(str(tmp_path / "s"), {"t": DIM}, shards=4) as s:
        assert _batch_of(s) == 8


def test_checkpoint_restore_and_delta_export(tmp_path):
    ids = np.arange(50, dtype=np.int64)
    with EmbeddingStore(str(tmp_path / "live"), {"a": 4}, shards=2, hot_capacity_rows=10) as s:
        s.set_hot({"a": ids[:10]})
        s.apply_gradients("a", ids, torch.ones(50, 4))
        e1 = s.checkpoint(str(tmp_path / "c1"))
        at_c1 = s.lookup("a", ids).clone()
        s.apply_gradients("a", np.array([3, 30]), torch.ones(2, 4))  # one hot row, one cold row
        changed = {}
        for b in s.changed_rows(e1):
            changed.update(zip(b.column("id").to_pylist(), b.column("vector").to_pylist()))
        assert sorted(changed) == [3, 30]
        assert np.allclose(changed[30], s.lookup("a", np.array([30])).numpy()[0])
        e2 = s.checkpoint(str(tmp_path / "c2"))
        assert e2 == e1 + 1
        assert list(s.changed_rows(e2)) == []
        with pytest.raises(ValueError, match="not empty"):
            s.checkpoint(str(tmp_path / "c1"))
    r = EmbeddingStore.restore(str(tmp_path / "c1"), path=str(tmp_path / "live2"))
    with r:
        assert torch.equal(r.lookup("a", ids), at_c1)
        assert r.hot_mask("a", ids).sum() == 10


def test_expire_and_read_only_peek(tmp_path):
    with EmbeddingStore(str(tmp_path / "s"), {"a": 4}, shards=2, hot_capacity_rows=4) as s:
        s.apply_gradients("a", np.arange(20), torch.zeros(20, 4))  # rows are stored by their first write
        s.set_hot({"a": np.arange(4)})
        time.sleep(0.05)
        s.apply_gradients("a", np.array([10, 11]), torch.ones(2, 4))
        fresh = s.lookup("a", np.array([10, 11])).clone()
        n = s.expire(0.03)
        assert n == 14  # 20 rows - 4 hot - 2 recently touched
        assert torch.equal(s.lookup("a", np.array([10, 11])), fresh)
        s.upsert_rows("a", np.array([99]), np.full((1, 4), 2.0, np.float32))
    with EmbeddingStore(str(tmp_path / "s"), {"a": 4}, shards=2, read_only=True) as ro:
        assert torch.equal(ro.peek("a", np.array([99])), torch.full((1, 4), 2.0))
        assert torch.equal(ro.peek("a", np.array([5])), torch.from_numpy(ro.init_rows("a", np.array([5]))))
        with pytest.raises(ValueError, match="read-only"):
            ro.apply_gradients("a", np.array([1]), torch.ones(1, 4))
