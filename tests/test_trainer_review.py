"""Adversarial review of the trainer: each test reproduced a defect before its fix."""

from __future__ import annotations

import numpy as np
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.ingest import EventProducer, SyntheticStream, make_producer
from tests.conftest import small_config
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.service import TrainerService, open_store


def _stream_cfg(cfg, tmp_path):
    t = cfg.trainer
    t.batch_size, t.window_batches, t.device = 256, 4, "cpu"
    t.checkpoint_every_events, t.checkpoint_every_s = 10**9, 600.0  # only the final checkpoint
    t.hot_source, t.snapshot_every, t.idle_exit_s, t.log_every_s = "none", 0, 1.5, 600.0
    cfg.kafka.consumer_mode, cfg.kafka.events_per_message = "assign", 256
    return cfg


def _produce(cfg, bootstrap, n, bad=0):
    prod = EventProducer(bootstrap, cfg)
    for b in SyntheticStream(cfg).batches(n):
        prod.send_batch(b)
    for _ in range(bad):
        prod.send_raw(b"\x00not an event")
    prod.close()


def test_resume_uses_the_configured_hot_budget_not_the_checkpoints(tmp_path):
    """Raising hot.budget_rows and restarting used to keep the checkpoint's smaller hot tier, so the
    first hot set of the new size raised StoreError in the loop: a crash at every restart."""
    cfg = small_config(tmp_path, **{"hot.budget_rows": 10})
    store = EmbeddingStore.from_config(cfg, "cpu")
    store.set_hot({"user": np.arange(10)})
    ckpt = tmp_path / "ckpt-000000001"
    store.checkpoint(str(ckpt / "store"))
    store.close()
    cfg.hot.budget_rows = 50
    store = open_store(cfg, torch.device("cpu"), ckpt)
    try:
        core = TrainerCore(cfg, store, torch.device("cpu"))
        core.apply_hot_set(2, {"user": np.arange(30), "item": np.arange(20)})
        assert store.stats()["hot_rows"] == 50 and core.hot_rows == 50
    finally:
        store.close()


def test_a_hot_set_bigger_than_the_budget_is_cut_to_fit_instead_of_crashing(topics, tmp_path, bootstrap):
    """A hot-set message over the trainer's budget (the sketch ran with a bigger one, or the budget was
    lowered and the compacted topic still holds the old set) raised StoreError out of the loop, and
    again at every restart, since the follower re-reads the same message."""
    from streamrec.sketch import HotSet

    cfg = _stream_cfg(topics, tmp_path)
    cfg.trainer.hot_source, cfg.hot.budget_rows = "topic", 40
    hs = HotSet(version=3, tables={"user": np.arange(60), "item": np.arange(40), "unknown": np.arange(9)},
                coverage=0.5, hit_rate=0.5)
    p = make_producer(bootstrap)
    p.send(cfg.kafka.hotset_topic, hs.to_bytes(), key=b"hot-set")
    p.flush(30)
    p.close()
    _produce(cfg, bootstrap, 2048)
    svc = TrainerService(cfg, bootstrap, progress=False)
    assert svc.hot.follower.wait_for(3, timeout=20) is not None
    summary = svc.run()
    assert summary["events"] == 2048
    assert svc.core.hot_version == 3 and svc.core.hot_rows == 40 and svc.last_record["hot_rows"] == 40


def test_dead_letter_and_expired_row_counts_survive_a_resume(topics, tmp_path, bootstrap):
    """Both went into the metrics log as totals but restarted from 0 after every resume (dead_letters
    was even written into the checkpoint, never read back)."""
    cfg = _stream_cfg(topics, tmp_path)
    cfg.store.expire_after_s = 0.001  # the final checkpoint's sweep expires the untouched cold rows
    _produce(cfg, bootstrap, 1024, bad=3)
    first = TrainerService(cfg, bootstrap, progress=False)
    summary = first.run()
    assert summary["dead_letters"] == 3 and first.rows_expired > 0
    second = TrainerService(cfg, bootstrap, progress=False)
    try:
        rec = second.emit()
        assert second.resumed_from and rec["dead_letters"] == 3 and rec["rows_expired"] == first.rows_expired
    finally:
        second.close()


def test_dead_letters_reach_the_dlq_before_a_checkpoint_moves_past_them(topics, tmp_path, bootstrap):
    """The dead-letter producer was flushed only when offsets were committed, after the checkpoint was
    written: a trainer dying in between resumed past records whose dead letters were still in its buffer."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import tomli_w

    from streamrec.ingest import read_topic
    from streamrec.trainer.checkpoint import latest_checkpoint, read_checkpoint

    cfg = _stream_cfg(topics, tmp_path)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(tomli_w.dumps(cfg.to_dict()))
    _produce(cfg, bootstrap, 512, bad=3)
    # the trainer dies right after its checkpoint is renamed into place (before the offsets commit);
    # a long linger keeps the dead letters in the producer's buffer until somebody flushes it
    script = (
        "import os, sys\n"
        "from streamrec.ingest import make_producer\n"
        "from streamrec.foundation import load_config\n"
        "from streamrec.trainer import TrainerService\n"
        "svc = TrainerService(load_config(sys.argv[1], env={}), sys.argv[2], progress=False)\n"
        "svc.consumer._dlq.close()\n"
        "svc.consumer._dlq = make_producer(sys.argv[2], linger_ms=600_000, delivery_timeout_ms=700_000)\n"
        "svc.consumer.mark_durable = lambda offsets: os._exit(9)\n"
        "svc.run()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", script, str(cfg_path), bootstrap], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr[-3000:]
    state, _ = read_checkpoint(latest_checkpoint(cfg.trainer.checkpoint_dir))
    assert state["dead_letters"] == 3  # the checkpoint is past the bad records: a resume never reads them again
    assert len(read_topic(bootstrap, cfg.kafka.dlq_topic, expected=3, timeout=5)) == 3
