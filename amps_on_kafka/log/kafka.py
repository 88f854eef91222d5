"""Small shared pieces of confluent-kafka set-up, so every part talks to Kafka alike."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from amps_on_kafka.errors import TransportError, UnknownTopic

METADATA_TIMEOUT = 10.0
# librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (1 s by default)
# whenever its local queue is over queued.min.messages: a reader that keeps that queue
# full then fetches a few times a second, which capped a one-partition read near 230k
# records/s on a local broker (750k+ without the pause).
CONSUMER_TUNING = {
    "queued.min.messages": 100_000,
    "fetch.queue.backoff.ms": 10,
}


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


# The hash a log producer places keys with when the publisher gives no partition.
PRODUCER_PARTITIONER = "murmur2"


def log_producer(bootstrap: str, **overrides: Any) -> Producer:
    """A producer whose delivery report means persisted: acks=all, idempotent, in order.

    murmur2 is Kafka's Java partitioner, so a SOW key lands in the same partition
    whichever client published it. A topic whose producers use another partitioner
    gets an explicit partition from the publisher (log/publisher.py).
    """
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "compression.type": "lz4",
        "partitioner": f"{PRODUCER_PARTITIONER}_random",
        "topic.metadata.refresh.interval.ms": 30_000,
    }
    config.update(overrides)
    return Producer(config)


def reader(bootstrap: str, **overrides: Any) -> Consumer:
    """A consumer for assign-and-seek reading: no group membership, no commits."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"amps-reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
        "fetch.max.bytes": 52_428_800,
        **CONSUMER_TUNING,
    }
    config.update(overrides)
    return Consumer(config)


def partitions_of(client: AdminClient | Consumer | Producer, topic: str) -> list[int]:
    """The partitions of a topic; UnknownTopic when Kafka doesn't have it."""
    try:
        metadata = client.list_topics(topic, timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka for metadata of {topic!r}: {exc}") from exc
    info = metadata.topics.get(topic)
    if info is None or (
        info.error is not None
        and info.error.code()
        in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
        )
    ):
        raise UnknownTopic(
            f"topic {topic!r} does not exist (create it with amps-kafka topics create)"
        )
    if info.error is not None:
        raise TransportError(f"metadata for topic {topic!r}: {info.error.str()}")
    return sorted(info.partitions)


def topic_names(client: AdminClient | Consumer) -> list[str]:
    """Every user topic (Kafka's internal topics and ours, starting with '_', left out)."""
    return sorted(_user_topics(client))


def partitions_matching(
    client: AdminClient | Consumer, wanted: Callable[[str], bool]
) -> list[tuple[str, int]]:
    """Every partition of the user topics `wanted` accepts, from one metadata request."""
    return sorted(
        (name, partition)
        for name, info in _user_topics(client).items()
        if info.error is None and wanted(name)
        for partition in info.partitions
    )


def _user_topics(client: AdminClient | Consumer) -> dict[str, Any]:
    try:
        metadata = client.list_topics(timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka: {exc}") from exc
    return {name: info for name, info in metadata.topics.items() if not name.startswith("_")}


def consume_available(consumer: Consumer, max_messages: int, timeout: float) -> list:
    """What is there now, up to max_messages; waits up to timeout only when nothing is.

    librdkafka's batch consume waits for the full timeout unless the batch fills, which
    would hold a live message back; this returns as soon as anything arrives.
    """
    records = consumer.consume(max_messages, timeout=0)
    if records:
        return records
    records = consumer.consume(1, timeout=timeout)
    if records:
        records.extend(consumer.consume(max_messages - 1, timeout=0))
    return records


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The offset after the last record of each partition: where a reader is caught up."""
    consumer = reader(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=METADATA_TIMEOUT, cached=False
            )[1]
            for p in partitions_of(consumer, topic)
        }
    finally:
        consumer.close()
