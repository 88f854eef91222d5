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
    """Every record now in the topic, read with an assigned consumer up to its end."""
    ends = end_offsets(bootstrap, topic)
    consumer = reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[Message] = []
        while len(records) < sum(ends.values()):
            batch = consume_available(consumer, 1000, timeout=10)
            assert batch, f"{topic}: read {len(records)} of {sum(ends.values())} records"
            records.extend(r for r in batch if r.error() is None)
        return records
    finally:
        consumer.close()
