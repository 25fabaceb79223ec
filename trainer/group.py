"""One rank of a trainer group: N processes, launched by torchrun, train ONE model.

- **Data parallel over Kafka partitions, statically**: rank r reads partitions
  ``p % N == r`` (assigned, never subscribed), so no rebalance moves a partition
  in the middle of a step. Fewer partitions than ranks is refused at start.
- **Row-wise sharded embeddings**: :class:`ShardedTrainerCore`; each rank has its own
  RocksDB shard (``store.path/rank-NNN``) and the hot rows it owns.
- **Lockstep**: each loop turn every rank polls its partitions, then one small
  ``all_reduce`` carries the turn's decisions: stop (any rank's signal), and, from
  rank 0's clock only, checkpoint / log / idle exit, and whether a new hot set
  follows (rank 0 follows the hot-set source and broadcasts it, so every rank
  switches at the same step boundary). Ranks with nothing to read join with an
  empty batch.
- **Coordinated checkpoint**: every rank writes its shard (``rank-NNN/ckpt-SEQ``,
  checksummed, atomic); rank 0 then writes the manifest ``ckpt-SEQ`` (world size,
  sharding function, every shard's digest, every partition's offset, hot-set
  version, dense weights and optimizer) and only after that commits the offsets
  of every partition. A crash anywhere in this leaves the previous manifest and
  its shards complete; on restart every rank checks its shard against the
  manifest, and the group falls back together when any shard does not verify.
- **Resharding**: a manifest of another world size (or a plain trainer's
  checkpoint) is resharded on start (:mod:`streamrec.trainer.reshard`).
- **Snapshots**: every ``serving.push_every_s`` (rank 0's clock, in the turn's decisions),
  not tied to the checkpoints: every rank sends the rows it owns that changed since the last
  accepted push (its own :class:`~.changes.ChangeJournal`) to rank 0, which builds and pushes
  one snapshot, so serving sees whole versions only. Every stop ends as a single trainer's does
  (:meth:`~.service.TrainerService.push_final`): rank 0 waits for a push still pending and decides
  whether the final model is to be built, every rank takes part in building it, and rank 0 waits
  for serving's answer.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from streamrec.foundation import StreamrecError, is_resource_error, sha256_file
from streamrec.foundation.failpoints import hit

from .checkpoint import (CHECKSUMS, INFLIGHT, STATE, CheckpointError, choose_checkpoint, highest_seq,
                         offsets_from_json, offsets_to_json, read_checkpoint, set_aside, verify_checkpoint,
                         write_checkpoint)
from .reshard import rank_dir, reshard_into, shard_checkpoints
from .batch_sizes import batch_sizes
from .run_loop import RunLoop, Turn
from .run_timers import Due, RunTimers
from .service import FINAL_PUSH_WAIT_S, TrainerService, open_store
from .sharded_core import ShardedTrainerCore
from .sharding import SHARDING

if TYPE_CHECKING:
    from streamrec.embedding_store.store_config import StoreConfig
    from streamrec.trainer.trainer_config import TrainerConfig

    from .trainer_settings import TrainerSettings

log = logging.getLogger(__name__)


# per-rank totals: each shard holds its rank's, the manifest their sum (all a resharded rank 0 takes over)
_RANK_COUNTERS = ("events", "hot_events", "nonfinite_batches", "rejected_events", "dead_letters", "quarantined",
                  "rows_expired")


SIGNAL_STOP_WAIT_S = 6.0  # each wait of a signalled group's final push (four of them fit torchrun's 30 s grace)


class GroupError(StreamrecError, RuntimeError):
    """A trainer group cannot start as configured (too few partitions, a shard it cannot read)."""


def assigned_partitions(n_partitions: int, rank: int, world: int) -> list[int]:
    """Static assignment: rank r reads partitions p with p % world == r."""
    return [p for p in range(n_partitions) if p % world == rank]


def rank_sections(store: StoreConfig, trainer: TrainerConfig, rank: int,
                  world: int) -> tuple[StoreConfig, TrainerConfig]:
    """The store and trainer sections one rank runs with: its own store directory and share of
    ``store.max_rows``; logs, metrics port, snapshots and the hot-set source on rank 0 only."""
    # each rank owns about 1/world of every table's rows: the cap is shared the same way
    max_rows = -(-store.max_rows // world) if store.max_rows > 0 else store.max_rows
    rank_store = dataclasses.replace(store, path=str(Path(store.path) / f"rank-{rank:03d}"), max_rows=max_rows)
    own = {"ranks": world, "trace_path": f"{trainer.trace_path}.rank{rank}" if trainer.trace_path else ""}
    if rank != 0:
        own.update(log_path="", metrics_port=0, snapshot_every=0)
    return rank_store, dataclasses.replace(trainer, **own)


def _merged_deletions(parts) -> dict[str, np.ndarray]:
    """Every rank's evicted ids per table as one sorted array per table (the ranks own disjoint ids)."""
    out: dict[str, list] = {}
    for d in parts:
        for t, ids in d.items():
            out.setdefault(t, []).extend(ids)
    return {t: np.unique(np.asarray(v, dtype=np.int64)) for t, v in out.items() if v}


def batch_mode(trainer_cfg: TrainerConfig, world: int) -> dict[str, Any]:
    """What a group checkpoint's manifest records about its batches: ``trainer.group_batch``, the events one
    rank trains per step and the group's (global) batch, so a restart can tell whether it would train
    with another batch than the model so far was trained with."""
    sizes = batch_sizes(trainer_cfg, world)
    return {"group_batch": trainer_cfg.group_batch, "rank_batch": sizes.step, "global_batch": sizes.global_step}


def check_batch_mode(manifest: dict, trainer_cfg: TrainerConfig, world: int, name: str = "the checkpoint") -> None:
    """Refuse to resume a group checkpoint with another ``trainer.group_batch`` than it was written with.

    The two modes give the same ``batch_size`` different meanings (the group's step, or each rank's), so
    a silent switch would change the global batch, and with it what the learning rates do, by a factor
    of N in the middle of a model's life. A switch that keeps the global batch (``"group"`` at 512 on 2
    ranks to ``"rank"`` at 256) trains the same steps and is allowed. Manifests written before the key
    existed were "group"; a plain trainer's checkpoint (no ``world``) has no mode and resumes in either.
    A world-size change in "rank" mode (a reshard) changes the global batch too: allowed, and logged."""
    if "world" not in manifest:
        return
    then = manifest.get("group_batch", "group")
    now = trainer_cfg.group_batch
    mine = batch_mode(trainer_cfg, world)
    old_global = manifest.get("global_batch")
    if then != now and (old_global is None or int(old_global) != mine["global_batch"]):
        raise GroupError(
            f"{name} was written by a group with trainer.group_batch={then!r} ({manifest.get('world')} ranks, "
            f"global batch {old_global if old_global is not None else '?'}); this group has "
            f"trainer.group_batch={now!r} ({world} ranks, global batch {mine['global_batch']}). Resuming would "
            f"change what trainer.batch_size means mid-training: set trainer.group_batch={then!r}, or, to "
            "switch on purpose, set trainer.batch_size for the new mode and start from a fresh "
            "trainer.checkpoint_dir (a plain trainer's checkpoint resumes in either mode)")
    if old_global is not None and int(old_global) != mine["global_batch"]:
        log.warning("%s was trained at a global batch of %d events per step; this group trains %d "
                    "(trainer.group_batch=%r, %d ranks x %d): the learning rates stay as configured", name,
                    int(old_global), mine["global_batch"], now, world, mine["rank_batch"])


def is_group_checkpoint(root: str | os.PathLike) -> int:
    """World size of the newest checkpoint under ``root`` when a trainer group wrote it, else 0."""
    from .checkpoint import latest_checkpoint

    import json

    p = latest_checkpoint(root)
    if p is None:
        return 0
    try:
        with open(p / STATE) as f:
            return int(json.load(f).get("world", 0))
    except (OSError, ValueError):
        return 0


def _topic_partitions(bootstrap: str, topic: str, timeout_s: float = 30.0, security: dict | None = None) -> int:
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id="streamrec-group-check", enable_auto_commit=False,
                      **(security or {}))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            parts = c.partitions_for_topic(topic)
            if parts:
                return len(parts)
            if time.monotonic() > deadline:
                raise GroupError(f"topic {topic!r} does not exist on {bootstrap}")
            time.sleep(0.2)
    finally:
        c.close()


def check_partitions(bootstrap: str, topic: str, world: int, security: dict | None = None) -> int:
    """The events topic's partition count; :class:`GroupError` when a group of ``world`` ranks would leave
    a rank without a partition."""
    n = _topic_partitions(bootstrap, topic, security=security)
    if n < world:
        raise GroupError(f"topic {topic!r} has {n} partition(s); a group of {world} trainer ranks needs at least "
                         f"{world} (one per rank): add partitions (kafka-topics.sh --alter --topic {topic} "
                         f"--partitions {world}) or run fewer ranks")
    return n


class GroupTrainerService(TrainerService):
    """Rank ``rank`` of a group of ``world``; ``torch.distributed`` must be initialised (torchrun does it)."""

    pins_training_crashes = False  # a step is a collective: a rank must not drop events of it on its own

    def __init__(self, settings: TrainerSettings, bootstrap: str, rank: int, world: int, stop=None,
                 progress: bool | None = None, pusher_factory=None, group=None):
        self.rank, self.world, self.group = int(rank), int(world), group
        self.root = Path(settings.trainer.checkpoint_dir)
        self.snapshot_every = settings.trainer.snapshot_every
        from streamrec.ingest import client_settings

        self.partitions = assigned_partitions(
            check_partitions(bootstrap, settings.kafka.events_topic, world, security=client_settings(settings.kafka)),
            rank, world)
        if settings.trainer.group_batch == "group" and settings.trainer.batch_size % world:
            log.warning("trainer.batch_size %d is not a multiple of %d ranks: a step trains %d events, not %d",
                        settings.trainer.batch_size, world, settings.trainer.batch_size // world * world, settings.trainer.batch_size)
        self.comm_device = torch.device("cpu") if dist.get_backend(group) == "gloo" else None
        rank_store, rank_trainer = rank_sections(settings.store, settings.trainer, rank, world)
        super().__init__(dataclasses.replace(settings, store=rank_store, trainer=rank_trainer), bootstrap, stop=stop,
                         progress=progress if rank == 0 else False, pusher_factory=pusher_factory if rank == 0 else None)
        self.core.hot_rows = 0  # the group's set arrives again from rank 0's source (the store keeps its rows)
        # row exchange, dense all-reduce and metrics bytes at the last record, and when it was made
        self.bytes_at_log = (0, 0, 0, 0.0)
        log.info("rank %d of %d: partitions %s of %r, store %s, resumed from %s", rank, world, self.partitions,
                 settings.kafka.events_topic, self.settings.store.path, self.resumed_from or "nothing (fresh start)")

    # -- the parts of TrainerService a rank replaces --------------------------------
    def _make_core(self):
        comm = self.comm_device if self.comm_device is not None else self.device
        c = self.settings
        return ShardedTrainerCore(c.model, c.trainer, self.store, self.device, self.rank, self.world, self.group,
                                  comm_device=comm, store_cfg=c.store, join=c.join, sizes=self.sizes)

    def _make_consumer(self):
        from streamrec.ingest import EventConsumer, EventSchema

        d = rank_dir(self.root, self.rank)
        d.mkdir(parents=True, exist_ok=True)
        return EventConsumer(self.bootstrap, self.settings.kafka, self.settings.ingest, EventSchema.from_sections(self.settings.model, self.settings.ingest),
                             group_id=self.settings.kafka.trainer_group, mode="assign",
                             partitions=self.partitions, inflight_path=d / INFLIGHT)

    def _restore_point(self, root: str):
        """The newest group checkpoint whose manifest and every shard verify; resharded when its
        world size differs. ``(manifest dir, state, dense)``; the store is opened in ``self.store``."""
        self.refused_checkpoints: list[str] = []
        while True:
            pick: list[Any] = [None]
            if self.rank == 0:
                ckpt, refused = choose_checkpoint(root)
                self.refused_checkpoints += refused
                if ckpt is not None:
                    try:
                        state, dense = read_checkpoint(ckpt)
                        pick = [(str(ckpt), state, dense)]
                    except (OSError, ValueError, RuntimeError, KeyError) as e:
                        if is_resource_error(e):
                            raise
                        set_aside(ckpt, f"cannot be loaded: {type(e).__name__}: {e}")
                        continue  # rank 0 alone; nothing was broadcast yet
            dist.broadcast_object_list(pick, src=0, group=self.group)
            if pick[0] is None:
                self._fresh_store()
                seen: list[Any] = [None] * self.world  # numbered after every checkpoint any rank sees (highest_seq)
                dist.all_gather_object(seen, highest_seq(root), group=self.group)
                return None, {"seq": max(seen)}, {}
            ckpt, state, dense = Path(pick[0][0]), pick[0][1], pick[0][2]
            check_batch_mode(state, self.settings.trainer, self.world, ckpt.name)  # every rank: the same manifest
            why = ""
            try:
                local = self._open_shard(ckpt, state)
            except (StreamrecError, OSError, ValueError, RuntimeError, KeyError) as e:
                if is_resource_error(e):
                    raise
                why = f"rank {self.rank}: {e}"
                local = None
            whys: list[Any] = [None] * self.world
            dist.all_gather_object(whys, why, group=self.group)
            bad = [w for w in whys if w]
            if not bad:
                return ckpt, self._merge_state(state, local), {**dense, **self._rank_dense}  # + this shard's own
            if hasattr(self, "store"):
                self.store.close()
            self.refused_checkpoints += bad
            if self.rank == 0 and ckpt.exists():
                set_aside(ckpt, "; ".join(bad))
            dist.barrier(group=self.group)

    def _fresh_store(self) -> None:
        from streamrec.embedding_store import EmbeddingStore
        self.store = EmbeddingStore.from_sections(self.settings.store, self.settings.model, self.settings.hot_budget,
                                                  self.device)

    def _open_shard(self, ckpt: Path, state: dict) -> dict | None:
        """Open this rank's store at the checkpoint: its own shard, or resharded from all of them. Its own
        shard's dense part (the PowerSGD error feedback, :mod:`.dense_sync`) goes to ``self._rank_dense``;
        after a reshard there is none."""
        self._rank_dense: dict = {}
        world_then = int(state.get("world", 1)) if "world" in state else 0
        if world_then == self.world:
            shard = rank_dir(self.root, self.rank) / ckpt.name
            verify_checkpoint(shard)  # CheckpointError names the file
            want = (state.get("shards") or {}).get(str(self.rank))
            if want and sha256_file(shard / CHECKSUMS) != want:
                raise CheckpointError(f"{shard}: not the shard manifest {ckpt.name} recorded (a leftover of a run "
                                      "that died before its manifest)")
            self.store = open_store(self.settings, self.device, shard)
            shard_state, rank_dense = read_checkpoint(shard)  # verified above, with the rest of the shard
            self._rank_dense = dict(rank_dense or {})
            return shard_state
        # another world size (or a plain trainer's checkpoint): every row to its new owner
        if Path(self.settings.store.path).exists():
            shutil.rmtree(self.settings.store.path)
        self._fresh_store()
        try:
            reshard_into(self.store, shard_checkpoints(self.root, ckpt, state), self.rank, self.world)
        except BaseException:
            self.store.close()
            del self.store
            raise
        log.warning("checkpoint %s was written by %s; resharded to %d ranks (rank %d holds its rows now)", ckpt.name,
                    f"{world_then} ranks" if world_then else "a single trainer", self.world, self.rank)
        return None

    def _merge_state(self, manifest: dict, shard: dict | None) -> dict:
        """What this rank resumes with: the manifest's offsets and versions; its own counters from its shard
        (after resharding, rank 0 carries the group's totals and the others start at 0)."""
        st = {k: manifest[k] for k in ("seq", "offsets", "topic_ids", "hot_version", "snapshot") if k in manifest}
        counters = shard if shard is not None else manifest if self.rank == 0 else {}
        st.update({k: counters[k] for k in _RANK_COUNTERS + ("newest_event_ms", "metrics") if k in counters})
        st.setdefault("hot_version", 0)
        return st

    # -- the loop (trainer/run_loop.py) ---------------------------------------------
    def run(self) -> dict[str, Any]:
        self._group_events = int(self._sum(self.core.events))
        reason = RunLoop(self, RunTimers(self.settings.trainer, self.settings.push_every_s, self._group_events)).run()
        if reason == "repartition":  # a non-zero exit: torchrun restarts the group, which re-plans the partitions
            raise GroupError(f"the topic {self.consumer.topic!r} gained partitions; checkpoint {self.seq} is written "
                             "and the group restarts to assign every partition")
        return {"reason": reason, "events": self._group_events, "checkpoint": self.seq, "rank": self.rank,
                "world": self.world, "auc": self.last_record.get("auc", float("nan")),
                "window_auc": self.last_record.get("window_auc", float("nan")),
                "dead_letters": self.last_record.get("dead_letters", 0)}

    @property
    def trained_events(self) -> int:
        return self._group_events

    def turn(self, timers: RunTimers) -> Turn:
        """One lockstep turn: every rank polls its partitions (``sizes.window``: its share of a group window),
        one ``all_reduce`` carries the decisions (rank 0's clock, every rank's stop and counts), every rank trains."""
        t = self.settings.trainer
        batch = self.consumer.poll_batch(self.sizes.window, timeout=0.2)
        r0 = self.rank == 0
        upd = self.hot.poll() if r0 else None
        due = timers.due(self._group_events, self.publisher.wants_full if self.publisher is not None else None) \
            if r0 else Due()
        n = len(batch) if batch is not None else 0
        # this rank's own partitions merged by event time (trainer/merge.py); a quiet poll releases all
        ready = self._merge(batch, time.monotonic()) if batch is not None else self.merger.drain()
        moved = self.consumer.partitions_changed is not None  # the topic gained partitions
        ctrl = torch.tensor([float(self.stop.is_set()), float(upd is not None), float(due.checkpoint),
                             float(due.log), float(due.idle), float(n), float(moved), float(due.push),
                             float(len(ready) if ready is not None else 0),
                             float(n == 0 and self.consumer.fetch_behind())], dtype=torch.float64)
        dist.all_reduce(ctrl, group=self.group)
        (stop_any, hot_any, ckpt_any, log_any, idle_any, n_group, moved_any, push_any,
         ready_group, behind_any) = (float(x) for x in ctrl)
        if hot_any:
            box = [upd]
            dist.broadcast_object_list(box, src=0, group=self.group)
            self.apply_hot_set(box[0])
        if batch is not None:
            self.hot.observe(batch)
        if ready_group:
            self._train(ready)
            hit("group.trained")  # the window is trained, its offsets not recorded
        if (n_group or ready_group or behind_any) and r0:  # idle: no events, and none known to wait on any rank
            timers.busy()
        if n_group:  # events waiting in a rank's merge are trained before the next checkpoint
            if batch is not None:
                self._record_trained(batch)
            self._group_events += int(n_group)
            timers.received()
        idle_any = idle_any and not (n_group or ready_group or behind_any)  # events came, or some are known to wait
        done = (stop_any and "stopped") or (moved_any and "repartition") or (idle_any and "idle") or (
            t.max_events and self._group_events >= t.max_events and "max_events")
        return Turn(Due(bool(ckpt_any), bool(push_any), bool(log_any), bool(idle_any)), str(done or ""))

    def wind_down(self, reason: str) -> None:
        """Nothing: what waits in the ranks' merges trains in the final checkpoint (:meth:`save`)."""

    def save(self) -> None:
        self._train_held()
        self.checkpoint()

    def push_due(self) -> bool:
        return self._push()

    def _final_wait_s(self) -> float:
        """Stopped by a signal, each wait of the final push is cut to ``SIGNAL_STOP_WAIT_S``: torchrun kills the
        ranks 30 s after it passes a SIGTERM on (the final checkpoint is written before the push either way)."""
        wait = min(self.settings.trainer.push_give_up_s, FINAL_PUSH_WAIT_S)
        return min(wait, SIGNAL_STOP_WAIT_S) if self.stop.is_set() else wait

    def _agree(self, wanted: bool) -> bool:
        """Rank 0's decision (it publishes), on every rank: the final snapshot is a collective."""
        box = [wanted if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return bool(box[0])

    def _build_final(self) -> bool:
        return self._push()

    def _train(self, ready) -> None:
        """Train this rank's window (a collective: every rank calls it, ``ready`` may be None).

        Afterwards the crash-loop marker says idle: the records handed out are in flight only until
        their window is trained, so a death later (in a checkpoint, a snapshot, a restart's first
        checkpoint) is not counted against them, and records that a run of such deaths happened to
        hold are never quarantined for it."""
        res = self.core.train_window(ready)
        if len(res.rejected):
            self.consumer.dead_letter_events(ready.take(res.rejected), res.reject_reason, source="trainer")
        self.consumer.step_done()
        self._maybe_evict()  # this rank's own store: no collective

    def _train_held(self) -> None:
        """Before a checkpoint (a collective): train what waits in every rank's merge, so a group's
        checkpoint holds no merge state and its offsets cover only trained events."""
        held = self.merger.drain()
        k = torch.tensor([float(len(held)) if held is not None else 0.0], dtype=torch.float64)
        dist.all_reduce(k, group=self.group)
        if float(k[0]):
            self._train(held)

    def _sum(self, *values: float) -> list[float] | float:
        x = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(x, group=self.group)
        out = [float(v) for v in x]
        return out[0] if len(out) == 1 else out

    # -- durability -------------------------------------------------------------
    def checkpoint(self) -> int:
        """The coordinated checkpoint: every shard, then rank 0's manifest, then rank 0's commit of every
        partition, then (every ``snapshot_every``) one snapshot of the whole model. A collective."""
        t0 = time.perf_counter()
        self._maybe_expire()
        self.consumer.flush_dead_letters()
        group_metrics = self.core.group_metrics()
        self.seq += 1
        seq = self.seq
        own = {k: v for k, v in self.offsets.items() if k[1] in self.partitions}
        epoch_box: dict[str, int] = {}

        def write_store(d: Path):
            epoch_box["epoch"] = int(self.store.checkpoint(d))
            hit("group.mid_shard")  # the store is written, the shard directory is not complete yet
            return {"epoch": epoch_box["epoch"]}

        shard_state = {"rank": self.rank, "world": self.world, "offsets": offsets_to_json(own), "ts": time.time(),
                       "dead_letters": self.consumer.stats.dead_letters, "quarantined": self.consumer.stats.quarantined,
                       "rows_expired": self.rows_expired, "rows_evicted": self.rows_evicted, **self.core.counters()}
        shard = write_checkpoint(rank_dir(self.root, self.rank), seq, shard_state, self.core.rank_dense_state(),
                                 write_store, keep=self.settings.trainer.keep_checkpoints)
        mine = {"rank": self.rank, "digest": sha256_file(shard / CHECKSUMS), "offsets": offsets_to_json(own),
                "events": self.core.events, "hot_events": self.core.hot_events,
                "newest_event_ms": self.core.newest_event_ms, "nonfinite_batches": self.core.nonfinite_batches,
                "rejected_events": self.core.rejected_events, "dead_letters": self.consumer.stats.dead_letters,
                "quarantined": self.consumer.stats.quarantined, "rows_expired": self.rows_expired,
                "topic_id": str(self.consumer.topic_id) if self.consumer.topic_id is not None else None}
        hit("group.shard_written")  # this shard is complete, the others maybe not, no manifest yet
        shards: list[Any] = [None] * self.world
        dist.all_gather_object(shards, mine, group=self.group)  # every shard is durable past this point
        offsets = dict(self.offsets)
        for s in shards:
            offsets.update(offsets_from_json(s["offsets"]))
        self.offsets = offsets
        if shards[0]["topic_id"]:
            self.topic_ids[self.consumer.topic] = shards[0]["topic_id"]
        if self.rank == 0:
            manifest = {
                "world": self.world, "sharding": SHARDING, "shards": {str(s["rank"]): s["digest"] for s in shards},
                **batch_mode(self.settings.trainer, self.world),
                "offsets": offsets_to_json(offsets), "topic_ids": dict(self.topic_ids), "ts": time.time(),
                "hot_version": self.core.hot_version, "metrics": group_metrics.state(),
                "snapshot": self.publisher.state() if self.publisher else {},
                **{k: sum(s[k] for s in shards) for k in _RANK_COUNTERS},
                "newest_event_ms": max(s["newest_event_ms"] for s in shards),
            }
            hit("group.before_manifest")
            dense = {**self.core.dense_state(), **self._evidence_memory()}
            path = write_checkpoint(self.root, seq, manifest, dense, lambda d: {"group": True},
                                    keep=self.settings.trainer.keep_checkpoints)
            hit("group.manifest_written")  # durable, offsets not committed yet
            self.consumer.mark_durable(offsets)  # rank 0 commits every partition, after the manifest
            hit("group.committed")
            if self.prom is not None:  # the whole coordinated checkpoint, as rank 0 saw it
                self.prom.checkpoint_seconds.observe(time.perf_counter() - t0)
            log.info("checkpoint %d at %d events (%d ranks) -> %s", seq, int(manifest["events"]), self.world, path)
        self.trace.write({"checkpoint": seq, "offsets": offsets_to_json(own), "events": self.core.events})
        if self.settings.push_every_s <= 0 and self.snapshot_every > 0 and seq % self.snapshot_every == 0:
            self._push(group_metrics)
        return seq

    def _push(self, metrics=None) -> bool:
        """One snapshot of the whole model as it is now (a collective): rank 0 decides full or delta, every
        rank sends its rows changed since the last accepted push and its partitions' offsets. False when
        no snapshot was built (a push is still pending, the model's export is running, or there is no
        publisher)."""
        if self.snapshot_every <= 0:
            return False
        plan: list[Any] = [self.publisher.plan_next() if self.publisher is not None else None]
        dist.broadcast_object_list(plan, src=0, group=self.group)
        if plan[0] is None:  # a push pending, the export running, no publisher: no snapshot now, on any rank
            return False
        if metrics is None:
            metrics = self.core.group_metrics()  # a collective
        tasks = self.core.group_task_figures() if len(self.core.task_names) > 1 else {}  # collectives too
        rows, mark = self.store.snapshot_rows(plan[0])
        mine = {"rows": _ipc(rows), "newest_event_ms": self.core.newest_event_ms,
                "deleted": {t: ids.tolist() for t, ids in self.store.last_deleted.items()},
                "newest_kafka_ms": self.freshness.newest_kafka_ms,
                "offsets": offsets_to_json({k: v for k, v in self.offsets.items() if k[1] in self.partitions})}
        hit("group.snapshot_rows")  # mid-snapshot: the rows are read, rank 0 has not got them
        got: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, got, dst=0, group=self.group)
        if self.rank != 0:
            return True
        offsets = dict(self.offsets)
        for g in got:
            offsets.update(offsets_from_json(g["offsets"]))
        values = {"auc": metrics.auc, "logloss": metrics.logloss, "window_auc": metrics.window_auc(),
                  **{f"{k}.{name}": f[k] for name, f in tasks.items() for k in ("auc", "logloss")},
                  "events": float(self._group_events),
                  # serving's Status: the served model's age by the Kafka clock (the group's newest record)
                  "newest_kafka_ms": float(max(g.get("newest_kafka_ms", 0) for g in got))}
        try:
            hit("group.snapshot_build")
            version = self.publisher.reserve_version()
            self.publisher.publish(version, mark, None, self.core.model, offsets, values,
                                   max(g["newest_event_ms"] for g in got), plan=plan[0],
                                   rows=(b for g in got for b in _batches(g["rows"])), evidence=self._evidence(),
                                   deleted=_merged_deletions(g.get("deleted") or {} for g in got))
            self._pushed_events, self._pushed_version = self._group_events, version
        except Exception:  # a snapshot failure must never stop training
            log.exception("building a snapshot failed")
            self.publisher.request_full()
        return True

    # -- telemetry --------------------------------------------------------------
    def emit(self) -> dict[str, Any]:
        """The group's figures (a collective); rank 0 logs, exports and shows them."""
        c, st = self.core, self.consumer.stats
        lag = self.consumer.lag()
        now = time.monotonic()
        (events, hot_events, dead, nonfinite, rejected, lag_sum, commit_f, quarantined, resets, row_bytes,
         dense_bytes, metric_bytes, evicted, unadmitted) = self._sum(
            c.events, c.hot_events, st.dead_letters, c.nonfinite_batches, c.rejected_events, max(lag, 0),
            st.commit_failures, st.quarantined, st.offsets_reset,
            c.exchange.bytes_sent, c.dense_bytes_sent, c.metrics_bytes_sent, self.rows_evicted, self._unadmitted())
        m = c.group_metrics()
        tasks = c.group_task_figures() if len(c.task_names) > 1 else None  # collectives: every rank calls them
        ev0, hot0 = self._hot_at_log
        dn = events - ev0
        self._hot_at_log = (events, hot_events)
        rec = {
            "ts": time.time(), "events": int(events), "auc": m.auc, "logloss": m.logloss,
            "window_auc": m.window_auc(), "window_logloss": m.window_logloss(),
            "events_per_s": self._rate.tick(int(events)), "hot_fraction": (hot_events - hot0) / dn if dn else float("nan"),
            "hot_coverage": self.hot_coverage, "hit_rate": self._hit_rate(), "hot_version": c.hot_version,
            "hot_rows": c.hot_rows, "dead_letters": int(dead),
            "snapshot_version": self.publisher.version if self.publisher else 0,
            "replicas_behind": len(self.publisher.left_behind) if self.publisher else 0,
            "checkpoint": self.seq, "lag": int(lag_sum), "rows_expired": self.rows_expired,
            "rows_evicted": int(evicted), "ids_unadmitted": int(unadmitted),
            "nonfinite_batches": int(nonfinite), "rejected_events": int(rejected),
            "commit_failures": int(commit_f), "rebalances": 0, "offsets_reset": int(resets),
            "quarantined": int(quarantined), "ranks": self.world,
            # what left the ranks since the last record, per event: the row exchange (rows out, their gradients
            # back, occurrence counts) and the dense gradients' all-reduce; their sum is the collective traffic
            "collective_bytes_per_event": (row_bytes + dense_bytes - sum(self.bytes_at_log[:2])) / dn
            if dn else float("nan"),
            "row_bytes_per_event": (row_bytes - self.bytes_at_log[0]) / dn if dn else float("nan"),
            "dense_bytes_per_event": (dense_bytes - self.bytes_at_log[1]) / dn if dn else float("nan"),
            # the group's own figures (this record's collectives) on the wire, per second since the last record
            "metrics_bytes_per_s": (metric_bytes - self.bytes_at_log[2]) / max(1e-9, now - self.bytes_at_log[3])
            if self.bytes_at_log[3] else float("nan"),
        }
        if tasks is not None:
            rec["tasks"] = tasks
        self.bytes_at_log = (row_bytes, dense_bytes, metric_bytes, now)
        if self.rank == 0:  # the other ranks' sinks are off (rank_sections); rank 0 shows the group's figures
            self._publish_record(rec)
        else:
            self.last_record = rec
        return rec


def _ipc(batches) -> bytes:
    import pyarrow as pa

    sink = io.BytesIO()
    writer = None
    for b in batches:
        if writer is None:
            writer = pa.ipc.new_stream(sink, b.schema)
        writer.write_batch(b)
    if writer is not None:
        writer.close()
    return sink.getvalue()


def _batches(payload: bytes):
    import pyarrow as pa

    if not payload:
        return
    yield from pa.ipc.open_stream(payload)
