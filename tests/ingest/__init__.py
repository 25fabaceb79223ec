"""Ingest: codecs, datasets, the Kafka consumer/producer with dead letters, the embedded broker."""
