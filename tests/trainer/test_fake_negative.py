"""The trainer side of delayed feedback (``join.mode = fake_negative``): the fake-negative weighted loss
(Ktena et al. 2019) on the gradients, its calibration against the naive loss on a generated fake-negative
stream, and progressive validation that scores each impression once, against its final label, with the
score its fake negative got (in process, real RocksDB store)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from streamrec.embedding_store import EmbeddingStore
from streamrec.foundation import EventBatch, EventSchema, hot_budget
from streamrec.foundation.events import FEEDBACK_CODES
from streamrec.ingest import SyntheticStream
from streamrec.model import build_model
from streamrec.trainer import TrainerCore
from streamrec.trainer.delayed_metrics import DelayedLabels
from streamrec.trainer.step import train_step
from tests.conftest import small_config

FN, POS, NEG = FEEDBACK_CODES["fake_negative"], FEEDBACK_CODES["positive"], FEEDBACK_CODES["negative"]


def _one_event(cfg, label: float, feedback: int | None) -> EventBatch:
    b = next(iter(SyntheticStream(cfg).batches(1)))
    b.labels = np.array([label], np.float32)
    b.feedback = None if feedback is None else np.array([feedback], np.int8)
    return b


def _grads(cfg, batch, fake_negative: bool):
    """The dense and row gradients of one step on ``batch`` (a fixed model, rows from a fixed table), and the
    step's probability: the optimizer's learning rate is 0, so ``p.grad`` is left as the step made it."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    gen = torch.Generator().manual_seed(1)
    table = {}
    rows = {}

    def lookup(tb, ids):
        for i in ids.tolist():
            if (tb, i) not in table:
                table[(tb, i)] = torch.randn(cfg.model.embedding_dim, generator=gen)
        return torch.stack([table[(tb, i)] for i in ids.tolist()])

    def apply(tb, ids, g):
        rows[tb] = g.clone()

    p = train_step(model, opt, batch, cfg.model, lookup, apply, torch.device("cpu"), fake_negative=fake_negative)
    dense = torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None])
    return dense, rows, float(p[0, 0])


@pytest.mark.parametrize("label,kind", [(1.0, POS), (0.0, FN)])
def test_the_weights_scale_the_gradient_by_the_detached_probability(tmp_path, label, kind):
    """A positive's gradient is (1 + f) times the plain one's, a fake negative's (1 - f)(1 + f) times, with f the
    model's probability: the weight is a constant of the step (a weight with a gradient of its own would add
    a term of another direction). Without correction (or without a kind) the weight is 1."""
    cfg = small_config(tmp_path, **{"join.mode": "fake_negative"})
    plain, plain_rows, f = _grads(cfg, _one_event(cfg, label, None), True)
    got, got_rows, f2 = _grads(cfg, _one_event(cfg, label, kind), True)
    naive, _, _ = _grads(cfg, _one_event(cfg, label, kind), False)
    window_neg, _, _ = _grads(cfg, _one_event(cfg, label, NEG), True)
    assert f == f2 and 0.02 < f < 0.98
    w = (1 + f) if kind == POS else (1 - f) * (1 + f)
    assert plain.abs().max() > 0
    torch.testing.assert_close(got, w * plain, rtol=1e-5, atol=1e-9)
    for tb, g in plain_rows.items():
        torch.testing.assert_close(got_rows[tb], w * g, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(naive, plain, rtol=0, atol=0)
    torch.testing.assert_close(window_neg, plain, rtol=0, atol=0)


def _fake_negative_stream(cfg, n: int, seed: int = 5):
    """``n`` impressions of the synthetic stream (true labels), as the joiner writes them in fake_negative mode:
    each impression at once as a fake negative (label 0), and each clicked one again as a positive some
    hundreds of events later (same request_id and ts). Returns the stream and the impressions' truth."""
    imp = EventBatch.concat(list(SyntheticStream(cfg).batches(n)), cfg.model.dense_dim, cfg.model.field_names)
    truth = imp.labels.copy()
    rng = np.random.default_rng(seed)
    rids = [f"r{i}" for i in range(n)]
    # the order of the output stream: impression i at position i; its positive at i + delay (delays heavy-tailed)
    delay = np.minimum(rng.pareto(1.5, n) * 100, 1500) + 0.5
    keys = np.concatenate([np.arange(n, dtype=np.float64), (np.arange(n) + delay)[truth == 1]])
    src = np.concatenate([np.arange(n), np.flatnonzero(truth == 1)])
    kind = np.concatenate([np.full(n, FN, np.int8), np.full(int((truth == 1).sum()), POS, np.int8)])
    order = np.argsort(keys, kind="stable")
    out = imp.take(src[order])
    out.labels = np.where(kind[order] == POS, 1.0, 0.0).astype(np.float32)
    out.request_ids = [rids[i] for i in src[order]]
    out.feedback = kind[order]
    return out, imp, truth


def _train(cfg, stream):
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    scores = [core.feed(stream.take(np.arange(s, min(len(stream), s + 4096)))).scores
              for s in range(0, len(stream), 4096)]
    core.flush()
    return core, store, np.concatenate(scores)


def _cfg(tmp_path, name, correction: bool):
    return small_config(tmp_path / name, **{"join.mode": "fake_negative", "join.window_s": 2.0,
                                            "join.allowed_lateness_s": 0.5, "trainer.batch_size": 256,
                                            "trainer.fake_negative_correction": correction})


def test_the_corrected_loss_is_calibrated_and_the_naive_one_is_not(tmp_path):
    """On a fake-negative stream the naive loss learns P(label 1 in the stream) = rate / (1 + rate) (each
    positive is also in the stream as a negative), the corrected one the true rate: its mean prediction on
    fresh impressions is within 10% of their true positive rate, the naive one's well below it."""
    n = 30_000
    out = {}
    for correction in (True, False):
        cfg = _cfg(tmp_path, f"c{correction}", correction)
        stream, _, _ = _fake_negative_stream(cfg, n)
        core, store, _ = _train(cfg, stream)
        fresh = EventBatch.concat(list(SyntheticStream(cfg).batches(n + 8000)), cfg.model.dense_dim,
                                  cfg.model.field_names)
        fresh = fresh.take(np.arange(n, n + 8000))
        p = core.predict(fresh)[:, 0]
        store.close()
        out[correction] = float(p.mean()) / float(fresh.labels.mean())
    assert 0.9 <= out[True] <= 1.1, out
    assert out[False] < 0.9 and out[False] < out[True] - 0.08, out


def test_progressive_validation_scores_each_impression_once_against_its_final_label(tmp_path):
    """Every impression reaches the metrics exactly once, with its final (true) label and the progressive score
    its fake negative got; the positives are trained on but add no score. What is still held at the end (the
    last horizon of event time) is counted as held, and a checkpoint's counters carry it to a restored core."""
    n = 6000
    cfg = _cfg(tmp_path, "pv", True)
    stream, imp, truth = _fake_negative_stream(cfg, n, seed=9)
    store = EmbeddingStore.from_sections(cfg.store, cfg.model, hot_budget(cfg.hot, cfg.model), "cpu")
    core = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = core.update_metrics

    def spy(labels, scores):
        seen.append((np.asarray(labels, np.float32).copy(), np.asarray(scores, np.float32).copy()))
        real(labels, scores)

    core.update_metrics = spy
    fn_score: dict[str, float] = {}  # each fake negative's progressive score, as training handed it over
    resolve = core.delayed.resolve

    def spy_resolve(labels, scores, ts, feedback, rids):
        for i in np.flatnonzero(feedback == FN):
            assert rids[i] not in fn_score
            fn_score[rids[i]] = float(scores[i, 0])
        return resolve(labels, scores, ts, feedback, rids)

    core.delayed.resolve = spy_resolve
    for s in range(0, len(stream), 1000):
        core.feed(stream.take(np.arange(s, min(len(stream), s + 1000))))
    core.flush()
    assert len(fn_score) == n
    held = len(core.delayed)
    assert 0 < held <= 2500  # the last 2.5 s of event time (1 event per ms) waits for positives that may come
    labels = np.concatenate([y for y, _ in seen])[:, 0]
    given = np.concatenate([p for _, p in seen])[:, 0]
    keep = ~np.isnan(labels)
    labels, given = labels[keep], given[keep]
    assert len(labels) == core.metrics.count == n - held
    still = set(core.delayed.entries)
    want = Counter((float(truth[i]), float(fn_score[f"r{i}"])) for i in range(n) if f"r{i}" not in still)
    assert Counter(zip(labels.tolist(), given.tolist())) == want
    assert int(labels.sum()) == int(sum(truth[i] for i in range(n) if f"r{i}" not in still)) > 0
    fig = core.delayed.figures()
    assert fig["unmatched_positives"] == 0 and fig["duplicate_fake_negatives"] == 0, fig

    # the held scores survive a checkpoint's counters; the restored core resolves them as the first would
    other = TrainerCore(cfg.model, cfg.trainer, store, torch.device("cpu"), store_cfg=cfg.store, join=cfg.join)
    other.load_counters(core.counters())
    assert other.delayed.state() == core.delayed.state() and other.metrics.count == core.metrics.count
    store.close()


def test_held_scores_resolve_out_of_order_and_are_bounded():
    """A positive trained before its fake negative resolves it when it comes; a positive after the horizon
    finds nothing (counted, not scored); past ``max_held`` the oldest are released as negatives; several tasks
    resolve one by one."""
    d = DelayedLabels(1, horizon_ms=100, max_held=2)
    nan = np.nan

    def go(rows):
        y, p = d.resolve(np.array([[r[2]] for r in rows], np.float32), np.array([[r[3]] for r in rows], np.float32),
                         np.array([r[1] for r in rows]), np.array([r[4] for r in rows], np.int8),
                         [r[0] for r in rows])
        return sorted(zip(y[:, 0].tolist(), np.round(p[:, 0].astype(np.float64), 4).tolist()))

    # (rid, ts, label, score, kind)
    assert go([("a", 0, 1.0, 0.9, POS), ("a", 0, 0.0, 0.3, FN), ("b", 1, 0.0, 0.4, FN), ("x", 1, 1.0, 0.5, 0)]) == \
        sorted([(1.0, 0.3), (1.0, 0.5)])
    assert len(d) == 1  # b held
    assert go([("c", 2, 0.0, 0.6, FN), ("e", 3, 0.0, 0.7, FN)]) == [(0.0, 0.4)]  # the cap: b out
    assert d.released_at_cap == 1
    assert go([("z", 500, 0.0, 0.1, NEG)]) == sorted([(0.0, 0.1), (0.0, 0.6), (0.0, 0.7)])
    assert go([("c", 2, 1.0, 0.8, POS)]) == []  # after its horizon: c was scored once already, as a negative
    assert d.unmatched_positives == 1 and len(d) == 0

    two = DelayedLabels(2, horizon_ms=100, max_held=10)
    y, p = two.resolve(np.array([[0, 0]], np.float32), np.array([[0.2, 0.1]], np.float32), np.array([0]),
                       np.array([FN], np.int8), ["r"])
    assert len(y) == 0
    y, p = two.resolve(np.array([[nan, 1]], np.float32), np.array([[0.9, 0.9]], np.float32), np.array([0]),
                       np.array([POS], np.int8), ["r"])
    np.testing.assert_array_equal(y, [[nan, 1]])
    np.testing.assert_allclose(p[0, 1], 0.1)
    y, p = two.resolve(np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32), np.array([1000]),
                       np.array([0], np.int8), ["q"])
    np.testing.assert_array_equal(y, [[0, 0], [0, nan]])  # the plain event, then r's first task as a negative
    np.testing.assert_allclose(p[1, 0], 0.2)


def test_the_joiner_writes_each_examples_kind_into_the_event(tmp_path):
    """The join machine's examples carry their kind in the event body, which the trainer's decoder reads."""
    from streamrec.ingest.codec import Decoder, encode_json
    from streamrec.joiner.machine import Action, JoinRules, JoinState

    cfg = small_config(tmp_path, **{"join.mode": "fake_negative"})
    schema_in = EventSchema.from_sections(cfg.model, cfg.ingest)
    rules = JoinRules.from_config(cfg.join)
    imp = {"ts": 1000, "dense": [0.0] * cfg.model.dense_dim, "sparse": {"user": 1}, "request_id": "q"}
    out = []
    for kind in ("fake_negative", "window"):
        st = JoinState(JoinRules(kind, rules.window_ms, rules.lateness_ms, rules.orphan_ms, rules.tasks))
        exs = st.impression("q", 1000, imp) + st.action(Action("q", 1500, cfg.join.label_action))
        exs += st.action(Action("z", 1000 + rules.window_ms + rules.lateness_ms + 10, "none"))
        out.append([(e.kind, e.event["feedback"], e.event["label"]) for e in exs])
        batch, errors = Decoder(schema_in).decode_many([encode_json(e.event) for e in exs])
        assert errors == [] and batch.feedback.tolist() == [FEEDBACK_CODES[e.kind] for e in exs]
    assert out == [[("fake_negative", "fake_negative", 0), ("positive", "positive", 1)],
                   [("positive", "positive", 1)]]
