"""The trainer's state machine without Kafka: model + dense optimizer + tiered
store + hot set + metrics. ``train_window`` takes a window of arriving events,
plans FAE hot/cold mini-batches, prefetches the next cold batch's rows while the
current one trains, and scores every event before training on it.

Kafka, checkpoints and snapshots are wired around this in ``streamrec.trainer.service``.

Several tasks: scores are ``[N, T]`` (column ``t`` is task ``model.task_names[t]``). Progressive
metrics are kept per task (``task_metrics``, one :class:`StreamingMetrics` each), and each task's
are updated only with the events that carry its label; ``metrics`` is the first task's, so the
single-task figures (``auc``, ``logloss``) keep their meaning.

A ``join.mode = fake_negative`` stream (the delayed-feedback joiner's): the loss weighs events by
their feedback kinds (``trainer.fake_negative_correction``, ``step.py``), and the metrics get each
impression once, against its final label (:class:`~.delayed_metrics.DelayedLabels`, ``delayed``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import torch

from streamrec.foundation import EventBatch, KeyedJaggedIds

from .metrics import StreamingMetrics
from streamrec.model import build_model, predict_batch, unique_ids
from .batch_sizes import BatchSizes, batch_sizes
from .batching import EventBatcher, Step
from .delayed_metrics import DelayedLabels
from .fused_step import FusedStep, PreparedStep
from .schedule import MiniBatch, plan
from .stage_clock import StageClock
from .dense_optimizers import dense_optimizer
from .step import NonFiniteStep

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.foundation.model_config import ModelConfig
    from streamrec.joiner.join_config import JoinConfig
    from streamrec.trainer.trainer_config import TrainerConfig

log = logging.getLogger(__name__)


@dataclass
class WindowResult:
    events: int  # events handed over in this call
    hot_events: int  # events trained in hot mini-batches
    minibatches: int
    scores: np.ndarray  # [N, T] progressive scores of this call's events, arrival order (NaN rows: rejected or waiting)
    rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # not trained (non-finite): positions among this call's events
    reject_reason: str = ""
    trained: int = 0  # events trained in this call (may include events handed over earlier)
    rejected_batch: EventBatch | None = None  # the rejected events themselves (for the dead-letter topic)


class TrainerCore:
    """The model, its optimizers, the batcher and the metrics of one trainer (module doc). It reads the
    ``model`` and ``trainer`` sections, of ``store_cfg`` whether admission counts occurrences, and of
    ``join`` whether the stream is a fake-negative one; ``sizes`` (default :func:`~.batch_sizes.batch_sizes`
    of one trainer) are its step, window and hot-wait counts."""

    def __init__(self, model: ModelConfig, trainer: TrainerConfig, store, device: torch.device, *,
                 store_cfg: StoreConfig | None = None, join: JoinConfig | None = None,
                 sizes: BatchSizes | None = None):
        self.model_cfg, self.trainer_cfg = model, trainer
        self.sizes = sizes if sizes is not None else batch_sizes(trainer)
        self.store = store
        self.device = device
        # admission counts each id's occurrences in the step (``store.admit_min_count``)
        self.counts_occurrences = store_cfg is not None and store_cfg.admit_min_count >= 2
        self.fields = model.field_names
        self.field_tables = model.field_tables  # {field: table}: the store and the hot set are keyed by table
        self._key_tables = [self.field_tables[f] for f in self.fields]
        self.task_names = model.task_names
        self.model = build_model(model).to(device)
        self.opt = dense_optimizer(self.model, trainer.dense_optimizer, trainer.dense_lr)
        # one per task, each updated with the events that carry its label; ``metrics`` is the first task's
        self.task_metrics = {name: StreamingMetrics(trainer.metrics_window) for name in self.task_names}
        self.metrics = self.task_metrics[self.task_names[0]]
        fake_stream = join is not None and join.mode == "fake_negative"
        # the fake-negative weighted loss (step.py), and each impression scored once against its final label
        self.fake_negative = fake_stream and bool(trainer.fake_negative_correction)
        self.delayed = DelayedLabels(len(self.task_names),
                                     int(round((join.longest_window_s + join.allowed_lateness_s) * 1000)),
                                     int(trainer.delayed_max_held)) if fake_stream else None
        sz = self.sizes
        self.batcher = EventBatcher(sz.step, sz.window, model.dense_dim, self.fields, hot_wait=sz.hot_wait,
                                    num_tasks=len(self.task_names))
        self.events = 0
        self.hot_events = 0
        self.hot_version = 0
        self.hot_rows = 0
        self.newest_event_ms = 0
        self.nonfinite_batches = 0  # mini-batches whose loss or gradients were not finite (nothing applied)
        self.rejected_events = 0  # events of those batches that were not trained (dead-lettered by the service)
        self.clock = StageClock()  # seconds per pipeline stage (``bench train --host-ceiling`` reads it)
        self.fused = FusedStep(self.model, self.opt, model, store, device, fake_negative=self.fake_negative,
                               clock=self.clock)

    # -- hot set ---------------------------------------------------------------
    def apply_hot_set(self, version: int, tables: Mapping[str, np.ndarray]) -> Any:
        """Migrate to a new hot set (between batches; the store moves rows with their optimizer state).

        A set over the store's hot capacity (the sketch ran with a bigger budget, or the budget was
        lowered while the compacted topic still holds the old set) is cut to fit, each table in
        proportion, instead of raising: the follower would hand the same set over after every restart.
        """
        known = set(self.field_tables.values())
        tables = {t: np.unique(np.asarray(ids, dtype=np.int64)) for t, ids in tables.items() if t in known}
        total, cap = sum(len(v) for v in tables.values()), int(self.store.hot_capacity_rows)
        if total > cap:
            log.warning("hot set v%d has %d rows, over the hot tier's %d: cut to fit", version, total, cap)
            tables = {t: ids[: len(ids) * cap // total] for t, ids in tables.items()}
        stats = self.store.set_hot(tables)
        self.hot_version = int(version)
        self.hot_rows = int(sum(len(v) for v in tables.values()))
        log.info("hot set v%d applied: %d rows (%s)", version, self.hot_rows, stats)
        return stats

    def classify_hot(self, batch: EventBatch) -> np.ndarray:
        """Bool per event: every id of every field is hot (an event without ids is hot). One probe of the
        store's hot index for the whole batch, as ``schedule.hot_samples`` asks field by field."""
        kjt = KeyedJaggedIds.from_batch(batch, self.fields)
        cold = self.store.hot_slots(self._key_tables, np.diff(kjt.key_offsets), kjt.values) < 0
        n = len(batch)
        if len(kjt.values) == len(self.fields) * n:  # one id per field and event: value k is event k % n
            return ~cold.reshape(len(self.fields), n).any(axis=0)
        hot = np.ones(n, bool)
        event = np.repeat(np.arange(len(kjt.offsets) - 1) % max(1, n), np.diff(kjt.offsets))
        hot[event[cold]] = False
        return hot

    # -- training ------------------------------------------------------------
    def plan(self, batch: EventBatch) -> list[MiniBatch]:
        """One window's FAE plan (a trainer group's ranks train self-contained windows with it)."""
        t = self.trainer_cfg
        if t.schedule == "fae" and self.hot_rows:
            hot = self.classify_hot(batch)
        else:
            hot = np.zeros(len(batch), dtype=bool)
        return plan(hot, self.sizes.step, t.schedule if self.hot_rows else "arrival", t.hot_per_cold)

    def train_window(self, batch: EventBatch) -> WindowResult:
        """Train on ``batch`` and on everything still waiting, partial mini-batches included.

        For callers that hand over self-contained windows (tests, benchmarks, a rank of a group);
        the service uses :meth:`feed` and :meth:`flush`, whose batches do not depend on poll sizes."""
        return self.feed(batch, flush=True)

    def feed(self, batch: EventBatch, flush: bool = False) -> WindowResult:
        """Queue arriving events and train the mini-batches they complete (see ``batching``);
        ``flush``: then train everything still waiting too.

        Events that complete no mini-batch wait (``pending``); the checkpoint keeps them."""
        with self.clock.stage("batching"):
            hot = None
            if self.trainer_cfg.schedule == "fae" and self.hot_rows and len(batch):
                hot = self.classify_hot(batch)
            base = self.batcher.next_seq
            steps = self.batcher.add(batch, hot)
            if flush:
                steps += self.batcher.drain()
        return self._run_steps(steps, len(batch), base)

    def flush(self) -> WindowResult:
        """Train everything waiting now (end of stream, idle stream, stop)."""
        return self._run_steps(self.batcher.drain(), 0, self.batcher.next_seq)

    @property
    def pending(self) -> int:
        """Events received and not trained yet."""
        return len(self.batcher)

    def _run_steps(self, steps: list[Step], n_new: int, base: int) -> WindowResult:
        """Run planned steps in order: score the early ones, then train.

        The host prepares the next step (its ids resolved, a cold step's rows prefetched) before this one
        runs; hot mini-batches are never prefetched (their rows are all on the device)."""
        bt = self.batcher
        buf = bt.buffer
        self.model.train()
        subs = [buf.take(s.rows) for s in steps]
        labels = buf.label_matrix(len(self.task_names))
        prepared: list[PreparedStep | None] = [None] * len(steps)
        hot_n, trained = 0, 0
        rejected: list[np.ndarray] = []
        reasons: list[str] = []
        marker = self.step_marker
        if self.before_training is not None and subs:
            self.before_training(subs)
        for i, (s, sub) in enumerate(zip(steps, subs)):
            if marker is not None:  # a death from here to the next mark names exactly these events' records
                at = np.concatenate([s.rows, s.prescore]) if len(s.prescore) else s.rows
                marker.mark_step(bt.part[at], bt.off[at])
            if len(s.prescore):
                early = buf.take(s.prescore)
                bt.scores[s.prescore] = self.fused.score(self.fused.prepare(early))
            if prepared[i] is None:
                prepared[i] = self.fused.prepare(sub)

            def ahead(nxt: int = i + 1) -> None:  # the next step, prepared while this one's device work runs
                if nxt < len(steps) and prepared[nxt] is None:  # a cold step's rows load in the background
                    prepared[nxt] = self.fused.prepare(subs[nxt], prefetch=steps[nxt].kind != "hot")

            p, bad, why = self._guarded_step(sub, prepared[i], ahead)
            ahead()  # a step that failed before its device work was queued did not call it
            prepared[i] = None
            own = np.isnan(bt.scores[s.rows, 0])  # an event scored early keeps that score: this one has peeked
            bt.scores[s.rows[own]] = p[own]
            keep = np.ones(len(s.rows), bool)
            keep[bad] = False
            if len(bad):
                rejected.append(s.rows[bad])
                reasons.append(why)
            rows = s.rows[keep]
            with self.clock.stage("metrics"):
                self.score_trained(buf, rows, labels[rows], bt.scores[rows])
            trained += len(rows)
            if s.kind == "hot":
                hot_n += len(rows)
        if marker is not None and steps:
            marker.step_done()
        out = np.sort(np.concatenate(rejected)) if rejected else np.zeros(0, np.int64)
        # this call's events, in arrival order: their scores (NaN while waiting or when rejected)
        n_buf = len(buf)
        mine = np.flatnonzero(bt.seq >= base) if n_new else np.zeros(0, np.int64)
        scores = bt.scores[mine].copy() if n_new else np.zeros((0, len(self.task_names)), np.float32)
        if len(out):
            scores[np.isin(mine, out)] = np.nan
        rejected_batch = buf.take(out) if len(out) else None
        rel = bt.seq[out] - base
        self.events += trained
        self.hot_events += hot_n
        self.rejected_events += len(out)
        if n_buf:
            self.newest_event_ms = max(self.newest_event_ms, int(buf.ts.max()))
        bt.retire()
        return WindowResult(n_new, hot_n, len(steps), scores, rel, "; ".join(dict.fromkeys(reasons)),
                            trained=trained, rejected_batch=rejected_batch)

    def _finish_window(self, batch: EventBatch, scores: np.ndarray, rejected: list[np.ndarray], reasons: list[str],
                       hot_n: int, minibatches: int) -> WindowResult:
        """Count a window trained as a whole (a group's rank): metrics and totals over the events trained."""
        out = np.sort(np.concatenate(rejected)) if rejected else np.zeros(0, np.int64)
        keep = np.ones(len(batch), bool)
        keep[out] = False
        self.score_trained(batch, np.flatnonzero(keep), batch.label_matrix(len(self.task_names))[keep], scores[keep])
        self.events += int(keep.sum())
        self.hot_events += hot_n
        self.rejected_events += len(out)
        if len(batch):
            self.newest_event_ms = max(self.newest_event_ms, int(batch.ts.max()))
        return WindowResult(len(batch), hot_n, minibatches, scores, out, "; ".join(dict.fromkeys(reasons)),
                            trained=int(keep.sum()), rejected_batch=batch.take(out) if len(out) else None)

    def _guarded_step(self, sub: EventBatch, prepared: PreparedStep | None,
                      ahead: Callable[[], None] | None = None) -> tuple[np.ndarray, np.ndarray, str]:
        """Train one mini-batch; ``(scores, rejected rows, reason)``.

        A step that is not finite changed nothing, so its events can be tried again: the
        events whose own loss is not finite are set aside and the rest retried; when only
        the gradients are bad, the batch is halved until the culprits are single events.
        Poisoned batches are rare, so the extra steps cost nothing in the common case."""
        scores = np.full((len(sub), len(self.task_names)), np.nan, np.float32)
        bad: list[np.ndarray] = []
        why: list[str] = []
        todo = [(np.arange(len(sub)), prepared)]
        while todo:
            rows, prep = todo.pop()
            part = sub if len(rows) == len(sub) else sub.take(rows)
            try:
                scores[rows] = self._step(part, prep, ahead)
                ahead = None
                continue
            except NonFiniteStep as e:
                self.nonfinite_batches += 1
                why.append(f"non-finite training step: {e}")
                culprits = e.rows
            if 0 < len(culprits) < len(rows):  # these events' own loss is not finite
                bad.append(rows[culprits])
                todo.append((np.delete(rows, culprits), None))
            elif len(rows) == 1:
                bad.append(rows)
            else:
                half = len(rows) // 2
                todo += [(rows[:half], None), (rows[half:], None)]
        out = np.sort(np.concatenate(bad)) if bad else np.zeros(0, np.int64)
        reason = "; ".join(dict.fromkeys(why))
        if len(out) or why:
            log.warning("mini-batch of %d events: %s; %d events not trained (dead-lettered)", len(sub), reason, len(out))
        return scores, out, reason

    on_step = None  # called with each training step's seconds (the trainer's Prometheus histogram), if set
    # called with the mini-batches of a ``feed``/``flush`` before any of them trains (the evidence's field
    # contribution scores some of their events with the model that has not learnt them yet), if set
    before_training = None
    can_predict = True  # ``predict`` scores any batch with the current model (a group's rank cannot)
    # the crash-loop marker (the consumer: ``mark_step(partitions, records)`` before each step names the
    # records of its events, early-scored ones included; ``step_done()`` after the last), if set
    step_marker = None

    def _step(self, sub: EventBatch, prepared: PreparedStep | None,
              ahead: Callable[[], None] | None = None) -> np.ndarray:
        t0 = time.perf_counter()
        if self.counts_occurrences:  # admission counts each id's occurrences in the step
            from streamrec.embedding_store import note_occurrences

            with self.clock.stage("ids"):
                for table, (ids, inverse) in unique_ids(sub, self.model_cfg).items():
                    note_occurrences(self.store, table, ids, np.bincount(inverse, minlength=len(ids)))
        try:
            return self.fused.run(prepared if prepared is not None else self.fused.prepare(sub), ahead)
        finally:
            if self.on_step is not None:
                self.on_step(time.perf_counter() - t0)

    def score_trained(self, batch: EventBatch, rows: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> None:
        """Progressive validation of the trained events ``rows`` of ``batch`` (their labels and scores given):
        straight to the metrics, or, in a fake-negative stream, through the held scores (``delayed``), which
        hand over each impression once, when its final label is known."""
        if self.delayed is not None:
            fb = batch.feedback[rows] if batch.feedback is not None else np.zeros(len(rows), np.int8)
            rids = [batch.request_ids[i] for i in rows] if batch.request_ids is not None and fb.any() else None
            labels, scores = self.delayed.resolve(labels, scores, batch.ts[rows], fb, rids)
        self.update_metrics(labels, scores)

    def update_metrics(self, labels: np.ndarray, scores: np.ndarray) -> None:
        """Add trained events' labels and progressive scores (both ``[n, T]``, NaN label: missing) to each
        task's metrics, over the events that carry that task's label."""
        scores = np.asarray(scores, np.float32).reshape(len(labels), len(self.task_names))
        for t, name in enumerate(self.task_names):
            has = ~np.isnan(labels[:, t])
            self.task_metrics[name].update(labels[has, t], scores[has, t])

    def task_figures(self) -> dict[str, dict[str, Any]]:
        """Per task: since-start ``auc``, ``logloss`` and the events with its label scored (``labelled``)."""
        return {name: {"auc": m.auc, "logloss": m.logloss, "labelled": m.count}
                for name, m in self.task_metrics.items()}

    def predict(self, batch: EventBatch) -> np.ndarray:
        """Probabilities ``[B, T]``."""
        self.model.eval()
        try:
            return predict_batch(self.model, batch, self.model_cfg, self.store.peek, self.device)
        finally:
            self.model.train()

    # -- state -----------------------------------------------------------------
    def dense_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "pending": self.batcher.state()}

    def load_dense_state(self, d: Mapping[str, Any]) -> None:
        self.model.load_state_dict(d["model"])
        self.opt.load_state_dict(d["opt"])
        self.batcher.load_state(d.get("pending"))

    def counters(self) -> dict[str, Any]:
        return {"events": self.events, "hot_events": self.hot_events, "hot_version": self.hot_version,
                "newest_event_ms": self.newest_event_ms, "metrics": self.metrics.state(),
                "task_metrics": {name: m.state() for name, m in self.task_metrics.items()},
                "nonfinite_batches": self.nonfinite_batches, "rejected_events": self.rejected_events,
                **({"delayed_labels": self.delayed.state()} if self.delayed is not None else {})}

    def load_counters(self, d: Mapping[str, Any]) -> None:
        self.events = int(d.get("events", 0))
        self.hot_events = int(d.get("hot_events", 0))
        self.newest_event_ms = int(d.get("newest_event_ms", 0))
        self.nonfinite_batches = int(d.get("nonfinite_batches", 0))
        self.rejected_events = int(d.get("rejected_events", 0))
        self.metrics.load_state(d.get("metrics", {}))
        for name, st in (d.get("task_metrics") or {}).items():
            if name in self.task_metrics and name != self.task_names[0]:
                self.task_metrics[name].load_state(st)
        if self.delayed is not None:
            self.delayed.load_state(d.get("delayed_labels"))
