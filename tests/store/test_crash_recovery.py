"""Crash recovery: a child process writing to the store is SIGKILLed, mid-write or between the shard
writes of one multi-shard batch, and even during the roll-back that repairs such a torn write.

Host cache off: the live directory reopens at a prefix of acknowledged writes (a torn write is
rolled back). Host cache on (write-back): the last checkpoint is the consistent point; the live
directory holds every row untorn, at some acknowledged value no older than it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from streamrec.embedding_store import EmbeddingStore, StoreSpec

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]

ROWS = np.arange(0, 400, dtype=np.int64)  # spread over every shard
DIM = 8


def _vectors(k: int) -> np.ndarray:
    """Batch k sets every row to a value that encodes k (so a mix of batches is visible)."""
    return (np.float32(k) + ROWS[:, None].astype(np.float32) / np.float32(1000)
            + np.zeros((1, DIM), np.float32)).astype(np.float32)


CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from tests.store.test_crash_recovery import ROWS, DIM, _vectors
    from streamrec.embedding_store import EmbeddingStore, StoreSpec
    s = EmbeddingStore(StoreSpec({path!r}, {{"t": DIM}}, shards=4, host_cache_rows={cache}))
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
    code = CHILD.format(root=str(ROOT), path=str(path), crash_at=crash_at, cache=cache,
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
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": DIM}, shards=4)) as s:
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
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": DIM}, shards=4, host_cache_rows=100)) as live:
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
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": DIM}, shards=4)) as s:
        assert _batch_of(s) == 6  # batch 7 reached one shard only: rolled back
        s.upsert_rows("t", ROWS, _vectors(8))
    with EmbeddingStore(StoreSpec(str(tmp_path / "s"), {"t": DIM}, shards=4)) as s:
        assert _batch_of(s) == 8


RECOVERY_DIM = 4


def _recovery_vec(k: int) -> np.ndarray:
    return np.full((len(ROWS), RECOVERY_DIM), k, np.float32) + ROWS[:, None].astype(np.float32) / 1000


def _recovery_batch_of(store) -> int:
    got = store.peek("t", ROWS).numpy()
    ks = sorted(set(np.floor(got[:, 0]).astype(int).tolist()))
    assert len(ks) == 1, f"torn state: rows hold batches {ks}"
    return ks[0]


# Dies (SIGKILL) right after recovery's first shard write: recovery interrupted half-way.
KILL_IN_RECOVERY = textwrap.dedent("""
    import os, signal, types
    import rocksdict
    import streamrec.embedding_store.cold as cold
    from streamrec.embedding_store import EmbeddingStore, StoreSpec

    class DieAfterWrite:
        def __init__(self, *a, **k):
            self._db = rocksdict.Rdict(*a, **k)
        def write(self, wb, opt):
            self._db.write(wb, opt)
            os.kill(os.getpid(), signal.SIGKILL)
        def __getitem__(self, k):
            return self._db[k]
        def __getattr__(self, name):
            return getattr(self._db, name)

    proxy = types.SimpleNamespace(**{{n: getattr(rocksdict, n) for n in dir(rocksdict) if not n.startswith("__")}})
    proxy.Rdict = DieAfterWrite
    cold.rd = proxy
    EmbeddingStore(StoreSpec({path!r}, {{"t": {dim}}}, shards=4))
    print("recovery finished without writing", flush=True)
""")


def test_recovery_killed_half_way_still_rolls_back_the_torn_write(tmp_path):
    """A kill during open's roll-back of a torn write (after one shard is rolled back) leaves a store
    whose next open still rolls back the other shards: the write's shard set must not be taken from
    the already rolled-back (emptied) shard, which would show nothing torn and keep half the write."""
    path = str(tmp_path / "s")
    with EmbeddingStore(StoreSpec(path, {"t": RECOVERY_DIM}, shards=4)) as s:
        s.upsert_rows("t", ROWS, _recovery_vec(1))
        n = {"writes": 0}

        def tear(i):
            n["writes"] += 1
            if n["writes"] == 2:
                raise KeyboardInterrupt  # stands in for a kill: shards after the 2nd keep batch 1

        s.cold._after_shard_write = tear
        with pytest.raises(KeyboardInterrupt):
            s.upsert_rows("t", ROWS, _recovery_vec(2))
        s.cold._after_shard_write = None
        s.cold.close()  # no clean close: nothing may be written back
        s._closed = True
    child = subprocess.run([sys.executable, "-c", KILL_IN_RECOVERY.format(path=path, dim=RECOVERY_DIM)],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    with EmbeddingStore(StoreSpec(path, {"t": RECOVERY_DIM}, shards=4)) as s:
        assert _recovery_batch_of(s) == 1
        s.upsert_rows("t", ROWS, _recovery_vec(3))
    with EmbeddingStore(StoreSpec(path, {"t": RECOVERY_DIM}, shards=4)) as s:
        assert _recovery_batch_of(s) == 3
