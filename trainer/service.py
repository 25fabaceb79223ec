"""The continuous trainer process: Kafka in, checkpoints, offsets, snapshots, metrics.

Durability order, per interval: train windows -> flush dead letters -> write checkpoint (store, dense
weights + optimizer, hot-set version, offsets, metrics) atomically -> only then
commit the offsets to Kafka. On start the newest complete checkpoint is restored and the consumer is
positioned at its offsets, so after a SIGKILL no event is lost and at most one interval is replayed.

Freshness is not tied to that interval: every ``serving.push_every_s`` the trainer pushes a delta of
the rows it changed since its last push (the :class:`~.changes.ChangeJournal` in front of the store
knows which) with the model as it is, whether or not it is durable yet. After a crash the first push
is full, from the re-trained checkpoint, under a newer version; later pushes supersede.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from streamrec.foundation import is_resource_error, resolve_device
from streamrec.snapshot import PusherFactory

from .batch_sizes import batch_sizes
from .changes import ChangeJournal
from .checkpoint import INFLIGHT, offsets_from_json, offsets_to_json, write_checkpoint
from .core import TrainerCore
from .evidence import collector_for
from .hotset import NoHotSource, SampleHotSource, make_hot_source
from .hotset_types import HotSetSource, HotUpdate
from .merge import PartitionMerger
from .positions import StreamEnd, position_consumer
from .reporting import TrainerReporting
from .run_loop import RunLoop, Turn
from .run_timers import RunTimers
from .resume import open_store, restore_point  # noqa: F401  (open_store: importable from here too)
from .snapshots import SnapshotPublisher
from .step_breaker import arm_step_breaker
from .telemetry import Freshness, MetricsLog, ProgressLine, PrometheusExporter, Rate

if TYPE_CHECKING:
    from .trainer_settings import TrainerSettings

log = logging.getLogger(__name__)

FINAL_PUSH_WAIT_S = 60.0  # the most a stop waits for a pending push, and again for the final one's answer
FINAL_BUILDS = 2  # final snapshots a stop builds at most: a second one when serving dropped the first
VERSION_FILE = "snapshot-version.json"  # the newest snapshot version built, next to the checkpoints (durable)


class Trace:
    """Debug record of the Kafka offset ranges trained (proves at-least-once / bounded duplicates)."""

    def __init__(self, path: str):
        self._f = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._f = open(path, "a", buffering=1)

    def write(self, rec: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


class TrainerService(TrainerReporting):
    """One trainer process (its metrics records: :class:`~.reporting.TrainerReporting`). ``pusher_factory(target)`` delivers its snapshots to serving
    (needed when ``trainer.push_snapshots`` is on; the CLI passes serving's gRPC pusher)."""

    def __init__(self, settings: TrainerSettings, bootstrap: str, stop: threading.Event | None = None,
                 progress: bool | None = None, pusher_factory: PusherFactory | None = None):
        self.settings = settings
        self.bootstrap = bootstrap
        self.stop = stop or threading.Event()
        t = settings.trainer
        if t.torch_threads > 0:
            torch.set_num_threads(t.torch_threads)
        self.device = resolve_device(t.device)
        # the values derived from several keys, once for this process: its batch sizes, the hot tier's budget
        self.sizes = batch_sizes(t, self.world)
        self.hot_budget = settings.hot_budget
        ckpt, state, dense = self._restore_point(t.checkpoint_dir)
        self.fell_back = bool(self.refused_checkpoints)
        self.store = ChangeJournal(self.store)  # before the core: it writes through the journal
        self.core = self._make_core()
        # several partitions are merged by event time before training (trainer/merge.py)
        self.merger = PartitionMerger(t.merge_wait_ms, t.merge_max_events, settings.model.dense_dim,
                                      settings.model.field_names)
        # before the publisher: it times and counts the pushes
        self.prom = PrometheusExporter(t.metrics_port, t.metrics_host) if t.metrics_port else None
        if self.prom is not None:
            pusher_factory = self.prom.timed_pushers(pusher_factory)
            self.core.on_step = self.prom.step_seconds.observe
        self.publisher = SnapshotPublisher(settings.model, settings.store, settings.snapshot_form, t.snapshot_dir,
                                           model_hash=settings.model_hash, targets=list(settings.push_targets),
                                           push=t.push_snapshots, full_every=t.full_snapshot_every,
                                           give_up_s=t.push_give_up_s, pusher_factory=pusher_factory,
                                           version_file=Path(t.checkpoint_dir) / VERSION_FILE,
                                           ) if t.snapshot_every > 0 else None
        if self.publisher is not None:  # off the poll loop, overlapping the group join and the first push interval
            self.publisher.start_export(self.core.model)
        # the quality evidence each snapshot carries (trainer/evidence.py): on the process that publishes
        self.evidence = collector_for(settings.model, t.metrics_window, self.core) \
            if self.publisher is not None and self.rank == 0 else None
        self.seq = int(state.get("seq", 0))  # a fresh start numbers after every checkpoint in use (highest_seq)
        self._pushed_events, self._pushed_version = -1, None  # the newest snapshot built: events it holds, version
        self.offsets: dict[tuple[str, int], int] = {}
        self.topic_ids: dict[str, str] = {}  # topic -> its id when the checkpoint's offsets were read
        self.resumed_from: str | None = None
        if ckpt is not None:
            self._resume(ckpt, state, dense)
        self.hot = self._make_hot_source()
        if isinstance(self.hot, SampleHotSource):
            # continue from the checkpoint's set: restarting at 0 made hot_version go backwards and
            # re-counted and re-migrated a set the restored store already holds
            self.hot.version = self.core.hot_version
        self.hot_coverage = float("nan")
        self.hit_rate = float("nan")
        self.rows_expired = int(state.get("rows_expired", 0))  # totals carry over a resume, like the events
        self.rows_evicted = int(state.get("rows_evicted", 0))
        self._last_sweep = time.monotonic()
        self.metrics_log = MetricsLog(t.log_path)
        self.progress = ProgressLine(progress)
        self.freshness = Freshness()  # newest trained event by its own ts and by when it entered Kafka
        self.trace = Trace(t.trace_path)
        self.consumer = self._make_consumer()
        if self.prom is not None:
            self.prom.watch_consumer(self.consumer)
        self.consumer.stats.dead_letters = int(state.get("dead_letters", 0))
        self.consumer.stats.quarantined = int(state.get("quarantined", 0))
        if self.pins_training_crashes:
            self._arm_crash_breaker()
        self.pos = self._position_consumer()
        self.merger.expect(p for _, p in self.pos)
        self.end_at = StreamEnd(self.consumer.consumer, self.pos) if t.until_end else None  # where this run stops
        self.trace.write({"start": True, "pid": os.getpid(), "seq": self.seq,
                          "positions": offsets_to_json(self.pos)})
        self._rate = Rate()
        self._rate.n = self.core.events
        self._hot_at_log = (self.core.events, self.core.hot_events)
        self.last_record: dict[str, Any] = {}

    rank, world = 0, 1  # a trainer group's rank has its own (streamrec.trainer.group)

    def _resume(self, ckpt: Path, state: dict[str, Any], dense: dict[str, Any]) -> None:
        """Take the model, counters, offsets and publisher state of checkpoint ``ckpt`` back."""
        self.core.load_dense_state(dense)
        self.merger.load_state(dense.get("merge"))
        self.core.load_counters(state)
        self.seq = int(state["seq"])
        self.offsets = offsets_from_json(state.get("offsets", []))
        self.topic_ids = {str(k): str(v) for k, v in (state.get("topic_ids") or {}).items()}
        if self.publisher is not None:
            self.publisher.load_state(state.get("snapshot", {}))
            self.publisher.request_full()  # serving may hold a newer version than this checkpoint knew
        self._restore_evidence_memory(dense)
        self.core.hot_version = int(state.get("hot_version", 0))
        self.core.hot_rows = int(self.store.stats()["hot_rows"])
        self.resumed_from = str(ckpt)
        log.info("resumed from %s: %d events, offsets %s", ckpt, self.core.events, self.offsets)

    # -- the crash-loop breaker for training steps (streamrec.ingest.inflight, phase "step") ----
    pins_training_crashes = True  # a group rank does not: its steps are collectives every rank must run

    def _arm_crash_breaker(self) -> None:
        """Mark each training step's records; probe a dead predecessor's step records (trainer/step_breaker.py)."""
        from .crash_probe import ProbeModel  # loads the ingest package's probe: only where crashes are pinned

        c = self.settings
        arm_step_breaker(ProbeModel(c.model, c.trainer, c.store), self.core, self.consumer, self.merger)

    # -- the parts a trainer group's rank replaces (streamrec.trainer.group) -------------
    def _make_core(self) -> TrainerCore:
        c = self.settings
        return TrainerCore(c.model, c.trainer, self.store, self.device, store_cfg=c.store, join=c.join,
                           sizes=self.sizes)

    def _make_hot_source(self) -> HotSetSource:
        """The source ``trainer.hot_source`` names; a group's other ranks get rank 0's set from it, so none."""
        if self.rank != 0:
            return NoHotSource()
        c = self.settings
        return make_hot_source(c.trainer, c.model, c.kafka, self.hot_budget, self.bootstrap)

    def _make_consumer(self):
        from streamrec.ingest import EventConsumer, EventSchema

        # the crash-loop breaker's marker lives with the checkpoints: it is about this trainer's progress
        return EventConsumer(self.bootstrap, self.settings.kafka, self.settings.ingest, EventSchema.from_sections(self.settings.model, self.settings.ingest),
                             group_id=self.settings.kafka.trainer_group,
                             mode=self.settings.kafka.consumer_mode,
                             inflight_path=os.path.join(self.settings.trainer.checkpoint_dir, INFLIGHT))

    def _restore_point(self, root: str) -> tuple[Path | None, dict[str, Any], dict[str, Any]]:
        """Open ``self.store`` at the newest checkpoint that verifies and loads; ``(dir, state, dense)``.
        Checkpoints refused on the way are set aside and listed in ``refused_checkpoints`` (trainer/resume.py)."""
        self.refused_checkpoints: list[str] = []
        ckpt, state, dense, self.store = restore_point(lambda at: open_store(self.settings, self.device, at),
                                                       self.settings.store.path, root, self.refused_checkpoints,
                                                       str(self.device))
        return ckpt, state, dense

    # -- consumer position (trainer/positions.py) ---------------------------------
    def _position_consumer(self) -> dict[tuple[str, int], int]:
        """Resume every assigned partition at the checkpoint's offset, else the committed one, else the start."""
        return position_consumer(self.consumer, self.offsets, self.topic_ids, self.fell_back, self.stop,
                                 self.settings.kafka.max_poll_interval_ms)

    def _at_end(self, quiet: bool = False) -> bool:
        """``trainer.until_end``: every partition read up to its end as of start (``quiet``: the last poll
        brought nothing, so a partition whose high watermark was never seen counts too)."""
        return self.end_at is not None and self.end_at.reached(self.pos, quiet)

    # -- the loop (trainer/run_loop.py) ---------------------------------------------
    def run(self) -> dict[str, Any]:
        self._first_poll, self._last_batch = True, None
        reason = RunLoop(self, RunTimers(self.settings.trainer, self.settings.push_every_s, self.core.events)).run()
        m = self.core.metrics
        return {"reason": reason, "events": self.core.events, "checkpoint": self.seq,
                "auc": m.auc, "logloss": m.logloss, "events_scored": m.count, "window_auc": m.window_auc(),
                "tasks": self.core.task_figures(), "dead_letters": self.consumer.stats.dead_letters}

    @property
    def trained_events(self) -> int:
        return self.core.events

    def turn(self, timers: RunTimers) -> Turn:
        """One poll: the stop conditions first, then the hot set, then the events that arrived are merged,
        batched and trained (a quiet poll trains what waits: nothing is held back)."""
        t = self.settings.trainer
        if self.stop.is_set():
            return Turn(reason="stopped")
        received = self.core.events + self.core.rejected_events + self.core.pending + len(self.merger)
        if t.max_events and received >= t.max_events:
            return Turn(reason="max_events")
        if self._at_end(quiet=not self._first_poll and self._last_batch is None):  # trainer.until_end
            return Turn(reason="end of stream")
        self.apply_hot_set(self.hot.poll())
        window = self.sizes.window
        want = window if not t.max_events else max(1, min(window, t.max_events - received))
        self._first_poll = False
        batch = self._last_batch = self.consumer.poll_batch(want, timeout=0.5)
        if batch is not None:
            self.hot.observe(batch)
            # partitions merged by event time (trainer/merge.py); mini-batches form by event count
            # (trainer/batching.py), whatever the poll brought; both checkpoint what waits in them
            ready = self._merge(batch, time.monotonic())
            if ready is not None:
                self._dead_letter(self.core.feed(ready))
                self._maybe_evict()
            self._record_trained(batch)
            timers.received()
            timers.busy()  # idle means no events for trainer.idle_exit_s, not training
        elif (waiting := len(self.merger) or self.core.pending) or self.consumer.fetch_behind():
            if waiting:  # a quiet stream: train what waits, hold nothing back (else a slow fetch: records wait)
                self._train_waiting()
            timers.busy()
        due = timers.due(self.core.events, self.publisher.wants_full if self.publisher is not None else None)
        return Turn(due, "idle" if due.idle else "")

    def wind_down(self, reason: str) -> None:
        """The end of the stream (not a stop): its tail trains too."""
        if (self.core.pending or len(self.merger)) and reason != "stopped":
            self._train_waiting()

    def _train_waiting(self) -> None:
        ready = self.merger.drain()
        self._dead_letter(self.core.feed(ready, flush=True) if ready is not None else self.core.flush())

    def save(self) -> None:
        self.checkpoint()

    def push_due(self) -> bool:
        return self.push() is not None  # None: the last push is still being retried

    def _dead_letter(self, res) -> None:
        if res.rejected_batch is not None:  # a non-finite step: those events were not trained
            self.consumer.dead_letter_events(res.rejected_batch, res.reject_reason, source="trainer")

    def apply_hot_set(self, upd: HotUpdate | None) -> None:
        """Migrate to the hot set ``upd`` (None: none is new) and show its coverage and hit rate."""
        if upd is None:
            return
        self.core.apply_hot_set(upd.version, upd.tables)
        self.hot_coverage = upd.coverage
        if upd.hit_rate == upd.hit_rate:
            self.hit_rate = upd.hit_rate

    def _merge(self, batch, now: float):
        """The events that may train now: ``batch`` itself when there is nothing to merge (one partition,
        ``trainer.merge_wait_ms = 0``), else what the partition merge releases."""
        m = self.merger
        parts = batch.source_partitions
        if not m.enabled or (not len(m) and (parts is None or len(m.newest) <= 1 and (len(parts) == 0 or (
                parts == parts[0]).all()))):
            return batch if len(batch) else None
        m.add(batch, now)
        return m.release(now, self.consumer.partitions_behind())

    def _record_trained(self, batch) -> None:
        ranges = []
        for key, nxt in sorted(batch.source_offsets.items()):
            start = self.pos.get(key, nxt)
            ranges.append([key[0], key[1], int(start), int(nxt)])
            self.pos[key] = int(nxt)
            self.offsets[key] = int(nxt)
        self.freshness.observe(batch)
        self.trace.write({"events": len(batch), "ranges": ranges, "after_seq": self.seq})

    # -- durability -------------------------------------------------------------
    def _maybe_expire(self) -> None:
        """Delete cold rows untouched for ``store.expire_after_s`` (a full scan, so at most every half period)."""
        after = self.settings.store.expire_after_s
        if after <= 0 or time.monotonic() - self._last_sweep < after / 2:
            return
        t0 = time.monotonic()
        n = self.store.expire(after)
        self._last_sweep = time.monotonic()
        self.rows_expired += n
        log.info("expired %d rows untouched for %.0f s (sweep took %.2f s)", n, after, self._last_sweep - t0)

    def _maybe_evict(self) -> None:
        """Cut the tables past ``store.max_rows`` (and its slack) back to the cap; the deleted ids go to the next
        delta (the journal notes them)."""
        if self.settings.store.max_rows <= 0:
            return
        t0 = time.monotonic()
        gone = self.store.evict()
        n = sum(len(v) for v in gone.values())
        if n:
            self.rows_evicted += n
            log.info("evicted %d rows over store.max_rows (%s; sweep took %.2f s)", n,
                     ", ".join(f"{t}: {len(v)}" for t, v in sorted(gone.items())), time.monotonic() - t0)

    def checkpoint(self) -> int:
        t0 = time.perf_counter()
        self._maybe_expire()  # before the store checkpoint, so the checkpoint holds the sweep
        # the checkpoint's offsets are where a resume starts: the dead letters before them must be out first
        self.consumer.flush_dead_letters()
        self.seq += 1
        seq = self.seq
        epoch_box: dict[str, int] = {}

        def write_store(d: Path):
            epoch_box["epoch"] = int(self.store.checkpoint(d))
            return {"epoch": epoch_box["epoch"]}

        if self.consumer.topic_id is not None:
            self.topic_ids[self.consumer.topic] = str(self.consumer.topic_id)
        state = {
            "offsets": offsets_to_json(self.offsets),
            "topic_ids": dict(self.topic_ids),
            "ts": time.time(),
            "dead_letters": self.consumer.stats.dead_letters,
            "quarantined": self.consumer.stats.quarantined,
            "rows_expired": self.rows_expired,
            "rows_evicted": self.rows_evicted,
            "snapshot": self.publisher.state() if self.publisher else {},
            "merge_forced": self.merger.forced,
            **self.core.counters(),
        }
        dense = {**self.core.dense_state(), "merge": self.merger.state(), **self._evidence_memory()}
        path = write_checkpoint(self.settings.trainer.checkpoint_dir, seq, state, dense, write_store,
                                keep=self.settings.trainer.keep_checkpoints)
        if self.prom is not None:
            self.prom.checkpoint_seconds.observe(time.perf_counter() - t0)
        self.consumer.mark_durable(dict(self.offsets))
        self.trace.write({"checkpoint": seq, "offsets": offsets_to_json(self.offsets), "events": self.core.events})
        log.info("checkpoint %d at %d events -> %s", seq, self.core.events, path)
        if (self.publisher is not None and self.settings.push_every_s <= 0
                and seq % max(1, self.settings.trainer.snapshot_every) == 0):
            self.push()
        return seq

    # -- freshness ----------------------------------------------------------------
    def push_final(self) -> int | None:
        """At a stop (the stream's end, ``--max-events``, idle exit, SIGTERM): serving gets the model as the final
        checkpoint holds it, with the evidence of every event since the previous snapshot. The model's export,
        when still running, is waited for first (logged), then a push still pending (an older model: building
        the final one beside it is refused), then the final model is built unless the newest snapshot serving
        holds already has every event trained, and serving's answer is waited for; a final snapshot serving
        dropped (it needed a full one) is built once more, full. Each wait is bounded by
        ``trainer.push_give_up_s`` and at most ``FINAL_PUSH_WAIT_S``, and ends at a failed attempt (serving down:
        the stop does not sit out the retries). Returns the final version serving acknowledged, None when none
        was (logged with the reason; the final checkpoint holds every event, and a restart pushes a full one)."""
        for _ in range(FINAL_BUILDS):
            if not self._agree(self._final_wanted()) or not self._build_final():
                break
        return self._final_answer()

    def _final_wait_s(self) -> float:
        return min(self.settings.trainer.push_give_up_s, FINAL_PUSH_WAIT_S)

    def _final_wanted(self) -> bool:
        """Where the snapshots are published: wait for the push pending, then whether the final model is still
        to be built (serving's newest snapshot misses events trained, or serving dropped it)."""
        pub = self.publisher
        if pub is None:
            return False
        if not pub.wait_export(self._final_wait_s()):  # a run shorter than the export: its first snapshot is this one
            return False
        if not pub.wait_idle(self._final_wait_s(), until_failure=True):
            return False
        return self.trained_events != self._pushed_events or not pub.holds(self._pushed_version)

    def _agree(self, wanted: bool) -> bool:
        """What every process that builds a snapshot decides (a trainer group's ranks: rank 0's decision)."""
        return wanted

    def _build_final(self) -> bool:
        return self.push() is not None

    def _final_answer(self) -> int | None:
        """Wait for serving's answer to the final snapshot; its version when serving holds every event trained."""
        pub, version, wait = self.publisher, self._pushed_version, self._final_wait_s()
        if pub is None:
            return None
        pub.wait_idle(wait, until_failure=True)
        if not pub.push_enabled:
            return None
        if self._pushed_events == self.trained_events and pub.holds(version):
            log.info("the final model (version %d, %d events) is acknowledged by serving", version,
                     self.trained_events)
            return version
        log.warning("the final model (%d events) is not acknowledged by serving (%s); serving keeps version %d",
                    self.trained_events, pub.unanswered(wait) if pub.busy or self._pushed_events == self.trained_events
                    else "its snapshot was not built", pub.version)
        return None

    def push(self) -> int | None:
        """Build a snapshot of the model as it is now and queue it for serving: a delta of the rows written
        since the last accepted push, or full when serving needs one. Its version, or None when the last
        push is still pending or the model's export is running (or building failed: logged, training goes on)."""
        plan = self.publisher.plan_next()
        if plan is None:
            return None
        try:
            rows, mark = self.store.snapshot_rows(plan)
            version = self.publisher.reserve_version()
            self.publisher.publish(version, mark, None, self.core.model, dict(self.offsets), self._metric_values(),
                                   self.core.newest_event_ms, plan=plan, rows=rows, evidence=self._evidence(),
                                   deleted=self.store.last_deleted)
            self._pushed_events, self._pushed_version = self.trained_events, version
            return version
        except Exception as e:
            self.publisher.request_full()  # the journal may be cut past what serving holds
            if is_resource_error(e):  # the machine's fault (disk full, read-only, no file handles): the run stops
                raise  # with the CLI's one line; a restart resumes from the last checkpoint, losing nothing
            log.exception("building a snapshot failed")  # any other snapshot failure never stops training
            return None

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.wait_idle(5.0)
            self.publisher.close()
        for c in (self.progress, self.metrics_log, self.trace):
            c.close()
        if self.prom is not None:
            self.prom.close()
        try:
            self.consumer.close()
        finally:
            if hasattr(self.hot, "close"):
                self.hot.close()
            self.store.close()
