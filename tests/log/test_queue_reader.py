"""A queue's consumer on the compiled reader (log/native_reader.py, QueueReader) against
confluent-kafka's Consumer, over a real broker: the entries the queue's read_records makes
of each one's batches (every slot), the records it skips, the errors that stop a read, and
the rest of the consumer API the queue calls (assign, incremental_assign, assignment,
pause/resume, position, watermarks cached and not, committed/commit, close) give the same.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import fields
from functools import partial
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.kafka import consume_available, reader_config
from amps_on_kafka.log.native_reader import QueueReader, queue_consumer
from amps_on_kafka.processor.queue_runtime import read_records
from amps_on_kafka.state.queue_types import QueueEntry
from tests.log.test_native_reader import compiled, mixed, produce  # noqa: F401 (a fixture)

PARTITIONS = 3


def both(bootstrap: str, **overrides: Any) -> tuple[QueueReader, Consumer]:
    """The compiled queue consumer and confluent-kafka's, configured alike (each its own
    group, as two queues)."""
    made = []
    for _ in range(2):
        group = f"amps-queue-reader-test-{uuid.uuid4().hex}"
        made.append(reader_config(bootstrap, **{"group.id": group, **overrides}))
    compiled_one = queue_consumer(made[0])
    assert isinstance(compiled_one, QueueReader)
    return compiled_one, Consumer(made[1])


def described(entry: QueueEntry | tuple) -> Any:
    """Every slot of an entry (a record that is not a message as it is)."""
    if not isinstance(entry, QueueEntry):
        return entry
    return tuple(getattr(entry, f.name) for f in fields(QueueEntry))


def read_to_the_ends(
    available: Callable[[int, float], Any], topic: str
) -> tuple[dict[int, list[Any]], list[Any], list[tuple[int, str]]]:
    """As the queue's thread reads (QueueRuntime._entries), until every partition's end
    was reported: the entries by partition, the bad records' ids, the errors."""
    entries: list[Any] = []
    bad: list[Any] = []
    errors: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while sum(code == KafkaError._PARTITION_EOF for code, _ in errors) < PARTITIONS:
        assert time.monotonic() < deadline, errors
        records = available(7, 0.2)  # small batches: errors amid records
        at, end = 0, len(records)
        while at < end:
            at = read_records(records, at, {topic: JSON}, entries, bad)
            if at < end:
                error = records[at].error()
                errors.append((error.code(), error.str().split(" at offset")[0]))
                at += 1
    by_partition: dict[int, list[Any]] = {}
    for entry in entries:
        partition = entry.id[1] if isinstance(entry, QueueEntry) else entry[0][1]
        by_partition.setdefault(partition, []).append(described(entry))
    return by_partition, sorted(bad), sorted(errors)


@compiled
def test_the_compiled_reader_makes_the_entries_confluent_kafka_makes(bootstrap, mixed):  # noqa: F811
    """Every kind of record (mixed: envelopes, none, no value, a header without a value,
    bad headers, a name that is not UTF-8, a transaction's marker), a sow_delete and a
    message with an expiration besides; partition ends as the errors that stop a read."""
    produce(
        bootstrap,
        mixed,
        [
            (0, None, b'{"id": 1}', [("c", b"sow_delete")]),
            (1, None, b'{"id": 2}', [("c", b"publish"), ("e", b"30")]),
            (2, None, b"", [("c", b"delta_publish"), ("x", b"\xff")]),
        ],
    )
    ours, theirs = both(bootstrap, **{"enable.partition.eof": True})
    starts = [TopicPartition(mixed, p, 0) for p in range(PARTITIONS)]
    try:
        ours.assign(starts)
        theirs.assign(starts)
        read = read_to_the_ends(ours.available, mixed)
        expected = read_to_the_ends(partial(consume_available, theirs), mixed)
    finally:
        ours.close()
        theirs.close()
    assert read == expected
    entries, bad, errors = read
    assert sum(map(len, entries.values())) > 40 and bad  # a message, a bad one: compared
    assert {code for code, _ in errors} == {KafkaError._PARTITION_EOF}


@compiled
def test_the_consumer_api_the_queue_calls_answers_alike(bootstrap, topic_factory):
    """assign and incremental_assign, assignment, pause/resume, position, the watermarks
    (cached, after a fetch, and asked of the broker), committed after a commit (sync and
    not), and the errors of each where the queue can meet one."""
    topic = topic_factory(2)
    produce(
        bootstrap, topic, [(p, None, b'{"id": %d}' % i, None) for i in range(6) for p in (0, 1)]
    )
    ours, theirs = both(bootstrap)
    answers = []
    try:
        for consumer in (ours, theirs):
            take = getattr(consumer, "available", None) or partial(consume_available, consumer)
            seen = []
            consumer.assign([TopicPartition(topic, 0, 2)])
            consumer.incremental_assign([TopicPartition(topic, 1, 4)])
            with pytest.raises(KafkaException) as twice:  # assigned already
                consumer.incremental_assign([TopicPartition(topic, 1, 0)])
            seen.append(twice.value.args[0].code())
            assigned = consumer.assignment()
            seen.append(sorted((tp.topic, tp.partition) for tp in assigned))
            consumer.pause(assigned)
            seen.append(len(take(100, 0.5)))  # paused: nothing comes
            consumer.resume(assigned)
            count, deadline = 0, time.monotonic() + 30
            while count < 6 and time.monotonic() < deadline:
                count += len(take(100, 0.2))
            seen.append(count)
            seen.append([(tp.partition, tp.offset) for tp in consumer.position(assigned)])
            where = TopicPartition(topic, 0)
            seen.append(consumer.get_watermark_offsets(where, cached=True)[1])
            seen.append(consumer.get_watermark_offsets(where, timeout=10))
            with pytest.raises(KafkaException) as unknown:
                consumer.get_watermark_offsets(TopicPartition(f"{topic}-none", 0), timeout=10)
            seen.append(unknown.value.args[0].code())
            consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
            consumer.commit(offsets=[TopicPartition(topic, 1, 5)], asynchronous=True)
            wanted = [TopicPartition(topic, 0), TopicPartition(topic, 1), TopicPartition(topic, 9)]
            deadline = time.monotonic() + 30
            committed = consumer.committed(wanted, timeout=10)
            while committed[1].offset != 5 and time.monotonic() < deadline:  # the async one
                committed = consumer.committed(wanted, timeout=10)
            seen.append([(tp.partition, tp.offset) for tp in committed])
            answers.append(seen)
    finally:
        ours.close()
        theirs.close()
    assert answers[0] == answers[1]
    assert answers[0][3:5] == [6, [(0, 6), (1, 6)]]
    assert answers[0][-1] == [(0, 3), (1, 5), (9, -1001)]
