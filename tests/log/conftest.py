"""Fixtures for the log tests: reading a topic back (`client` is in tests/conftest.py)."""

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from amps_on_kafka.log.kafka import consume_available, end_offsets, reader


def records_of(bootstrap: str, topic: str, committed_only: bool = False) -> list[Message]:
    """Every record now in the topic, read with an assigned consumer up to its end (by
    position: a transaction's commit marker takes an offset but is no record); with
    committed_only, as read_committed, without the records of aborted transactions."""
    ends = end_offsets(bootstrap, topic)
    isolation = "read_committed" if committed_only else "read_uncommitted"
    consumer = reader(bootstrap, **{"isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[Message] = []
        while _behind(consumer, topic, ends):
            batch = consume_available(consumer, 1000, timeout=10)
            # Nothing read: only markers or aborted records were left, or it is stuck.
            assert batch or not _behind(consumer, topic, ends), f"{topic}: stuck before {ends}"
            records.extend(r for r in batch if r.error() is None)
        return records
    finally:
        consumer.close()


def _behind(consumer, topic: str, ends: dict[int, int]) -> bool:
    """Whether the consumer is before the end of any partition that ever held a record
    (its position is -1001 until it read something there)."""
    positions = consumer.position([TopicPartition(topic, p) for p in ends if ends[p] > 0])
    return any(tp.offset < ends[tp.partition] for tp in positions)
