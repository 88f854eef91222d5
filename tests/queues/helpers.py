"""Building blocks for the queue tests: a clock the test moves, messages, queues."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import TopicPartition

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.processor.queue_runtime import STALL, events_topic
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_store import decode_events
from amps_on_kafka.state.queue_types import (
    Delivery,
    MessageId,
    QueueEntry,
    QueueEvent,
    QueuePolicy,
    Subscription,
    expanded,
)

TOPIC = "orders"


@dataclass
class FakeClock:
    """Milliseconds that pass only when the test says so."""

    now: int = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def message(
    offset: int,
    data: Any = None,
    *,
    topic: str = TOPIC,
    partition: int = 0,
    timestamp: int = 1_000_000,
    expiration: float | None = None,
) -> QueueEntry:
    document = {"n": offset} if data is None else data
    return QueueEntry(
        (topic, partition, offset),
        timestamp,
        orjson.dumps(document),
        JSON,
        expiration=expiration,
    )


def queue(clock: FakeClock | None = None, **policy: Any) -> QueueState:
    state = QueueState(QueuePolicy(name="Q", **policy), clock or FakeClock())
    return state


def subscriber(
    state: QueueState, name: str, backlog: int = 1, *, session: str | None = None, flt=None
) -> Subscription:
    sub = Subscription(name, session or name, flt, backlog)
    state.subscribe(sub)
    return sub


def fill(state: QueueState, count: int, start: int = 0, **kw: Any) -> list[MessageId]:
    ids = []
    for offset in range(start, start + count):
        entry = message(offset, **kw)
        state.enqueue(entry)
        ids.append(entry.id)
    return ids


def run(state: QueueState) -> list[Delivery]:
    """Dispatch and return the deliveries made (events stay in the outbox)."""
    state.dispatch()
    deliveries, state.outbox.deliveries = state.outbox.deliveries, []
    return deliveries


def offsets(deliveries: list[Delivery]) -> list[int]:
    return [d.entry.id[2] for d in deliveries]


def to(deliveries: list[Delivery]) -> list[tuple[str, int]]:
    return [(d.subscription.sub_id, d.entry.id[2]) for d in deliveries]


def events_of(state: QueueState) -> list[QueueEvent]:
    """The outbox's events one by one (a compiled run of acks as its QueueEvents)."""
    return expanded(state.outbox.take().events)


def eventually(
    engine: QueueEngine, condition: Callable[[], bool], timeout: float = 20.0, what: str = "it"
) -> None:
    """Wait for a condition of queue state that the engine's own threads bring about."""
    if not engine.wait_until(condition, timeout):
        raise AssertionError(f"{what} not reached after {timeout}s")


def stall(engine: QueueEngine, queue: str) -> None:
    """Make a queue's thread look as if it had been frozen (its last turn 2 x STALL ago),
    so that its next turn takes the stalled path: deliveries wait for a commit of the
    events log. Deterministic, unlike freezing the process and hoping for the timing."""
    runtime = engine.runtimes[queue]
    with engine.lock:  # the thread sets _turned under it
        runtime._turned = time.monotonic() - 2 * STALL


def event_records(engine: QueueEngine, queue: str, timeout: float = 20.0) -> list[list[QueueEvent]]:
    """Every record of a queue's events topic, decoded, once every event the engine has
    recorded so far is durable in Kafka.

    Read read_committed up to the events offset the runtime learned from its last commit
    (`state.ev_next`), not up to the end Kafka reports: a read_committed reader's end is
    the last stable offset, and Kafka writes a transaction's commit markers after
    commit_transaction returns, so just after an ack is answered that end may still stop
    before the ack's record (loaded runs read the topic empty so). Nothing needs
    flushing first: every change of queue state ends in a settle, which produces it."""
    with engine.lock:
        runtime = engine.runtimes[queue]
        durable = runtime.finish(None, None)
    durable.result(timeout)
    end = runtime.state.ev_next  # set before finish's waiters are released
    consumer = reader(engine.bootstrap, **{"isolation.level": "read_committed"})
    where = TopicPartition(events_topic(queue), 0)
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(where.topic, 0, 0)])
        records, position = [], 0
        while position < end:
            assert time.monotonic() < deadline, f"{where.topic} not readable to {end}"
            batch = consumer.consume(100, timeout=1)
            records += [decode_events(r.value()) for r in batch if r.offset() < end]
            if batch:
                position = batch[-1].offset() + 1
            else:  # offsets of commit and abort markers are read past, never returned
                position = max(position, consumer.position([where])[0].offset)
        return records
    finally:
        consumer.close()


def take(stream, count: int) -> list:
    """The next `count` messages of a client's stream; fails if it goes idle first."""
    messages = []
    for message in stream:
        messages.append(message)
        if len(messages) == count:
            break
    assert len(messages) == count, f"{len(messages)} of {count} messages"
    return messages
