"""Event ingest: the event contract, wire codecs, Kafka I/O with dead letters,
the embedded broker, dataset replay and the synthetic stream."""

from .broker import BrokerError, EmbeddedBroker, TopicSpec, ensure_topics, free_port, pipeline_topics, wait_for_broker
from .codec import Decoder, encode_arrow, encode_json, encode_messages
from .datasets import (
    DatasetError, avazu_config, criteo_config, detect_format, layout_config, layout_toml, read_events, read_file,
    write_events,
)
from .events import EventBatch, EventError, EventSchema, JaggedIds, hash_id, hash_ids
from .kafka_io import (
    REASON_HEADER, SOURCE_HEADER, ConsumerStats, EventConsumer, EventProducer, ProduceError, make_producer, read_topic,
)
from .synthetic import SyntheticStream, roc_auc

__all__ = [
    "BrokerError", "EmbeddedBroker", "TopicSpec", "ensure_topics", "free_port", "pipeline_topics", "wait_for_broker",
    "Decoder", "encode_arrow", "encode_json", "encode_messages",
    "DatasetError", "avazu_config", "criteo_config", "detect_format", "layout_config", "layout_toml",
    "read_events", "read_file", "write_events",
    "EventBatch", "EventError", "EventSchema", "JaggedIds", "hash_id", "hash_ids",
    "REASON_HEADER", "SOURCE_HEADER", "ConsumerStats", "EventConsumer", "EventProducer", "ProduceError", "make_producer",
    "read_topic",
    "SyntheticStream", "roc_auc",
]
