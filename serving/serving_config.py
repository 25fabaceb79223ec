"""``[serving]`` and ``[serving.guard]``: the gRPC server's address, limits, model lines and A/B split,
the replicas the trainer pushes to, and the quality gate on promotion."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from streamrec.foundation.config import InvalidValue, check_choice, check_metrics_endpoint
from streamrec.snapshot.snapshot_types import MODEL_LINE_RE, RowPrecision

_AT_LEAST_ONE = ("max_batch", "max_message_mb", "max_request_kb", "max_ids_per_event", "max_ids_per_request",
                 "max_concurrent_requests", "max_concurrent_heavy", "workers", "max_snapshot_mb", "max_model_fields",
                 "max_embedding_dim", "max_model_params", "max_version_jump")
_RANGES = (  # key, lowest, highest, the error's message
    ("port", 0, 65535, "must be in 0..65535"),
    ("processes", 1, 64, "must be in 1..64 (server processes sharing serving.port)"),
    ("refusal_delay_ms", 0, 10_000, "must be in 0..10000 (0 = off)"),
    ("push_every_s", 0, 86_400, "must be in 0..86400 seconds (0 = push only after checkpoints)"),
    ("keep_versions", 1, 100, "must be in 1..100 (promoted versions kept loaded for a rollback)"),
    ("shadow_max_pending", 0, 100_000, "must be in 0..100000"),
)
_GUARD_SHARES = ("logloss_margin", "auc_margin", "label_rate_tolerance", "label_rate_floor", "dead_letter_share_max",
                 "zero_share_jump", "empty_share_jump", "novel_share_jump", "z", "golden_auc_margin",
                 "golden_logloss_margin", "field_contribution_margin", "drift_max")


@dataclass
class ExperimentSpec:
    """One arm of the A/B split: a model line and its share of the traffic."""

    line: str
    share: float = 0.0  # share of requests routed to this line (all entries' shares sum to 1)


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
    z: float = 3.0  # the label and score checks hold only a difference from history larger than this many standard errors of the window it was measured on (and larger than its margin)
    settle_s: float = 60.0  # a version that passes and stays the newest this long is promoted though fewer than recovery_versions passed in a row (0 = never)
    golden_events: int = 2000  # labelled events of promoted versions' evidence samples kept to score each candidate against the promoted version (0 = no golden set)
    golden_auc_margin: float = 0.02  # hold a candidate whose AUC on the golden set is more than this below the promoted version's (and more than z standard errors of the paired difference)
    golden_logloss_margin: float = 0.1  # hold a candidate whose logloss on the golden set is more than this share above the promoted version's (and more than z standard errors)
    drift_max: float = 1.0  # hold a waiting candidate (recovering, or waiting for settle_s) whose live scores differ from the promoted version's by more than this mean |log-odds difference| (and more than z standard errors); a version promoted at its push never waits for it (0 = off)
    drift_min_events: int = 1000  # live events a candidate must be paired on before drift_max judges it (fewer: no verdict, the recovery and settle rules as without it)
    field_contribution_margin: float = 0.01  # hold a version when a field's contribution to its ranking on its window (AUC with the field minus AUC without it) is more than this below the promoted versions' (and more than z standard errors); 2 = never


    def __post_init__(self) -> None:
        if self.min_events < 1:
            raise InvalidValue("min_events", "must be >= 1", "serving.guard")
        for key in _GUARD_SHARES:
            if not 0 <= getattr(self, key) <= 1e3:
                raise InvalidValue(key, "must be a number >= 0", "serving.guard")
        if not 0 < self.calibration_min <= 1 <= self.calibration_max:
            raise InvalidValue("calibration_min", "calibration bounds must satisfy 0 < calibration_min <= 1 <= "
                                                  "calibration_max", "serving.guard")
        if not 0 < self.history_weight <= 1:
            raise InvalidValue("history_weight", "must be in (0, 1]", "serving.guard")
        if not 1 <= self.recovery_versions <= 1000:
            raise InvalidValue("recovery_versions", "must be in 1..1000", "serving.guard")
        if not 0 <= self.settle_s <= 86_400 * 30:
            raise InvalidValue("settle_s", "must be in 0..2592000 seconds", "serving.guard")
        if self.drift_min_events < 1:
            raise InvalidValue("drift_min_events", "must be >= 1", "serving.guard")
        if not 0 <= self.golden_events <= 100_000:
            raise InvalidValue("golden_events", "must be in 0..100000", "serving.guard")


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
    shadow_max_pending: int = 64  # requests waiting for their shadow scoring at most, and as many for the guard's live drift watch; more are not scored (counted)
    row_precision: RowPrecision = "fp32"  # embedding rows in snapshots, deltas and serving's memory: fp32 | fp16 | int8 (row-wise scale and bias); training stays fp32

    def __post_init__(self) -> None:
        check_choice("serving", self, "row_precision", RowPrecision)
        check_metrics_endpoint("serving", self)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InvalidValue("tls_cert", "tls_cert and tls_key must be given together", "serving")
        if self.merge_max_events < 0:
            raise InvalidValue("merge_max_events", "must be >= 0 (0 = never merge)", "serving")
        for key in _AT_LEAST_ONE:
            if getattr(self, key) < 1:
                raise InvalidValue(key, "must be >= 1", "serving")
        if self.heavy_request_cost < 0:
            raise InvalidValue("heavy_request_cost", "must be >= 0 (0 = no heavy lane)", "serving")
        for key, low, high, message in _RANGES:
            if not low <= getattr(self, key) <= high:
                raise InvalidValue(key, message, "serving")
        for t in split_targets(self.push_targets):
            host, _, port = t.rpartition(":")
            if not (host and port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
                raise InvalidValue("push_targets", f"{t!r} is not host:port (comma-separate several replicas)",
                                   "serving")
        self._check_lines()

    def _check_lines(self) -> None:
        """``model_line``, ``experiments``, ``split_field``, ``shadow_line``: names and shares."""
        def bad(key: str, message: str) -> None:
            raise InvalidValue(key, message, "serving")

        for key in ("model_line", "shadow_line"):
            name = getattr(self, key)
            if (name or key == "model_line") and not re.fullmatch(MODEL_LINE_RE, name):
                bad(key, f"{name!r} is not a model line name (lower-case letters, digits, _ and -; at most 32)")
        lines = [e.line for e in self.experiments]
        for e in self.experiments:
            if not re.fullmatch(MODEL_LINE_RE, e.line):
                bad("experiments", f"line {e.line!r} is not a model line name (lower-case letters, digits, _ and -)")
            if not 0 < e.share <= 1:
                bad("experiments", f"line {e.line!r}: share must be in (0, 1], got {e.share!r}")
        if len(set(lines)) != len(lines):
            bad("experiments", f"a line is named twice in {lines}")
        if self.experiments and abs(sum(e.share for e in self.experiments) - 1.0) > 1e-6:
            bad("experiments", f"shares sum to {sum(e.share for e in self.experiments):g}, not 1")
        if self.shadow_line and self.shadow_line in lines:
            bad("shadow_line", f"{self.shadow_line!r} is also in serving.experiments: a line is answered or "
                               "shadowed, not both")
        if not self.split_field.strip():
            bad("split_field", "must name a sparse field or be request_id")

    def serving_target(self) -> str:
        """Where clients connect: ``target``, else this server's ``host:port``."""
        return self.target or f"{self.host}:{self.port}"

    def push_targets_list(self) -> list[str]:
        """Where the trainer pushes snapshots: ``push_targets`` (deduplicated), else ``serving_target()``."""
        return list(dict.fromkeys(split_targets(self.push_targets))) or [self.serving_target()]


def split_targets(value: str) -> list[str]:
    """The non-empty entries of a comma-separated ``host:port`` list."""
    return [t for t in (t.strip() for t in value.split(",")) if t]
