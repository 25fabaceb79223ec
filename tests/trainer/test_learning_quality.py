"""Learning quality without Kafka: parity with an independent plain-PyTorch DLRM, FAE against the
hot tier off, progressive validation that cannot peek, mini-batches that do not depend on how
events were delivered, and per-table initial rows that every process agrees on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streamrec.app.wiring import trainer_settings
from streamrec.model.references import PlainDLRM, auc as plain_auc, mini_batches, progressive
from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, JaggedIds, hot_budget, roc_auc
from streamrec.ingest import SyntheticStream
from streamrec.trainer.checkpoint import write_checkpoint
from streamrec.trainer.core import TrainerCore
from streamrec.trainer.hotset import SampleHotSource
from streamrec.trainer.reshard import reshard_into
from streamrec.trainer.sharding import owner_of

from ..conftest import small_config

BS = 256


def _stream(tmp_path, n, **over):
    cfg = small_config(tmp_path, **{"trainer.batch_size": BS, "hot.budget_rows": 10_000, **over})
    s = SyntheticStream(cfg)
    allb = EventBatch.concat(list(s.batches(n)), cfg.model.dense_dim, cfg.model.field_names)
    return cfg, s, allb


def _with_expected_ids(cfg, allb):
    """The fields' expected_ids set to the ids the stream holds (the init rule both models use)."""
    for f in cfg.model.fields:
        f.expected_ids = int(len(np.unique(allb.sparse[f.name].values)))
    return cfg


def _train(cfg, allb, chunks, hot=None, path=None):
    """Feed ``allb`` in the given chunk sizes (cycled), then flush; returns the core (store closed)."""
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=path)
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    if hot is not None:
        core.apply_hot_set(1, hot)
    s, i = 0, 0
    while s < len(allb):
        n = chunks[i % len(chunks)]
        core.feed(allb.take(np.arange(s, min(len(allb), s + n))))
        s, i = s + n, i + 1
    core.flush()
    store.close()
    return core


def _plain(cfg, allb, seed=0) -> tuple[float, float]:
    vocab = {f: allb.sparse[f].values for f in cfg.model.field_names}
    m = cfg.model
    ref = PlainDLRM(vocab, m.dense_dim, m.embedding_dim, m.bottom_mlp, m.top_mlp, cfg.trainer.dense_lr,
                    cfg.store.adagrad_lr, cfg.store.adagrad_eps, seed=seed)
    y, p = progressive(ref, mini_batches(allb, BS, cfg.model.field_names))
    return plain_auc(y, p), len(y)


SEEDS = (0, 1, 2)  # one model seed moves a 61k-event progressive AUC by about +-0.007: compare means over seeds


@pytest.mark.e2e  # nine 61k-event training runs (a minute or two): out of the fast loop
@pytest.mark.timeout(1200)
def test_progressive_auc_matches_the_independent_reference_and_nears_bayes(tmp_path):
    n = 61_440
    ours, ref, last = [], [], []
    for seed in SEEDS:
        cfg, s, allb = _stream(tmp_path / str(seed), n, **{"trainer.schedule": "arrival", "model.seed": seed,
                                                           "trainer.metrics_window": 20_000})
        cfg = _with_expected_ids(cfg, allb)
        core = _train(cfg, allb, [2048])
        ref_auc, ref_n = _plain(cfg, allb, seed)
        assert core.metrics.count == ref_n == n
        ours.append(core.metrics.auc)
        ref.append(ref_auc)
        last.append(core.metrics.window_auc())
    assert abs(np.mean(ours) - np.mean(ref)) <= 0.002, (ours, ref)
    bayes = s.bayes_auc(n)
    # one pass over 61k events of a dim-8 model: the last 20k events' progressive AUC is ~0.075 below Bayes
    assert bayes - np.mean(last) <= 0.08, (last, bayes)


@pytest.mark.e2e  # six 61k-event training runs: out of the fast loop
@pytest.mark.timeout(1200)
def test_fae_costs_no_auc_against_the_hot_tier_off(tmp_path):
    """FAE's hot/cold batches against arrival-order batches on the same stream, mean over model seeds.

    Measured here (2026-11-25, 63% of events in hot batches): -0.0049, -0.0001, -0.0020 (mean -0.0023), the same
    batches as the old rule's (``trainer.hot_wait_batches`` >= window_batches): at this hot share FAE's gate is
    always open and every hot batch fills in time. Moving
    arrival order's batch boundaries by a few events alone moves this AUC by -0.0026..+0.0013, so this stream
    cannot show the issue's 0.001 goal (``streamrec bench quality`` does, on two 100k-event streams); the bound
    asserted is what it can show (a systematic FAE loss beyond 0.003 fails it)."""
    n = 61_440
    d = []
    for seed in SEEDS:
        cfg, _s, allb = _stream(tmp_path / str(seed), n, **{"model.seed": seed})
        src = SampleHotSource(cfg.model.field_names, budget=1000, sample_events=20_000)
        src.observe(allb.take(np.arange(20_000)))
        hot = src.poll().tables
        plain = _train(cfg, allb, [2048], path=str(tmp_path / str(seed) / "plain"))
        fae = _train(cfg, allb, [2048], hot=hot, path=str(tmp_path / str(seed) / "fae"))
        assert 0.2 < fae.hot_events / fae.events < 0.95  # FAE really split the stream
        assert fae.metrics.count == plain.metrics.count == n
        d.append(fae.metrics.auc - plain.metrics.auc)
    assert abs(np.mean(d)) <= 0.003, d


def _pairs(cfg, k: int, seed: int = 0) -> EventBatch:
    """Pairs of events sharing a fresh user id and a random label: a cold event (a fresh tag) then a hot one
    (no tag), both with the one hot item. A model trained on the second before scoring the first has peeked."""
    rng = np.random.default_rng(seed)
    n = 2 * k
    users = np.repeat(10_000 + np.arange(k), 2).astype(np.int64)
    labels = np.repeat(rng.integers(0, 2, k), 2).astype(np.float32)
    one = np.arange(n + 1, dtype=np.int64)
    tag_len = (np.arange(n) % 2 == 0).astype(np.int64)  # the first of a pair has one fresh (cold) tag
    tag_off = np.concatenate([[0], np.cumsum(tag_len)]).astype(np.int64)
    sparse = {"user": JaggedIds(users, one), "item": JaggedIds(np.full(n, 7, np.int64), one),
              "tags": JaggedIds(1_000_000 + np.arange(k, dtype=np.int64), tag_off)}
    return EventBatch(np.arange(n, dtype=np.int64), labels, np.zeros((n, cfg.model.dense_dim), np.float32), sparse)


def test_an_event_is_never_scored_by_a_model_trained_on_a_later_event(tmp_path):
    cfg = small_config(tmp_path, **{"trainer.batch_size": 64, "trainer.window_batches": 8, "store.adagrad_lr": 0.3,
                                    "hot.budget_rows": 10_000})
    k = 3008
    batch = _pairs(cfg, k)
    hot = {"user": np.unique(batch.sparse["user"].values), "item": np.array([7])}
    core = _train(cfg, batch, [1000], hot=hot, path=str(tmp_path / "honest"))
    # every second event trained in a hot batch, ahead of waiting cold ones (but the first two: FAE's gate
    # lets a hot event queue once the hot rate so far fills a batch in time)
    assert k - 4 <= core.hot_events < k
    first = np.arange(0, 2 * k, 2)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path / "probe"))
    probe = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    probe.apply_hot_set(1, hot)
    res = probe.train_window(batch)
    store.close()
    late = first[first >= k]  # once the model has learnt what a user's row says
    honest = roc_auc(batch.labels[late], res.scores[late, 0])
    assert abs(honest - 0.5) < 0.05, honest
    # the signal is there to be caught: a model that trains each pair's second event before scoring the first
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path / "cheat"))
    cheat = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    # per 64 pairs: a mini-batch of their second events, then one of their first events
    peek = np.concatenate([np.r_[first[i:i + 64] + 1, first[i:i + 64]] for i in range(0, k, 64)])
    res = cheat.train_window(batch.take(peek))
    store.close()
    scores = np.empty(2 * k, np.float32)
    scores[peek] = res.scores[:, 0]
    peeked = roc_auc(batch.labels[late], scores[late])
    assert peeked > 0.6, peeked


def test_batches_do_not_depend_on_how_events_were_delivered(tmp_path):
    cfg, _s, allb = _stream(tmp_path, 20_000)
    src = SampleHotSource(cfg.model.field_names, budget=500, sample_events=10_000)
    src.observe(allb.take(np.arange(10_000)))
    hot = src.poll().tables
    a = _train(cfg, allb, [2048], hot=hot, path=str(tmp_path / "a"))
    b = _train(cfg, allb, [1, 4, 511, 3000, 77], hot=hot, path=str(tmp_path / "b"))
    assert a.metrics.count == b.metrics.count == len(allb)
    assert abs(a.metrics.auc - b.metrics.auc) <= 1e-6 and abs(a.metrics.logloss - b.metrics.logloss) <= 1e-6
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_initial_rows_follow_the_table_size_and_survive_restart_and_resharding(tmp_path):
    cfg = small_config(tmp_path)
    cfg.model.fields[0].expected_ids = 10_000  # user: sqrt(1/10000) = 0.01
    cfg.model.fields[1].init_scale = 0.2  # item: explicit
    ids = np.arange(5000, 5400, dtype=np.int64)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu", path=str(tmp_path / "live"))
    first = {f: store.lookup(f, ids).numpy().copy() for f in cfg.model.field_names}
    assert math.isclose(np.abs(first["user"]).max(), 0.01, rel_tol=0.01)
    assert math.isclose(np.abs(first["item"]).max(), 0.2, rel_tol=0.01)
    assert math.isclose(np.abs(first["tags"]).max(), cfg.store.init_scale, rel_tol=0.01)
    touched = np.arange(100, dtype=np.int64)
    for f in cfg.model.field_names:
        store.lookup(f, touched)
        store.apply_gradients(f, touched, torch.ones(len(touched), cfg.model.embedding_dim))
    ckpt = write_checkpoint(tmp_path / "ckpt", 1, {}, {}, lambda d: {"epoch": store.checkpoint(d)})
    store.close()
    s = cfg.store
    restored = EmbeddingStore.restore(str(ckpt / "store"), path=str(tmp_path / "restored"),
                                      init_scale=cfg.model.init_scales(s.init_scale), shards=s.shards)
    for f in cfg.model.field_names:
        assert np.array_equal(restored.lookup(f, ids).numpy(), first[f]), f
    restored.close()
    for rank in range(3):  # a group of 3 ranks resharded from it: each owner draws the same rows
        st = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model),
                                          "cpu", path=str(tmp_path / f"rank-{rank}"))
        reshard_into(st, [ckpt], rank, 3)
        for f in cfg.model.field_names:
            mine = owner_of(f, ids, 3) == rank
            assert np.array_equal(st.lookup(f, ids[mine]).numpy(), first[f][mine]), (rank, f)
        st.close()


def test_the_same_stream_read_with_other_fetch_sizes_trains_the_same_model(tmp_path, bootstrap, monkeypatch):
    """Through the broker: one partition, the same events read in polls of ~2048 and of 1..300 events
    (the consumer's poll cut short at random sizes) give the same AUC to 1e-6."""
    import uuid

    from streamrec.ingest import EventConsumer, EventProducer, EventSchema, ensure_topics, pipeline_topics
    from streamrec.trainer.service import TrainerService
    from tests.helpers.trainer import stream_cfg

    cfg = stream_cfg(small_config(tmp_path), tmp_path)
    cfg.kafka.events_topic, cfg.kafka.partitions = f"events-{uuid.uuid4().hex[:8]}", 1
    cfg.kafka.dlq_topic, cfg.kafka.events_per_message = cfg.kafka.events_topic + ".dlq", 100
    cfg.trainer.until_end, cfg.trainer.idle_exit_s = True, 30.0
    ensure_topics(bootstrap, pipeline_topics(cfg.kafka, cfg.trainer.ranks))
    prod = EventProducer(bootstrap, cfg.kafka, EventSchema.from_sections(cfg.model, cfg.ingest))
    for b in SyntheticStream(cfg).batches(6_000):
        prod.send_batch(b)
    prod.close()
    real = EventConsumer.poll_batch
    sizes = np.random.default_rng(1).integers(1, 300, 10_000)
    calls = iter(range(10**9))
    out = []
    for run, cut in (("a", False), ("b", True)):
        cfg.store.path, cfg.trainer.checkpoint_dir = str(tmp_path / run / "store"), str(tmp_path / run / "ckpt")
        cfg.kafka.trainer_group = f"trainer-{uuid.uuid4().hex[:8]}"  # no commits of the other run

        def poll(self, max_events, timeout=1.0, cut=cut):
            return real(self, int(sizes[next(calls)]) if cut else max_events, timeout)

        monkeypatch.setattr(EventConsumer, "poll_batch", poll)
        out.append(TrainerService(trainer_settings(cfg), bootstrap, progress=False).run())
    a, b = out
    assert a["events"] == b["events"] == a["events_scored"] == 6_000, out
    assert abs(a["auc"] - b["auc"]) <= 1e-6 and abs(a["logloss"] - b["logloss"]) <= 1e-6, out
