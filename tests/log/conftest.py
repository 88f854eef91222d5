"""Fixtures for the log tests: a client connected to the session broker, and a reader."""

import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from amps_on_kafka.client import Client
from amps_on_kafka.log.kafka import consume_available, end_offsets, reader


@pytest.fixture
def client(bootstrap):
    with Client(f"test-{uuid.uuid4().hex[:8]}") as connected:
        connected.connect(f"kafka://{bootstrap}")
        connected.logon()
        yield connected


def records_of(bootstrap: str, topic: str) -> list[Message]:
    """Every record now in the topic, read with an assigned consumer up to its end (by
    position: a transaction's commit marker takes an offset but is no record)."""
    ends = end_offsets(bootstrap, topic)
    consumer = reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[Message] = []
        while any(tp.offset < ends[tp.partition] for tp in _positions(consumer, topic, ends)):
            batch = consume_available(consumer, 1000, timeout=10)
            assert batch, f"{topic}: at {_positions(consumer, topic, ends)}, ends {ends}"
            records.extend(r for r in batch if r.error() is None)
        return records
    finally:
        consumer.close()


def _positions(consumer, topic: str, ends: dict[int, int]) -> list[TopicPartition]:
    """Where the consumer is in each partition (0 before it read anything there)."""
    positions = consumer.position([TopicPartition(topic, p) for p in ends])
    return [TopicPartition(topic, tp.partition, max(tp.offset, 0)) for tp in positions]
