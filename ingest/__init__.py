"""Event ingest: wire codecs, Kafka I/O with dead letters, the embedded broker,
dataset replay and the synthetic stream. The event contract itself
(``EventBatch``, ``EventSchema``, ...) lives in :mod:`streamrec.foundation`; it is
re-exported here because every producer of events needs it."""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .broker import BrokerError, EmbeddedBroker, TopicSpec, ensure_topics, free_port, pipeline_topics, wait_for_broker
    from .codec import Decoder, encode_arrow, encode_json, encode_messages, is_arrow
    from .datasets import (
        DatasetError, avazu_config, criteo_config, detect_format, layout_config, layout_toml, read_events, read_file,
        write_events,
    )
    from streamrec.foundation import EventBatch, EventError, EventSchema, JaggedIds, hash_id, hash_ids
    from .consumer_stats import ConsumerStats
    from .kafka_io import EventConsumer, EventProducer, ProduceError, make_producer, read_topic
    from .dead_letters import ORIGINAL_SHA256_HEADER, ORIGINAL_SIZE_HEADER, REASON_HEADER, SOURCE_HEADER, DeadLetterError
    from .step_quarantine import STEP_CRASH_REASON
    from .topic_guard import OffsetsLostError, offsets_lost_message, topic_id
    from .inflight import InflightMarker, InflightRange, exact_ranges, holds_any, probe_decode, probe_in_children
    from .inference import DataSchema, infer_schema
    from .movielens import load_movielens, movielens_config, movielens_events, write_movielens
    from .kafka_clients import KafkaSecurityError, aiokafka_security, client_settings, faust_credentials, redacted
    from .ingest_types import Codec, ConsumerMode, OffsetsLostPolicy, SaslMechanism, SecurityProtocol
    from .synthetic import SyntheticStream

_EXPORTS = {  # submodule: the public names it defines
    ".broker": "BrokerError EmbeddedBroker TopicSpec ensure_topics free_port pipeline_topics wait_for_broker",
    ".codec": "Decoder encode_arrow encode_json encode_messages is_arrow",
    ".datasets": "DatasetError avazu_config criteo_config detect_format layout_config layout_toml read_events read_file write_events",
    "streamrec.foundation.events": "EventBatch EventError EventSchema JaggedIds hash_id hash_ids",
    ".consumer_stats": "ConsumerStats",
    ".kafka_io": "EventConsumer EventProducer ProduceError make_producer read_topic",
    ".dead_letters": "ORIGINAL_SHA256_HEADER ORIGINAL_SIZE_HEADER REASON_HEADER SOURCE_HEADER DeadLetterError",
    ".step_quarantine": "STEP_CRASH_REASON",
    ".topic_guard": "OffsetsLostError offsets_lost_message topic_id",
    ".inflight": "InflightMarker InflightRange exact_ranges holds_any probe_decode probe_in_children",
    ".inference": "DataSchema infer_schema",
    ".movielens": "load_movielens movielens_config movielens_events write_movielens",
    ".kafka_clients": "KafkaSecurityError aiokafka_security client_settings faust_credentials redacted",
    ".ingest_types": "Codec ConsumerMode OffsetsLostPolicy SaslMechanism SecurityProtocol",  # kafka.* values
    ".synthetic": "SyntheticStream",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
