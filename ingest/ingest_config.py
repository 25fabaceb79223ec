"""``[kafka]``, ``[ingest]`` and ``[generator]``: how every part reaches the broker, what a record may
carry before it is dead-lettered, and how the synthetic stream is drawn."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from streamrec.foundation.config import InvalidValue, check_choice
from streamrec.foundation.model_config import GENERATED_FIELD_KEYS

from .ingest_types import Codec, ConsumerMode, OffsetsLostPolicy, SaslMechanism, SecurityProtocol


def check_topic_name(section: str, obj: Any, key: str) -> None:
    """Kafka's own rule for a topic name, checked at start-up rather than at the topic's first use."""
    name = getattr(obj, key)
    if not (0 < len(name) <= 249 and name not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", name)):
        raise InvalidValue(key, f"{name!r} is not a legal Kafka topic name (1-249 of ASCII letters, digits, '.', "
                                "'_', '-')", section)


@dataclass
class KafkaConfig:
    REMOVED_KEYS: ClassVar[dict[str, str]] = {
        "sasl_password": "is not a config key (a config is printed and copied to child processes): put the "
                         "password in env STREAMREC_KAFKA_SASL_PASSWORD or a file named by kafka.sasl_password_file"}

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
            check_choice("kafka", self, key, allowed)
        for key, least in (("partitions", 1), ("events_per_message", 1)):
            if getattr(self, key) < least:
                raise InvalidValue(key, f"must be >= {least}", "kafka")
        if self.connect_timeout_s <= 0:
            raise InvalidValue("connect_timeout_s", "must be > 0", "kafka")
        if self.security_protocol.startswith("SASL_") and not self.sasl_username:
            raise InvalidValue("sasl_username", f"security_protocol {self.security_protocol} needs a SASL user name",
                               "kafka")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise InvalidValue("ssl_certfile", "ssl_certfile and ssl_keyfile must be given together (mutual TLS)",
                               "kafka")
        for key in ("events_topic", "dlq_topic", "hotset_topic"):
            check_topic_name("kafka", self, key)


@dataclass
class IngestConfig:
    dense_abs_max: float = 1e9  # largest absolute dense value an event may carry; beyond it the record is dead-lettered (normalise features upstream)
    dlq_max_bytes: int = 900_000  # a dead letter keeps at most this many bytes of the bad record (its size and sha256 go in headers)


    def __post_init__(self) -> None:
        if not 0 < self.dense_abs_max <= 3e38:
            raise InvalidValue("dense_abs_max", "must be in (0, 3e38] (float32's range)", "ingest")
        if self.dlq_max_bytes < 1024:
            raise InvalidValue("dlq_max_bytes", "must be >= 1024", "ingest")


@dataclass
class GeneratedField:
    """How the synthetic generator draws one field's ids. Not part of the model: it
    never changes ``model_hash``, so a model trained on generated events serves real ones."""

    name: str
    cardinality: int = 100_000  # distinct ids the generator draws from
    zipf: float = 1.1  # Zipf exponent of the id popularity
    multi: int = 1  # ids per event (1 = single-valued)


    def __post_init__(self) -> None:
        if self.cardinality < 1 or self.cardinality > 10**9:
            raise InvalidValue("cardinality", "must be in 1..1e9")
        if self.zipf <= 0:
            raise InvalidValue("zipf", "must be > 0")
        if self.multi < 1:
            raise InvalidValue("multi", "must be >= 1")


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

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise InvalidValue("fields", f"duplicate field names in {names}", "generator")
        if self.label_noise <= 0:
            raise InvalidValue("label_noise", "must be > 0", "generator")
        if not 0 < self.base_rate < 1:
            raise InvalidValue("base_rate", "must be in (0, 1)", "generator")
        if self.events_per_s <= 0:
            raise InvalidValue("events_per_s", "must be > 0", "generator")

    def field(self, name: str) -> GeneratedField:
        """How ``name`` is drawn: its ``generator.fields`` entry, else the defaults."""
        for f in self.fields:
            if f.name == name:
                return f
        return GeneratedField(name)


def move_generator_keys(data: dict[str, Any], source: str) -> None:
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
