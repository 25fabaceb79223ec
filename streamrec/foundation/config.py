"""One typed configuration for every part of streamrec.

Read from a TOML file, then overridden by ``STREAMREC_<SECTION>__<KEY>``
environment variables, then by ``--set section.key=value`` on the command line.
Every value is checked against its declared type; a bad value raises
:class:`ConfigError` naming the key and the problem. A key with a fixed set of values is
annotated with a ``typing.Literal`` alias from the ``*_types`` module of the package that
acts on it (``Codec`` from ``streamrec.ingest.ingest_types``, ...), and its section's
``__post_init__`` refuses anything else, so a config built in code is checked as a loaded one is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from streamrec.embedding_store.store_types import CacheAdmission, Eviction, Unadmitted
from streamrec.ingest.ingest_types import Codec, ConsumerMode, OffsetsLostPolicy, SaslMechanism, SecurityProtocol
from streamrec.joiner.join_types import JoinMode
from streamrec.model.model_types import Architecture
from streamrec.snapshot.snapshot_types import RowPrecision
from streamrec.trainer.trainer_types import Compression, DenseOptimizer, GroupBatch, HotSource, Precision, Schedule

from .errors import StreamrecError


class ConfigError(StreamrecError, ValueError):
    """A configuration key is unknown, missing or has a bad value."""


def _check_choice(section: str, obj: Any, key: str, allowed: Any) -> None:
    """Refuse ``obj.key`` unless it is one of the values of the ``Literal`` alias ``allowed``.

    The aliases live in the ``*_types`` module of the package that acts on the value, which checks
    against the same ``typing.get_args``: one list of allowed values, and an error that names the
    key, the value and every allowed value in one line."""
    value = getattr(obj, key)
    options = typing.get_args(allowed)
    if value not in options:
        raise ConfigError(f"{section}.{key}: must be one of {', '.join(options)}, got {value!r}")


@dataclass
class FieldSpec:
    """One sparse field of the model: one embedding table, one or more ids per event."""

    name: str
    dim: int = 0  # embedding row width of this field's table (0 = model.embedding_dim)
    table: str = ""  # the embedding table this field looks its ids up in ("" = its own table, named as the field); fields naming the same table share its rows and must have the same dim
    expected_ids: int = 0  # distinct ids expected in this table: rows start uniform in +-sqrt(1/expected_ids) (DLRM's rule); 0 = store.init_scale
    init_scale: float = 0.0  # explicit init scale of this table's rows (> 0 overrides expected_ids)

    def row_init_scale(self, default: float) -> float:
        """Half-width of this table's uniform initial rows: DLRM's ``sqrt(1 / rows)`` from ``expected_ids``."""
        if self.init_scale > 0:
            return float(self.init_scale)
        if self.expected_ids > 0:
            return float((1.0 / self.expected_ids) ** 0.5)
        return float(default)


@dataclass
class TaskSpec:
    """One prediction task of the model: a label name, one logit, one weighted loss term."""

    name: str
    weight: float = 1.0  # weight of this task's masked mean logloss in the training loss


@dataclass
class GeneratedField:
    """How the synthetic generator draws one field's ids. Not part of the model: it
    never changes ``model_hash``, so a model trained on generated events serves real ones."""

    name: str
    cardinality: int = 100_000  # distinct ids the generator draws from
    zipf: float = 1.1  # Zipf exponent of the id popularity
    multi: int = 1  # ids per event (1 = single-valued)


GENERATED_FIELD_KEYS = ("cardinality", "zipf", "multi")

MODEL_HASH_OPTIONAL = {"architecture": "dlrm", "module": "", "cross_layers": 3,
                       "tasks": [{"name": "click", "weight": 1.0}]}
"""``[model]`` keys that enter ``model_hash`` only when set away from their default: a DLRM's hash does
not depend on keys that did not exist when its checkpoints were written."""
FIELD_HASH_OPTIONAL = {"dim": 0, "table": ""}
"""``[[model.fields]]`` keys that enter ``model_hash`` only when set away from their default."""


@dataclass
class ModelConfig:
    fields: list[FieldSpec] = field(
        default_factory=lambda: [FieldSpec("user"), FieldSpec("item"), FieldSpec("category"), FieldSpec("tags")]
    )
    dense_dim: int = 4  # width of the dense feature vector of every event
    embedding_dim: int = 16  # embedding row width (all tables)
    bottom_mlp: list[int] = field(default_factory=lambda: [32, 16])  # bottom MLP layer sizes over dense features (empty: the raw features); dlrm: last = embedding_dim
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])  # top MLP hidden sizes (a 1-unit output layer is added); dcn_v2's deep part, deepfm's deep part, mlp's layers
    seed: int = 0  # seeds embedding initialisation: rows are a function of (table, id, seed); also the dense network's initial weights
    architecture: Architecture = "dlrm"  # the built-in dense network: dlrm (bottom MLP, pairwise dot interaction, top MLP) | dcn_v2 (cross network, then top_mlp) | deepfm (FM + first-order terms + a top_mlp deep part) | mlp (concatenate, then top_mlp)
    module: str = ""  # a user's own model builder as "package.module:function" (called with this section, returns a RankingModel); replaces architecture; must be importable where the trainer and serving run ("" = the built-in architecture)
    cross_layers: int = 3  # dcn_v2: full-rank cross layers x_{l+1} = x0 * (W x_l + b) + x_l before the top_mlp deep part (0 = none)
    tasks: list[TaskSpec] = field(default_factory=lambda: [TaskSpec("click")])  # the model's prediction tasks, one logit each, in output order; an event's `label` is the first task's label, `labels` names them

    def __post_init__(self) -> None:
        _check_choice("model", self, "architecture", Architecture)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def task_names(self) -> list[str]:
        """The tasks' names in output order: column ``t`` of the logits is task ``task_names[t]``."""
        return [t.name for t in self.tasks]

    @property
    def field_dims(self) -> dict[str, int]:
        """Per field, in field order, the width of its pooled embedding (its table's row width)."""
        return {f.name: f.dim or self.embedding_dim for f in self.fields}

    @property
    def field_tables(self) -> dict[str, str]:
        """Per field, the embedding table its ids are looked up in."""
        return {f.name: f.table or f.name for f in self.fields}

    @property
    def tables(self) -> dict[str, int]:
        """Every embedding table once, in order of first use, with its row width."""
        out: dict[str, int] = {}
        for f in self.fields:
            out.setdefault(f.table or f.name, f.dim or self.embedding_dim)
        return out

    @property
    def pooled_dim(self) -> int:
        """Width of the model's ``pooled`` input: the field dims summed."""
        return sum(self.field_dims.values())

    def init_scales(self, default: float) -> dict[str, float]:
        """Per table, the half-width of its uniform initial rows (``default``: ``store.init_scale``);
        a shared table takes the first of its fields that sets a scale."""
        out: dict[str, float] = {}
        for f in self.fields:
            t = f.table or f.name
            if t not in out or (out[t] == float(default) and (f.init_scale > 0 or f.expected_ids > 0)):
                out[t] = f.row_init_scale(default)
        return out


@dataclass
class KafkaConfig:
    bootstrap: str = ""  # Kafka bootstrap servers, host:port[,host:port...] ("" = start the embedded broker)
    events_topic: str = "events"  # topic of incoming events
    dlq_topic: str = "events.dlq"  # dead-letter topic: bad records with the reason in headers
    hotset_topic: str = "hot-set"  # compacted topic of versioned hot sets
    partitions: int = 4  # partitions of the events topic when streamrec creates it
    trainer_group: str = "streamrec-trainer"  # consumer group of the trainers
    sketch_group: str = "streamrec-sketch"  # consumer group (faust app id) of the sketch workers
    codec: Codec = "arrow"  # wire form a producer writes: arrow (one Arrow IPC stream of up to events_per_message events per message) | json (one JSON object per message)
    events_per_message: int = 512  # events per Arrow IPC message a producer writes (kafka.codec = arrow)
    max_poll_interval_ms: int = 15_000  # ms a group consumer may go between polls before the group drops it; also the rebalance timeout (long values slow group joins)
    consumer_mode: ConsumerMode = "group"  # group (join the consumer group) | assign (take every partition, no group join)
    on_offsets_lost: OffsetsLostPolicy = "fail"  # trainer and sketch worker: a resume position the log no longer holds (out of range, or the topic deleted and recreated): fail (stop, one line) | earliest | latest (resume there)
    connect_timeout_s: float = 30.0  # seconds a process waits for a broker at kafka.bootstrap before it gives up (one clear line, exit 1)
    security_protocol: SecurityProtocol = "PLAINTEXT"  # how every Kafka client connects (producers, consumers, admin, the sketch's faust app): PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: SaslMechanism = "PLAIN"  # SASL mechanism of the SASL_* protocols: PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    sasl_username: str = ""  # SASL user; the password is never a config key: env STREAMREC_KAFKA_SASL_PASSWORD or kafka.sasl_password_file
    sasl_password_file: str = ""  # file holding the SASL password (a mounted secret); else env STREAMREC_KAFKA_SASL_PASSWORD
    ssl_cafile: str = ""  # CA bundle (PEM) the brokers' certificates are checked against ("" = the system's CAs)
    ssl_certfile: str = ""  # client certificate (PEM) for mutual TLS; with ssl_keyfile
    ssl_keyfile: str = ""  # client private key (PEM)
    ssl_check_hostname: bool = True  # check that a broker's certificate names the host connected to
    fast_records: bool = True  # the trainer's consumer parses fetched record batches with aiokafka's C parser and hands them to the decoder as one run per fetch, no object per record (kafka-python's own parser on any doubt); false: kafka-python's pure-Python parser

    def __post_init__(self) -> None:
        for key, allowed in (("codec", Codec), ("consumer_mode", ConsumerMode), ("on_offsets_lost", OffsetsLostPolicy),
                             ("security_protocol", SecurityProtocol), ("sasl_mechanism", SaslMechanism)):
            _check_choice("kafka", self, key, allowed)


@dataclass
class IngestConfig:
    dense_abs_max: float = 1e9  # largest absolute dense value an event may carry; beyond it the record is dead-lettered (normalise features upstream)
    dlq_max_bytes: int = 900_000  # a dead letter keeps at most this many bytes of the bad record (its size and sha256 go in headers)


@dataclass
class StoreConfig:
    path: str = "data/store"  # directory of the trainer's sharded RocksDB cold tier
    shards: int = 4  # RocksDB shards (separate databases) in the cold tier
    block_cache_mb: int = 256  # RocksDB block cache shared by the shards (MiB)
    host_cache_rows: int = 100_000  # bounded host-memory cache of cold rows (0 = off)
    cache_admission: CacheAdmission = "frequency"  # host cache admission: frequency (TinyLFU-style: a missed row enters only if seen more often than what it would evict) | lru (every row)
    expire_after_s: float = 0.0  # seconds a cold row may go untouched before the trainer deletes it, swept at checkpoints (0 = never)
    adagrad_lr: float = 0.05  # row-wise Adagrad learning rate of embedding rows
    adagrad_eps: float = 1e-8  # row-wise Adagrad epsilon
    init_scale: float = 0.05  # rows start uniform in [-init_scale, init_scale], for a field with neither expected_ids nor init_scale
    admit_min_count: int = 0  # an id gets its own row once seen this many times in training (0 or 1 = every id at once; 2 on long-tail streams: docs/lean-tables.md)
    unadmitted: Unadmitted = "zero"  # what an id not admitted yet reads and trains: zero (nothing, no gradient) | shared (one learned row per table; one trainer only)
    admit_counter_mb: float = 8.0  # memory of each table's admission counters (count-min, 1 byte per counter); more = fewer ids admitted by collision
    max_rows: int = 0  # rows each table may hold over all tiers, RocksDB included (0 = no cap); a trainer group's rank holds its share
    eviction: Eviction = "lfu"  # which rows a table over max_rows loses: lfu (fewest lookups, decayed by age) | lru (least recently written)
    lfu_half_life_s: float = 3600.0  # lfu: a row's lookup count halves for every this many seconds since its last write
    evict_slack: float = 0.1  # a table may grow to max_rows * (1 + evict_slack) before a sweep cuts it back to max_rows

    def __post_init__(self) -> None:
        _check_choice("store", self, "cache_admission", CacheAdmission)
        _check_choice("store", self, "unadmitted", Unadmitted)
        _check_choice("store", self, "eviction", Eviction)


@dataclass
class SketchConfig:
    epsilon: float = 5e-5  # count-min error bound as a fraction of the total count (sets the width)
    delta: float = 1e-3  # probability that an estimate exceeds the epsilon bound (sets the depth)
    half_life_s: float = 600.0  # popularity counts halve every this many seconds of event time
    top_k: int = 20_000  # heavy-hitter candidates kept per sketch
    publish_interval_s: float = 5.0  # seconds between hot-set publications, at most
    change_fraction: float = 0.2  # fraction of the hot set's rows that, once changed, makes the worker publish early
    state_dir: str = "data/sketch"  # faust table state (RocksDB) of the sketch worker
    checkpoint_interval_s: float = 10.0  # seconds between snapshots of each partition's faust table (its size and build time: BENCHMARKS.md, e2e); a restart resumes from the last one
    batch_records: int = 10_000  # records the counting task reads and decodes per call
    sample_events: int = 20_000  # recent events kept to estimate hot-set coverage and hit rate
    sample_rate: float = 0.1  # fraction of events that enter that sample
    metrics_port: int = 0  # Prometheus HTTP port of the sketch worker, 0 = off
    metrics_host: str = "127.0.0.1"  # address the sketch worker's Prometheus endpoint binds (0.0.0.0 to publish it)


@dataclass
class HotConfig:
    budget_rows: int = 20_000  # rows kept on the device, over all tables
    budget_bytes: int = 0  # device bytes for hot rows, each row (its table's dim + 1) * 4 (weights + Adagrad); 0 = use budget_rows


@dataclass
class TrainerConfig:
    device: str = "auto"  # where the trainer computes and keeps hot rows: auto (cuda if present, else cpu) | cpu | cuda | cuda:N
    torch_threads: int = 0  # CPU threads for torch ops (0 = torch's default: all cores)
    batch_size: int = 256  # events per training mini-batch (the default's progressive AUC against other sizes: BENCHMARKS.md, quality)
    dense_optimizer: DenseOptimizer = "adam"  # optimizer of the dense (MLP) parameters: adam | adagrad
    dense_lr: float = 3e-3  # learning rate of the dense (MLP) parameters (the default against other rates: BENCHMARKS.md, quality)
    schedule: Schedule = "fae"  # mini-batch order: fae (hot mini-batches apart from cold ones, FAE) | arrival (arrival order, hot and cold mixed)
    hot_per_cold: int = 0  # trainer groups' per-window FAE plans: hot per cold mini-batch, 0 = in proportion (one trainer interleaves by arrival)
    checkpoint_dir: str = "data/checkpoints"  # where durable checkpoints go; offsets are committed only after one
    checkpoint_every_events: int = 50_000  # checkpoint after this many events ...
    checkpoint_every_s: float = 10.0  # ... or after this many seconds, whichever comes first (bounds what a crash re-trains)
    keep_checkpoints: int = 3  # complete checkpoints kept on disk
    snapshot_every: int = 1  # 0 = build no snapshots; with serving.push_every_s = 0, push one after every N checkpoints
    full_snapshot_every: int = 600  # every N-th snapshot is full, the rest deltas (with serving.push_every_s = 1: a full one every 10 minutes)
    metrics_window: int = 20_000  # events in the sliding AUC/logloss window
    metrics_port: int = 0  # Prometheus HTTP port of the trainer, 0 = off
    metrics_host: str = "127.0.0.1"  # address the Prometheus endpoint binds (0.0.0.0 to publish it, as in containers)
    log_path: str = ""  # JSON-lines metrics log ("" = none)
    max_events: int = 0  # stop after this many events (0 = run forever)
    idle_exit_s: float = 0.0  # stop after this long without events (0 = never)
    ranks: int = 1  # trainer ranks that train one model together (streamrec train --nproc N on one host)
    exchange_precision: Precision = "fp32"  # trainer groups: rows and row gradients on the wire, fp32 | bf16 | fp16 (owners keep fp32; bf16 halves the sparse bytes)
    dense_allreduce_precision: Precision = "fp32"  # trainer groups: the dense gradients' all-reduce, fp32 | bf16 | fp16 (fp16 with a dynamic scale, fp32 again on overflow)
    dense_allreduce_compression: Compression = "none"  # trainer groups: none (the exact sum) | powersgd (low-rank P Q^T of each large weight gradient with error feedback, torch's powerSGD_hook; biases and small layers summed as they are)
    powersgd_rank: int = 4  # dense_allreduce_compression=powersgd: the approximation's rank (1-4 typical; bytes grow with it)
    powersgd_start_iter: int = 100  # dense_allreduce_compression=powersgd: applied dense steps summed uncompressed first (torch's start_powerSGD_iter)
    group_batch: GroupBatch = "group"  # trainer groups: what batch_size counts, group (one group step trains batch_size events, batch_size // N per rank: the model one trainer trains) | rank (each rank trains batch_size per step: the global batch is N x batch_size, less CPU per event; learning rates unchanged, see README "Scaling out")
    max_restarts: int = 1000  # times a group restarts from its last checkpoint after a rank dies (torchrun)
    group_timeout_s: float = 300.0  # a trainer group's collectives and rendezvous store give up on a silent rank after this long (a cut link); the group then restarts from its last checkpoint
    window_batches: int = 8  # an event waits at most batch_size * window_batches arrivals for its hot/cold mini-batch to fill; also the poll size
    hot_wait_batches: float = 2.5  # FAE: a hot event waits at most batch_size * hot_wait_batches arrivals for a full hot mini-batch, else trains with the cold ones in arrival order (>= window_batches: every hot event waits for the hot batch, which may train partial)
    merge_wait_ms: float = 200.0  # ms after which a partition that delivered nothing no longer holds back the merge of partitions by event time (0 = no merge, partition after partition)
    merge_max_events: int = 200_000  # ... and an event waiting in the merge is trained anyway once this many events arrived after it (bounds memory)
    hot_source: HotSource = "topic"  # where the hot set comes from: topic (follow the sketch's hot-set topic) | sample (count in-process) | none (no hot set)
    hot_sample_events: int = 50_000  # hot_source=sample: events counted before choosing the hot set
    hot_refresh_events: int = 0  # hot_source=sample: re-count every N events (0 = choose once)
    log_every_s: float = 2.0  # seconds between metrics-log records / progress updates
    snapshot_dir: str = "data/snapshots"  # where serving snapshots are built before the push
    push_snapshots: bool = True  # push snapshots to serving.push_targets / serving.target when one is set (false, or neither set: only build them)
    until_end: bool = False  # stop at the end of the stream as it was at start (a finite replay), after a final checkpoint
    push_give_up_s: float = 120.0  # a replica still missing a snapshot after this long is left behind (others move on; it gets a full one when back)
    trace_path: str = ""  # JSON-lines debug file of trained Kafka offset ranges ("" = none)
    fake_negative_correction: bool = True  # join.mode = fake_negative streams: weigh positives (1 + f) and fake negatives (1 - f)(1 + f), f = the model's own detached probability (Ktena et al. 2019); false = the naive loss
    delayed_max_held: int = 1_000_000  # fake_negative streams: progressive scores held for a possible positive (one per impression, until join.window_s + join.allowed_lateness_s of event time pass); past this, the oldest are counted as negatives

    def __post_init__(self) -> None:
        for key, allowed in (("dense_optimizer", DenseOptimizer), ("schedule", Schedule),
                             ("exchange_precision", Precision), ("dense_allreduce_precision", Precision),
                             ("dense_allreduce_compression", Compression), ("group_batch", GroupBatch),
                             ("hot_source", HotSource)):
            _check_choice("trainer", self, key, allowed)


@dataclass
class ExperimentSpec:
    """One arm of the A/B split: a model line and its share of the traffic."""

    line: str
    share: float = 0.0  # share of requests routed to this line (all entries' shares sum to 1)


MODEL_LINE_RE = r"[a-z][a-z0-9_-]{0,31}"
"""A model line's name: lower-case letters, digits, ``_`` and ``-``, at most 32 characters."""


@dataclass
class GuardConfig:
    enabled: bool = True  # promote a pushed version only when its quality evidence passes these checks; a push without evidence is refused (INVALID_ARGUMENT)
    min_events: int = 500  # labelled events since the previous version needed to judge it on them; fewer: judged on the trainer's longer window (trainer.metrics_window events)
    logloss_margin: float = 0.1  # hold a version whose logloss is more than this share above the promoted versions' (EWMA); 0.1 = 10% worse
    auc_margin: float = 0.03  # hold a version whose progressive AUC is more than this below the promoted versions' (EWMA)
    calibration_min: float = 0.75  # hold a version whose mean prediction / label rate is below this
    calibration_max: float = 1.33  # hold a version whose mean prediction / label rate is above this
    label_rate_tolerance: float = 0.5  # hold a version whose label rate is off the promoted versions' (EWMA) by more than this share of it
    label_rate_floor: float = 0.02  # ... or by more than this absolute difference, whichever is larger (rare labels)
    dead_letter_share_max: float = 0.05  # hold a version when more than this share of records since the previous one was dead-lettered
    zero_share_jump: float = 0.3  # hold when the share of all-zero dense vectors, or of zeros in one dense column, is this much above its history
    empty_share_jump: float = 0.3  # hold when a field's share of events without ids is this much above its history
    novel_share_jump: float = 0.3  # hold when a field's share of ids the trainer has not seen lately is this much above its history
    history_weight: float = 0.2  # weight of each promoted version in the histories (EWMA) the checks compare with
    recovery_versions: int = 3  # after a hold, this many versions in a row must pass before the newest is promoted (a model damaged by an incident recovers gradually; noise lets one version through)


@dataclass
class ServingConfig:
    host: str = "127.0.0.1"  # address the gRPC server binds (0.0.0.0 in containers)
    port: int = 50051  # gRPC port (0 = any free port)
    metrics_port: int = 0  # Prometheus HTTP port of the serving process, 0 = off
    metrics_host: str = "127.0.0.1"  # address serving's Prometheus endpoint binds (0.0.0.0 to publish it, as in containers)
    target: str = ""  # where clients connect and the trainer pushes: host:port ("" = clients use host:port above, the trainer pushes nowhere)
    push_targets: str = ""  # every replica the trainer pushes snapshots to, comma-separated host:port ("" = target)
    push_every_s: float = 1.0  # the trainer pushes a delta of the rows changed since its last push this often (0 = only after checkpoints)
    data_dir: str = "data/serving"  # serving's staging area and its own RocksDB copy of the rows
    push_token: str = ""  # bearer token PushSnapshot requires; "" = none, refused on a non-loopback host unless `serve --insecure-push`
    predict_token: str = ""  # bearer token Predict requires ("" = none); health and reflection never need it
    status_needs_token: bool = False  # Status requires predict_token too (when one is set)
    reflection: bool = True  # offer gRPC server reflection (grpc.reflection.v1 and v1alpha)
    tls_cert: str = ""  # server certificate (PEM) to serve TLS; with tls_key
    tls_key: str = ""  # server private key (PEM)
    tls_ca: str = ""  # clients verify the server against this CA
    max_message_mb: int = 8  # gRPC message size limit (MiB) of every RPC, both directions; bigger -> RESOURCE_EXHAUSTED from gRPC itself
    max_request_kb: int = 4096  # bytes of one Predict request (KiB), checked before it is parsed; more -> RESOURCE_EXHAUSTED
    max_batch: int = 4096  # events per Predict request; more -> INVALID_ARGUMENT naming the field
    max_ids_per_event: int = 1024  # ids in one event, all fields together; more -> INVALID_ARGUMENT naming the event
    max_ids_per_request: int = 131_072  # ids in one Predict request, all events and fields; more -> INVALID_ARGUMENT
    max_concurrent_requests: int = 64  # Predict calls admitted at once (running or waiting for a worker); more -> RESOURCE_EXHAUSTED at once
    heavy_request_cost: int = 8192  # a Predict with more ids + events than this is heavy: scored apart, one at a time (0 = no heavy lane)
    max_concurrent_heavy: int = 2  # heavy Predict calls admitted at once (one scoring, the rest waiting); more -> RESOURCE_EXHAUSTED
    refusal_delay_ms: int = 100  # a client address refused more than 10 times a second (past a burst of 10) gets its refusals this much later (slows floods; 0 = off)
    merge_max_events: int = 4096  # Predict requests queued while another is scored are scored together, up to this many events (0 = never merge)
    hot_rows: int = 100_000  # rows serving keeps in memory
    workers: int = 8  # gRPC threads that run Predict (health, Status, pushes and refusals have their own few)
    processes: int = 1  # server processes sharing serving.port (Linux SO_REUSEPORT), each with its own model copy; a push to one reaches all
    torch_threads: int = 0  # CPU threads for torch ops (0 = torch's default: all cores)
    max_snapshot_mb: int = 65_536  # a pushed snapshot's files together (MiB), from its manifest, before any byte is stored
    max_model_fields: int = 1024  # sparse fields a pushed model may have
    max_embedding_dim: int = 1024  # embedding_dim a pushed model may have
    max_model_params: int = 100_000_000  # dense parameters a pushed model may have (counted from its config before any allocation)
    max_version_jump: int = 1_000_000  # a push may be at most this many versions ahead of the served one
    keep_versions: int = 3  # promoted versions kept loaded for `streamrec rollback` (the served one included)
    guard: GuardConfig = field(default_factory=GuardConfig)  # [serving.guard]: the quality gate on promotion
    model_line: str = "main"  # the model line this trainer's pushes name (a snapshot manifest's model_line); serving keeps versions, guard and rollback per line
    experiments: list[ExperimentSpec] = field(default_factory=list)  # [[serving.experiments]] line + share: the A/B split of Predict traffic over model lines (shares sum to 1; empty = every request on main)
    split_field: str = "user"  # what routes a request in the split: a sparse field (its first id in the first event) or "request_id"
    shadow_line: str = ""  # a model line scored on the same requests as the answering line, never returned, compared ("" = none)
    shadow_max_pending: int = 64  # requests waiting for their shadow scoring at most; more are not shadow-scored (counted)
    row_precision: RowPrecision = "fp32"  # embedding rows in snapshots, deltas and serving's memory: fp32 | fp16 | int8 (row-wise scale and bias); training stays fp32

    def __post_init__(self) -> None:
        _check_choice("serving", self, "row_precision", RowPrecision)


@dataclass
class GeneratorConfig:
    events: int = 200_000  # events `streamrec generate/produce --synthetic` makes by default
    seed: int = 7  # generator seed: the same seed gives the same stream
    label_noise: float = 1.0  # temperature of the hidden logistic model: > 1 gives noisier labels, lower Bayes AUC
    base_rate: float = 0.25  # approximate click rate
    start_ts_ms: int = 1_700_000_000_000  # event time of the first generated event
    events_per_s: float = 1000.0  # events per second of simulated event time (ts advances 1000 / events_per_s ms per event)
    conversion_rate: float = 0.03  # approximate share of events that convert, when the model has a task named "conversion" (a conversion is drawn only for a clicked event, from its own hidden logistic model)
    conversion_labelled: float = 0.1  # share of events that carry the conversion label, when the model has a "conversion" task; the others have it missing (masked)
    fields: list[GeneratedField] = field(  # per model field: id cardinality, Zipf skew, ids per event
        default_factory=lambda: [
            GeneratedField("user", cardinality=200_000, zipf=1.05),
            GeneratedField("item", cardinality=100_000, zipf=1.2),
            GeneratedField("category", cardinality=1_000, zipf=1.1),
            GeneratedField("tags", cardinality=5_000, zipf=1.1, multi=3),
        ]
    )

    def field(self, name: str) -> GeneratedField:
        """How ``name`` is drawn: its ``generator.fields`` entry, else the defaults."""
        for f in self.fields:
            if f.name == name:
                return f
        return GeneratedField(name)


@dataclass
class JoinConfig:
    mode: JoinMode = "window"  # window (one example per impression: a positive when its action arrives in the window, a negative when the window closes in event time) | fake_negative (a negative at once, a positive when the action arrives)
    impressions_topic: str = "impressions"  # topic of unlabelled events (request_id required), keyed by request_id
    actions_topic: str = "actions"  # topic of actions (request_id, ts, type, optional value), keyed by request_id; co-partitioned with impressions_topic
    group: str = "streamrec-joiner"  # consumer group (faust app id) of the joiner workers
    label_action: str = "click"  # the action type that makes an impression a positive (single-task output: `label`)
    task_actions: str = ""  # multi-task output: "task=action_type,..." (e.g. "click=click,conversion=conversion"); each task's label is 1 when its action arrived in the window ("" = label_action only)
    window_s: float = 3600.0  # attribution window: an action counts when its ts is at most this many seconds after the impression's ts (event time)
    allowed_lateness_s: float = 60.0  # the window closes when the actions' event-time watermark passes impression ts + window_s + this
    orphan_wait_s: float = 300.0  # an action that arrives before its impression waits until the impressions' watermark passes its ts + this (event time)
    state_dir: str = "data/joiner"  # faust table state (RocksDB) of the joiner
    batch_records: int = 2000  # input records joined per state commit (one atomic write per partition and batch: its examples are acknowledged before it; that write holds the batch's state changes: they must fit the changelog topic's max.message.bytes)
    metrics_port: int = 0  # Prometheus HTTP port of the joiner, 0 = off
    metrics_host: str = "127.0.0.1"  # address the joiner's Prometheus endpoint binds (0.0.0.0 to publish it)

    def __post_init__(self) -> None:
        _check_choice("join", self, "mode", JoinMode)

    @property
    def tasks(self) -> dict[str, str]:
        """Task name -> the action type that labels it, in output order (``task_actions``, else the one
        ``label_action`` task named as its action type)."""
        if not self.task_actions.strip():
            return {self.label_action: self.label_action}
        out: dict[str, str] = {}
        for item in self.task_actions.split(","):
            task, _, action = item.strip().partition("=")
            out[task.strip()] = action.strip()
        return out


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    sketch: SketchConfig = field(default_factory=SketchConfig)
    hot: HotConfig = field(default_factory=HotConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    join: JoinConfig = field(default_factory=JoinConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_hash(self) -> str:
        """Hash of what makes two models compatible (fields, sizes, seed)."""
        model = dataclasses.asdict(self.model)
        for key, default in MODEL_HASH_OPTIONAL.items():  # at their defaults they leave an older model's hash as it was
            if model.get(key) == default:
                del model[key]
        for f in model["fields"]:  # per-field keys likewise
            for key, default in FIELD_HASH_OPTIONAL.items():
                if f.get(key) == default:
                    del f[key]
        blob = json.dumps(model, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def serving_target(self) -> str:
        return self.serving.target or f"{self.serving.host}:{self.serving.port}"

    def push_targets(self) -> list[str]:
        """Where the trainer pushes snapshots: ``serving.push_targets`` (deduplicated), else ``serving_target()``."""
        return list(dict.fromkeys(_split_targets(self.serving.push_targets))) or [self.serving_target()]


def _split_targets(value: str) -> list[str]:
    """The non-empty entries of a comma-separated ``host:port`` list."""
    return [t for t in (t.strip() for t in value.split(",")) if t]


ENV_PREFIX = "STREAMREC_"

# keys that existed once, with what to do instead (a plain "unknown key" would leave the user guessing)
_REMOVED: dict[tuple[type, str], str] = {
    (KafkaConfig, "sasl_password"): "is not a config key (a config is printed and copied to child processes): put "
                                    "the password in env STREAMREC_KAFKA_SASL_PASSWORD or a file named by "
                                    "kafka.sasl_password_file",
    (HotConfig, "row_bytes"): "removed; a hot row costs (its table's dim + 1) * 4 device bytes (weights + "
                              "Adagrad), the size the store allocates, and hot.budget_bytes is divided by that",
    **{(FieldSpec, k): "belongs to the synthetic generator: set it in [[generator.fields]] (same name), not on "
                       "[[model.fields]]" for k in GENERATED_FIELD_KEYS},
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert strings from env/CLI."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} matches none of {tp}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(tp, type) and isinstance(value, tp):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{key}: expected a table, got {value!r}") from e
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {type(value).__name__} {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and number == number:  # NaN passes every "x <= 0" range check: refuse it here
            return number
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if origin is typing.Literal:  # a string here; which strings: the section's __post_init__, beside the field
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, typing.get_args(tp)))}, got "
                          f"{type(value).__name__} {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown and (cls, unknown[0]) in _REMOVED:
        raise ConfigError(f"{prefix + '.' if prefix else ''}{unknown[0]}: {_REMOVED[cls, unknown[0]]}")
    if unknown:
        where = f"[{prefix}]" if prefix else "top level"
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}; known keys: {', '.join(sorted(names))}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: missing required key")
    obj = cls(**kwargs)
    _validate(obj, prefix)
    return obj


def _validate(obj: Any, prefix: str) -> None:
    """Semantic checks beyond types."""

    def bad(key: str, msg: str) -> None:
        raise ConfigError(f"{prefix + '.' if prefix else ''}{key}: {msg}")

    if isinstance(obj, ModelConfig):
        if not obj.fields:
            bad("fields", "at least one sparse field is needed")
        names = [f.name for f in obj.fields]
        if len(set(names)) != len(names):
            bad("fields", f"duplicate field names in {names}")
        if obj.dense_dim < 0:
            bad("dense_dim", "must be >= 0")
        if obj.embedding_dim <= 0:
            bad("embedding_dim", "must be > 0")
        if (obj.architecture == "dlrm" and not obj.module and obj.bottom_mlp
                and obj.bottom_mlp[-1] != obj.embedding_dim):
            bad("bottom_mlp", f"last layer must equal embedding_dim ({obj.embedding_dim}) for the dot interaction")
        if obj.cross_layers < 0:
            bad("cross_layers", "must be >= 0")
        if obj.module and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", obj.module):
            bad("module", f"{obj.module!r} is not an import path of the form 'package.module:builder'")
        if not obj.tasks:
            bad("tasks", "at least one task is needed")
        task_names = [t.name for t in obj.tasks]
        if len(set(task_names)) != len(task_names):
            bad("tasks", f"duplicate task names in {task_names}")
        table_dims: dict[str, tuple[str, int]] = {}
        for f in obj.fields:
            t, d = f.table or f.name, f.dim or obj.embedding_dim
            if t in table_dims and table_dims[t][1] != d:
                bad("fields", f"fields {table_dims[t][0]!r} and {f.name!r} share table {t!r} but have dims "
                              f"{table_dims[t][1]} and {d}: a shared table has one row width")
            table_dims.setdefault(t, (f.name, d))
        own = {f.name for f in obj.fields if not f.table or f.table == f.name}
        for f in obj.fields:
            if f.table and f.table != f.name and f.table in obj.field_names and f.table not in own:
                bad("fields", f"field {f.name!r} names table {f.table!r}, which is a field that looks up another "
                              "table: name that table instead")
    elif isinstance(obj, TaskSpec):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", obj.name):
            bad("name", f"{obj.name!r} is not a valid task name (letters, digits, _; at most 64)")
        if not (0 < obj.weight <= 1e6):
            bad("weight", f"must be in (0, 1e6], got {obj.weight!r}")
    elif isinstance(obj, FieldSpec):
        if not obj.name or not obj.name.replace("_", "").replace("-", "").isalnum():
            bad("name", f"{obj.name!r} is not a valid field name")
        if obj.dim < 0:
            bad("dim", "must be >= 0 (0 = model.embedding_dim)")
        if obj.table and not obj.table.replace("_", "").replace("-", "").isalnum():
            bad("table", f"{obj.table!r} is not a valid table name")
        if obj.expected_ids < 0:
            bad("expected_ids", "must be >= 0 (0 = use store.init_scale)")
        if not 0 <= obj.init_scale <= 1e3:
            bad("init_scale", "must be in [0, 1000] (0 = from expected_ids)")
    elif isinstance(obj, GeneratedField):
        if obj.cardinality < 1 or obj.cardinality > 10**9:
            bad("cardinality", "must be in 1..1e9")
        if obj.zipf <= 0:
            bad("zipf", "must be > 0")
        if obj.multi < 1:
            bad("multi", "must be >= 1")
    elif isinstance(obj, KafkaConfig):
        if obj.partitions < 1:
            bad("partitions", "must be >= 1")
        if obj.events_per_message < 1:
            bad("events_per_message", "must be >= 1")
        if obj.connect_timeout_s <= 0:
            bad("connect_timeout_s", "must be > 0")
        if obj.security_protocol.startswith("SASL_") and not obj.sasl_username:
            bad("sasl_username", f"security_protocol {obj.security_protocol} needs a SASL user name")
        if bool(obj.ssl_certfile) != bool(obj.ssl_keyfile):
            bad("ssl_certfile", "ssl_certfile and ssl_keyfile must be given together (mutual TLS)")
        for key in ("events_topic", "dlq_topic", "hotset_topic"):  # Kafka's own rule, checked here, not at
            name = getattr(obj, key)  # the first dead letter or hot set, long after start-up
            if not (0 < len(name) <= 249 and name not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", name)):
                bad(key, f"{name!r} is not a legal Kafka topic name (1-249 of ASCII letters, digits, '.', '_', '-')")
    elif isinstance(obj, JoinConfig):
        _check_metrics_endpoint(obj, bad)
        for key in ("impressions_topic", "actions_topic"):
            name = getattr(obj, key)
            if not (0 < len(name) <= 249 and name not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", name)):
                bad(key, f"{name!r} is not a legal Kafka topic name (1-249 of ASCII letters, digits, '.', '_', '-')")
        if obj.impressions_topic == obj.actions_topic:
            bad("actions_topic", "must differ from join.impressions_topic")
        if not obj.label_action:
            bad("label_action", "must name an action type")
        if obj.task_actions.strip():
            for item in obj.task_actions.split(","):
                task, eq, action = item.strip().partition("=")
                if not eq or not task.strip() or not action.strip():
                    bad("task_actions", f"{item.strip()!r} is not task=action_type")
            tasks = [i.strip().partition("=")[0].strip() for i in obj.task_actions.split(",")]
            if len(set(tasks)) != len(tasks):
                bad("task_actions", f"duplicate task names in {tasks}")
        if obj.window_s <= 0:
            bad("window_s", "must be > 0")
        if obj.batch_records < 1:
            bad("batch_records", "must be >= 1")
        for key in ("allowed_lateness_s", "orphan_wait_s"):
            if getattr(obj, key) < 0:
                bad(key, "must be >= 0")
    elif isinstance(obj, IngestConfig):
        if not 0 < obj.dense_abs_max <= 3e38:
            bad("dense_abs_max", "must be in (0, 3e38] (float32's range)")
        if obj.dlq_max_bytes < 1024:
            bad("dlq_max_bytes", "must be >= 1024")
    elif isinstance(obj, StoreConfig):
        if not 1 <= obj.shards <= 256:
            bad("shards", "must be in 1..256")
        if not 0 <= obj.admit_min_count <= 255:
            bad("admit_min_count", "must be in 0..255 (0 = admit every id)")
        if not 0.01 <= obj.admit_counter_mb <= 65_536:
            bad("admit_counter_mb", "must be in 0.01..65536 MiB")
        if obj.max_rows < 0:
            bad("max_rows", "must be >= 0 (0 = no cap)")
        if obj.lfu_half_life_s <= 0:
            bad("lfu_half_life_s", "must be > 0")
        if not 0 <= obj.evict_slack <= 10:
            bad("evict_slack", "must be in 0..10")
    elif isinstance(obj, SketchConfig):
        _check_metrics_endpoint(obj, bad)
        if not 0 < obj.epsilon < 1:
            bad("epsilon", "must be in (0, 1)")
        if not 0 < obj.delta < 1:
            bad("delta", "must be in (0, 1)")
        if obj.half_life_s <= 0:
            bad("half_life_s", "must be > 0")
        if obj.top_k < 1:
            bad("top_k", "must be >= 1")
        if obj.batch_records < 1:
            bad("batch_records", "must be >= 1")
        for key in ("publish_interval_s", "checkpoint_interval_s"):  # 0 would publish/snapshot on every record
            if getattr(obj, key) <= 0:
                bad(key, "must be > 0")
        if not 0 < obj.change_fraction <= 1:
            bad("change_fraction", "must be in (0, 1]")
        if obj.sample_events < 0:
            bad("sample_events", "must be >= 0")
        if not 0 <= obj.sample_rate <= 1:
            bad("sample_rate", "must be in [0, 1]")
    elif isinstance(obj, GeneratorConfig):
        names = [f.name for f in obj.fields]
        if len(set(names)) != len(names):
            bad("fields", f"duplicate field names in {names}")
        if obj.label_noise <= 0:
            bad("label_noise", "must be > 0")
        if not 0 < obj.base_rate < 1:
            bad("base_rate", "must be in (0, 1)")
        if obj.events_per_s <= 0:
            bad("events_per_s", "must be > 0")
    elif isinstance(obj, TrainerConfig):
        if obj.batch_size < 1:
            bad("batch_size", "must be >= 1")
        if obj.push_give_up_s <= 0:
            bad("push_give_up_s", "must be > 0")
        if not 1 <= obj.ranks <= 4096:
            bad("ranks", "must be in 1..4096")
        if obj.max_restarts < 0:
            bad("max_restarts", "must be >= 0")
        if not 5 <= obj.group_timeout_s <= 86_400:
            bad("group_timeout_s", "must be in 5..86400 seconds")
        if obj.max_events < 0:
            bad("max_events", "must be >= 0 (0 = run forever)")
        if obj.idle_exit_s < 0:
            bad("idle_exit_s", "must be >= 0 (0 = never)")
        if obj.window_batches < 1:
            bad("window_batches", "must be >= 1")
        if not obj.hot_wait_batches >= 1:
            bad("hot_wait_batches", "must be >= 1 (a hot batch needs batch_size arrivals to fill)")
        if obj.merge_wait_ms < 0:
            bad("merge_wait_ms", "must be >= 0 (0 = no merge)")
        if obj.merge_max_events < 1:
            bad("merge_max_events", "must be >= 1")
        if not 1 <= obj.powersgd_rank <= 64:
            bad("powersgd_rank", f"must be in 1..64 (the rank of each compressed gradient's approximation), got "
                                 f"{obj.powersgd_rank!r}")
        if obj.powersgd_start_iter < 0:
            bad("powersgd_start_iter", f"must be >= 0 (0 = compress from the first step), got {obj.powersgd_start_iter!r}")
        if obj.device != "auto" and not (obj.device == "cpu" or obj.device.startswith("cuda")):
            bad("device", f"must be auto, cpu or cuda[:N], got {obj.device!r}")
        if not 0 <= obj.metrics_port <= 65535:
            bad("metrics_port", "must be in 0..65535 (0 = off)")
        if not obj.metrics_host.strip():
            bad("metrics_host", "must be an address (127.0.0.1 keeps the endpoint on this machine)")
    elif isinstance(obj, ServingConfig):
        if not 0 <= obj.port <= 65535:
            bad("port", "must be in 0..65535")
        _check_metrics_endpoint(obj, bad)
        if bool(obj.tls_cert) != bool(obj.tls_key):
            bad("tls_cert", "tls_cert and tls_key must be given together")
        if obj.merge_max_events < 0:
            bad("merge_max_events", "must be >= 0 (0 = never merge)")
        if not 1 <= obj.processes <= 64:
            bad("processes", "must be in 1..64 (server processes sharing serving.port)")
        for key in ("max_batch", "max_message_mb", "max_request_kb", "max_ids_per_event", "max_ids_per_request",
                    "max_concurrent_requests", "max_concurrent_heavy", "workers", "max_snapshot_mb",
                    "max_model_fields", "max_embedding_dim", "max_model_params", "max_version_jump"):
            if getattr(obj, key) < 1:
                bad(key, "must be >= 1")
        if not 0 <= obj.refusal_delay_ms <= 10_000:
            bad("refusal_delay_ms", "must be in 0..10000 (0 = off)")
        if obj.heavy_request_cost < 0:
            bad("heavy_request_cost", "must be >= 0 (0 = no heavy lane)")
        if not 0 <= obj.push_every_s <= 86_400:
            bad("push_every_s", "must be in 0..86400 seconds (0 = push only after checkpoints)")
        for t in _split_targets(obj.push_targets):
            host, _, port = t.rpartition(":")
            if not (host and port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
                bad("push_targets", f"{t!r} is not host:port (comma-separate several replicas)")
        if not 1 <= obj.keep_versions <= 100:
            bad("keep_versions", "must be in 1..100 (promoted versions kept loaded for a rollback)")
        _check_lines(obj, bad)
    elif isinstance(obj, GuardConfig):
        if obj.min_events < 1:
            bad("min_events", "must be >= 1")
        for key in ("logloss_margin", "auc_margin", "label_rate_tolerance", "label_rate_floor", "dead_letter_share_max",
                    "zero_share_jump", "empty_share_jump", "novel_share_jump"):
            if not 0 <= getattr(obj, key) <= 1e3:
                bad(key, "must be a number >= 0")
        if not 0 < obj.calibration_min <= 1 <= obj.calibration_max:
            bad("calibration_min", "calibration bounds must satisfy 0 < calibration_min <= 1 <= calibration_max")
        if not 0 < obj.history_weight <= 1:
            bad("history_weight", "must be in (0, 1]")
        if not 1 <= obj.recovery_versions <= 1000:
            bad("recovery_versions", "must be in 1..1000")


def _check_lines(obj: "ServingConfig", bad) -> None:
    """``serving.model_line``, ``experiments``, ``split_field``, ``shadow_line``: names and shares."""
    for key in ("model_line", "shadow_line"):
        name = getattr(obj, key)
        if (name or key == "model_line") and not re.fullmatch(MODEL_LINE_RE, name):
            bad(key, f"{name!r} is not a model line name (lower-case letters, digits, _ and -; at most 32)")
    lines = [e.line for e in obj.experiments]
    for e in obj.experiments:
        if not re.fullmatch(MODEL_LINE_RE, e.line):
            bad("experiments", f"line {e.line!r} is not a model line name (lower-case letters, digits, _ and -)")
        if not 0 < e.share <= 1:
            bad("experiments", f"line {e.line!r}: share must be in (0, 1], got {e.share!r}")
    if len(set(lines)) != len(lines):
        bad("experiments", f"a line is named twice in {lines}")
    if obj.experiments and abs(sum(e.share for e in obj.experiments) - 1.0) > 1e-6:
        bad("experiments", f"shares sum to {sum(e.share for e in obj.experiments):g}, not 1")
    if obj.shadow_line and obj.shadow_line in lines:
        bad("shadow_line", f"{obj.shadow_line!r} is also in serving.experiments: a line is answered or shadowed, not both")
    if not obj.split_field.strip():
        bad("split_field", "must name a sparse field or be request_id")
    if not 0 <= obj.shadow_max_pending <= 100_000:
        bad("shadow_max_pending", "must be in 0..100000")


def _check_metrics_endpoint(obj: Any, bad) -> None:
    """``metrics_port`` / ``metrics_host`` of a process's Prometheus endpoint (sketch, serving)."""
    if not 0 <= obj.metrics_port <= 65535:
        bad("metrics_port", "must be in 0..65535 (0 = off)")
    if not obj.metrics_host.strip():
        bad("metrics_host", "must be an address (127.0.0.1 keeps the endpoint on this machine)")


def _set_path(data: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    if len(parts) == 3 and all(parts) and _set_nested(data, parts, value, source):
        return
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{source}: expected section.key, got {dotted!r}")
    section, key = parts
    sections = {f.name for f in dataclasses.fields(Config)}
    if section not in sections:
        raise ConfigError(f"{source}: unknown section {section!r}; known: {', '.join(sorted(sections))}")
    # checked here, not only in _build, so that the error names the variable or --set it came from
    section_cls = typing.get_type_hints(Config)[section]
    keys = {f.name for f in dataclasses.fields(section_cls)}
    if (section_cls, key) in _REMOVED:
        raise ConfigError(f"{source}: {section}.{key} {_REMOVED[section_cls, key]}")
    if key not in keys:
        raise ConfigError(f"{source}: unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(keys))}")
    data.setdefault(section, {})[key] = value


def _set_nested(data: dict[str, Any], parts: list[str], value: Any, source: str) -> bool:
    """``section.table.key`` of a nested table (``serving.guard.enabled``); False when it names none."""
    section, table, key = parts
    section_cls = typing.get_type_hints(Config).get(section)
    inner = typing.get_type_hints(section_cls).get(table) if section_cls is not None else None
    if inner is None or not dataclasses.is_dataclass(inner):
        return False
    keys = {f.name for f in dataclasses.fields(inner)}
    if key not in keys:
        raise ConfigError(f"{source}: unknown key {key!r} in [{section}.{table}]; known keys: {', '.join(sorted(keys))}")
    sec = data.setdefault(section, {})
    if not isinstance(sec.get(table, {}), dict):
        sec[table] = {}
    sec.setdefault(table, {})[key] = value
    return True


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Build the config: file, then ``STREAMREC_SECTION__KEY`` env vars, then ``overrides``.

    ``overrides`` maps ``"section.key"`` to a value (already typed, or a string).
    """
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p}: {e}") from e
        except UnicodeDecodeError as e:  # a clear ConfigError, not a traceback from every command
            raise ConfigError(f"config file {p}: not UTF-8 text (TOML must be UTF-8): {e}") from None
        except OSError as e:
            raise ConfigError(f"config file {p}: cannot be read: {e.strerror or e}") from None
    env = os.environ if env is None else env
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("__")
        # STREAMREC_SERVING__GUARD__ENABLED: a nested table's key
        _set_path(data, f"{section}.{key.replace('__', '.')}", value, f"environment variable {name}")
    for dotted, value in (overrides or {}).items():
        _set_path(data, dotted, value, f"override {dotted}")
    _move_generator_keys(data, str(path) if path else "")
    return _build(Config, data, "")


def _move_generator_keys(data: dict[str, Any], source: str) -> None:
    """Move ``cardinality``/``zipf``/``multi`` written on ``[[model.fields]]`` (the layout of
    configs from streamrec 0.1) to ``[[generator.fields]]``, with a warning: they describe the
    synthetic generator, not the model, and must not change ``model_hash``."""
    fields = data.get("model", {}).get("fields") if isinstance(data.get("model"), dict) else None
    if not isinstance(fields, list):
        return
    moved = []
    gen = data.setdefault("generator", {}) if isinstance(data.get("generator", {}), dict) else {}
    gen_fields = gen.get("fields")
    have = {g.get("name") for g in gen_fields if isinstance(g, dict)} if isinstance(gen_fields, list) else set()
    for f in fields:
        if not isinstance(f, dict) or not any(k in f for k in GENERATED_FIELD_KEYS):
            continue
        knobs = {k: f.pop(k) for k in GENERATED_FIELD_KEYS if k in f}
        moved.append(str(f.get("name")))
        if f.get("name") not in have:
            gen.setdefault("fields", []).append({"name": f.get("name"), **knobs})
    if moved:
        logging.getLogger("streamrec.config").warning(
            "%s: cardinality/zipf/multi on [[model.fields]] (%s) now belong in [[generator.fields]]; moved there",
            source or "config", ", ".join(moved))


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """Turn ``["a.b=1", ...]`` from ``--set`` into a dict."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected section.key=value")
        out[key.strip()] = value
    return out


def save_config(cfg: Config, path: str | os.PathLike) -> Path:
    """Write the full config as TOML (what child processes of the demo read)."""
    import tomli_w

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(tomli_w.dumps(cfg.to_dict()))
    return p
