"""Recording a queue's changes (processor/queue_runtime.py): the outbox's events go to
the queue's events log in Kafka transactions, expired messages to the DeadLetterTopic,
and deliveries that a restart must know about wait for their events; acks are answered,
and the state checkpointed to its store, only once the events behind them are durable.
The recovery point is committed to Kafka for a worker without the store. A fenced or
failed writer stops the queue here.

A mixin of QueueRuntime: it reads and sets the runtime's state (set by its __init__).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from amps_on_kafka.errors import PartitionsMoving, PublishError
from amps_on_kafka.log.envelope import dead_letter_headers
from amps_on_kafka.native import core
from amps_on_kafka.processor.queue_events import Pending
from amps_on_kafka.state.queue_store import encode_events
from amps_on_kafka.state.queue_types import (
    ACK,
    REMOVE,
    Delivery,
    Outbox,
    QueueEntry,
    QueueEvent,
    Status,
)

# the runtime's log lines keep its logger name, which operators filter on
# (docs/operations.md, Logging)
log = logging.getLogger("amps_on_kafka.processor.queue_runtime")

RECOVERY_EVERY = 1.0  # seconds between commits of the recovery point to Kafka
CHECKPOINT_EVERY = 0.2  # seconds: a message acked sooner never costs a RocksDB write

Done = Callable[[Any], None]  # called with the result, or with the exception


class Recording:
    """The recording part of QueueRuntime (its attributes are set by QueueRuntime.__init__)."""

    def flush(self) -> None:
        """Under the engine lock: produce the outbox's events, dead letters and deliveries.

        Deliveries whose events a restart must know wait for those to be durable:
        at-most-once (the message left the queue), so a crash can never deliver it twice,
        and MaxDeliveries (the delivery count), so a crash can never deliver it once more
        than allowed.
        """
        box = self.state.outbox.take()
        if not box:
            return
        self._count(box)
        for entry in box.dead_letters:
            self._dead_letter(entry)
        deferred = None
        if box.deliveries and self._stalled(time.monotonic()):
            deferred = box.deliveries
            self._produce(box.events, deferred)  # an empty record still proves the fence
        elif box.events:
            deferred = box.deliveries if self.state.policy.records_deliveries else None
            self._produce(box.events, deferred)
        if deferred is None and box.deliveries:
            self.engine.send(self.name, box.deliveries)

    def _count(self, box: Outbox) -> None:
        counts = self.counts
        for event in box.events:  # few: the compiled applier's acks come as one run
            if type(event) is not QueueEvent:
                counts[ACK] += len(event)
            elif event.kind is REMOVE:
                counts[event.reason] += 1
        deliveries = box.deliveries
        if deliveries:
            counts["delivered"] += len(deliveries)
            counts["redelivered"] += redelivered(deliveries)
        if box.dead_letters and self.config.dead_letter_topic is not None:
            counts["dead_lettered"] += len(box.dead_letters)

    def _produce(self, events, deferred: list[Delivery] | None) -> None:
        self._produced += 1
        record = Pending(self.events_topic, events_record(events), None, self._produced, deferred)
        self._writer.add(record)

    def _dead_letter(self, entry: QueueEntry) -> None:
        target = self.config.dead_letter_topic
        if target is None:
            return
        headers = dead_letter_headers(entry.headers, "expired", entry.bookmark)
        self._writer.add(Pending(target, entry.payload, headers))
        log.warning(
            "queue %s: %s expired (Expiration or MaxDeliveries): dead letter to %s",
            self.name,
            entry.bookmark,
            target,
            extra={
                "event": "dead_letter",
                "queue": self.name,
                "bookmark": entry.bookmark,
                "dead_letter_topic": target,
            },
        )

    def _transaction_committed(
        self, sequence: int, following: int | None, deferred: list[list[Delivery] | None]
    ) -> None:
        """A transaction committed, its last events record `sequence`, the events offset
        after it `following` (the writer's thread): acks answered, checkpoints released,
        deferred deliveries sent."""
        with self._store_lock:
            if following is not None:
                self.state.ev_next = max(self.state.ev_next, following)
                self._durable_next = following
            self._durable = max(self._durable, sequence)
            for waiting in self._pending:
                if waiting[2] is None and waiting[0] <= self._durable:
                    waiting[2] = self._durable_next
            self._commit_known()
            done = []
            while self._waiters and self._waiters[0][0] <= self._durable:
                done.append(self._waiters.popleft())
        for _, call, result in done:
            call(result)
        at_most_once = self.state.policy.at_most_once
        with self.engine.lock:
            if self._suspect_from and sequence >= self._suspect_from:
                self._suspect_from = 0  # still the owner after the stall
            for deliveries in deferred:
                if deliveries and self.refusal is None:
                    self.engine.send(self.name, [d for d in deliveries if _stands(d, at_most_once)])

    def _lost(self, reason: str) -> None:
        """The writer is fenced (another worker opened the queue) or failed for good (the
        writer's thread): stop serving the queue at once, with retry: for every waiting
        ack and subscription, and let the election move it. A queue not shared among
        workers has no election to move it: it fails until a restart."""
        if self.engine.ownership is None:
            self._halted.set()
            self._failed(reason)
            return
        log.error("queue %s: %s; this worker stops serving it", self.name, reason)
        self.refusal = PartitionsMoving(f"retry: queue moving ({self.name}: {reason})")
        self.failure = self.refusal.reason  # no checkpoint more
        self._halted.set()
        with self._store_lock:
            waiters, self._waiters = self._waiters, deque()
        for _, call, _ in waiters:
            call(self.refusal)
        self.engine.fenced(self)

    def _failed(self, reason: str) -> None:
        """The events log lost a record: memory and the logs disagree until a restart."""
        log.error("queue %s: %s; restart the worker to rebuild the queue", self.name, reason)
        self.failure = reason
        with self._store_lock:
            waiters, self._waiters = self._waiters, deque()
        for _, call, _ in waiters:
            call(PublishError(reason))

    def finish(self, result: Any, done: Done | None) -> Future | None:
        """Under the engine lock, after flush: `result` once every event so far is durable,
        passed to `done` when given, else set on the future returned."""
        if done is not None:
            self._when_durable(done, result)
            return None
        future: Future = Future()
        self._when_durable(partial(_settle_future, future), result)
        return future

    def _when_durable(self, done: Done, result: Any) -> None:
        """`done(result)` once every event so far is durable (from the delivery reports'
        thread), or `done(error)` if one is lost."""
        if self.refusal is not None:
            done(self.refusal)
            return
        if self.failure is not None:
            done(PublishError(self.failure))
            return
        with self._store_lock:
            if self._produced > self._durable:
                self._waiters.append((self._produced, done, result))
                return
        done(result)

    def checkpoint(self) -> None:
        """Under the engine lock: store what changed, once the events behind it are durable."""
        state = self.state
        if self.store is None or self.failure is not None or self._reread is not None:
            return  # a restart's re-read: the store keeps what it had until it ends
        self._checkpoint_due = time.monotonic() + CHECKPOINT_EVERY
        changed, early = state.take_dirty()
        if not (changed or early or self._read):
            return
        self._read = False
        point = state.recovery_point()
        batch = self.store.prepare(
            changed, early, state.positions, state.next_seq, point, self.runs
        )
        with self._store_lock:
            needed = self._produced
            known = self._durable_next if needed == self._durable else None
            self._pending.append([needed, batch, known])

    def commit_ready(self) -> None:
        """Outside the engine lock, so RocksDB writes don't hold up acks and deliveries."""
        with self._store_lock:
            self._commit_known()

    def _commit_known(self) -> None:
        """Under the store lock: write, in order, the checkpoints whose events are durable,
        each with the events offset just after the last event it reflects."""
        pending = self._pending
        while pending and pending[0][2] is not None:
            _, batch, offset = pending.popleft()
            self.store.commit(batch, offset)  # type: ignore[union-attr]

    def _commit_recovery(self, *, force: bool = False) -> None:
        """Every RECOVERY_EVERY seconds (and when closing), commit the stored recovery point
        to Kafka, where a worker without this store finds it."""
        point = self.store.recovery_point() if self.store is not None else None
        last, sent = self._recovery_sent
        if point is None or point == sent:
            return
        if not force and time.monotonic() - last < RECOVERY_EVERY:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in point.offsets.items()]
        offsets.append(TopicPartition(self.events_topic, 0, point.events))
        try:
            self._consumer.commit(offsets=offsets, asynchronous=not force)  # type: ignore[union-attr]
        except KafkaException as exc:
            log.warning("queue %s: committing the recovery point failed: %s", self.name, exc)
            return
        self._recovery_sent = (time.monotonic(), point)


def events_record(events: list[Any]) -> bytes:
    """The events record of an outbox's events (`encode_events`' bytes), a run of acks
    the compiled applier recorded joined in place as the JSON it wrote for them."""
    parts: list[bytes] = []
    plain: list[QueueEvent] = []
    for event in events:
        if type(event) is QueueEvent:
            plain.append(event)
            continue
        if plain:
            parts.append(encode_events(plain)[1:-1])
            plain = []
        parts.append(event.json)
    if not parts:
        return encode_events(plain)
    if plain:
        parts.append(encode_events(plain)[1:-1])
    return b"".join((b"[", b",".join(parts), b"]"))


def redelivered(deliveries: list[Delivery]) -> int:
    """How many of `deliveries` are of a message delivered before (for the admin port's
    count): the compiled count, or the twin where it leaves them."""
    count = _redelivered_compiled(deliveries) if _redelivered_compiled is not None else None
    return _redelivered_twin(deliveries) if count is None else count


def _redelivered_twin(deliveries: list[Delivery]) -> int:
    return sum(d.entry.deliveries > 1 for d in deliveries)


# native/src/queue_messages.rs: the count without a generator step a delivery
_redelivered_compiled: Callable[[list[Delivery]], int | None] | None = (
    core.RedeliveryCount(Delivery, QueueEntry).count if core is not None else None
)


def _stands(delivery: Delivery, at_most_once: bool) -> bool:
    """Whether a delivery that waited for its commit may still go out. An at-least-once
    lease can end meanwhile (it ran out during a slow commit, its subscriber left, a
    filter ack removed the message): the message is then back in the queue, leased to
    another subscriber or gone, and sending it would have two subscribers hold it, or
    one process an acknowledged message. A barrier (no lease) and an at-most-once
    delivery (the message left the queue for this subscriber alone) always go."""
    if delivery.lease_until is None or at_most_once:
        return True
    entry = delivery.entry
    return (
        entry.status is Status.LEASED
        and entry.holder is delivery.subscription
        and entry.lease_until == delivery.lease_until
    )


def _settle_future(future: Future, outcome: Any) -> None:
    """Set a result (or an exception), unless the waiter gave up (a closed connection)."""
    if future.set_running_or_notify_cancel():
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
