"""Event ingest: the event contract, wire codecs, Kafka I/O with dead letters,
the embedded broker, dataset replay and the synthetic stream."""

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
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

_EXPORTS = {
    'BrokerError': '.broker',
    'EmbeddedBroker': '.broker',
    'TopicSpec': '.broker',
    'ensure_topics': '.broker',
    'free_port': '.broker',
    'pipeline_topics': '.broker',
    'wait_for_broker': '.broker',
    'Decoder': '.codec',
    'encode_arrow': '.codec',
    'encode_json': '.codec',
    'encode_messages': '.codec',
    'DatasetError': '.datasets',
    'avazu_config': '.datasets',
    'criteo_config': '.datasets',
    'detect_format': '.datasets',
    'layout_config': '.datasets',
    'layout_toml': '.datasets',
    'read_events': '.datasets',
    'read_file': '.datasets',
    'write_events': '.datasets',
    'EventBatch': '.events',
    'EventError': '.events',
    'EventSchema': '.events',
    'JaggedIds': '.events',
    'hash_id': '.events',
    'hash_ids': '.events',
    'REASON_HEADER': '.kafka_io',
    'SOURCE_HEADER': '.kafka_io',
    'ConsumerStats': '.kafka_io',
    'EventConsumer': '.kafka_io',
    'EventProducer': '.kafka_io',
    'ProduceError': '.kafka_io',
    'make_producer': '.kafka_io',
    'read_topic': '.kafka_io',
    'SyntheticStream': '.synthetic',
    'roc_auc': '.synthetic',
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
