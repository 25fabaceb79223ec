"""How long the join's state takes to restore (``JoinState.restore``: the due-time heaps rebuilt from the
stored rows), without a broker: what a restarted worker spends per partition before it joins again.

:func:`measure_restore` joins ``n`` impressions (``fake_negative``, a window that holds them all, one
partition) into a :class:`~streamrec.joiner.txstore.TxStore` over a RocksDB database opened with faust's
options, committed and persisted per batch of 2,000 as the worker does, reopens the database and times a
fresh ``JoinState`` over it (the heaps and row count checked against the live state's).
``python -m benchmarks.join_restore N`` prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def _table(db):
    return SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _p: db))


def measure_restore(n: int, repeats: int = 3) -> dict:
    """``restore_s`` (the fastest of ``repeats`` restores of ``n`` impressions of state) and ``rows``."""
    from faust.stores.rocksdb import RocksDBOptions

    from streamrec.app.config import load_config
    from streamrec.joiner import DelayedStream, JoinRules, JoinState
    from streamrec.joiner.tx_row import BatchTx
    from streamrec.joiner.txstore import TxStore

    cfg = load_config(None, {"join.mode": "fake_negative", "join.window_s": 36_000.0,
                             "generator.events_per_s": 50.0}, env={})
    imps, _, _ = DelayedStream(cfg.model, cfg.generator, seed=13).generate(n)
    rules = JoinRules.from_config(cfg.join)
    root = Path(tempfile.mkdtemp(prefix="join-restore-"))
    try:
        db = RocksDBOptions(use_rocksdict=True).open(root / "db")
        store = TxStore(_table(db), 0, "impressions")
        live = JoinState(rules, store)
        for i, ev in enumerate(imps, 1):
            live.impression(ev["request_id"], ev["ts"], ev)
            if i % 2000 == 0 or i == len(imps):
                store.commit(BatchTx(seq=i, off={}, ends={}))
                store.persist(store.take_outbox())
        db.close()
        db = RocksDBOptions(use_rocksdict=True).open(root / "db")
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            restored = JoinState(rules, TxStore(_table(db), 0, "impressions"))
            times.append(time.perf_counter() - t0)
            if (sorted(restored._closing), restored.stats.rows) != (sorted(live._closing), live.stats.rows):
                raise RuntimeError("the restored state differs from the live one")
        db.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"restore_s": min(times), "restore_s_all": times, "rows": live.stats.rows}


if __name__ == "__main__":
    import sys

    print(json.dumps(measure_restore(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)))
