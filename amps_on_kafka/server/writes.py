"""One session's commands on their way to the log (Writes): each command, or a read's run
of plain publishes (PublishBatch), holds a budget share and a flush ticket until Kafka
reported all its records; a flush waits for every ticket issued before it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from confluent_kafka import KafkaError, Message

from amps_on_kafka.errors import PublishError
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.native import core
from amps_on_kafka.protocol.frames import Publish, publish_header
from amps_on_kafka.server.delivery import DeliveryPump
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import Request

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

# A partition count this close to its expiry is refreshed (off the loop) before a
# publish uses it, so that the publish never finds it expired and asks Kafka on the loop.
REFRESH_MARGIN = 5.0
# What a command costs the budget beyond its payload: headers, key and librdkafka's own
# per-message bookkeeping, so a flood of empty publishes is bounded too.
RECORD_OVERHEAD = 256
# A batch's records are numbered (batch number << BATCH_BITS) | index for their reports.
BATCH_BITS = 32
INDEX_MASK = (1 << BATCH_BITS) - 1


@dataclass(eq=False, slots=True)
class PendingWrite:
    """One command on its way to the log: it is persisted when all its records are."""

    writes: Writes
    request: Request
    ticket: int
    size: int
    remaining: int = 0
    error: PublishError | None = None
    started: float = field(default_factory=time.perf_counter)  # for the admin's latencies
    produced: float = math.inf  # when its records were produced (Writes.written)
    commands: ClassVar[int] = 1  # of the budget

    def persisted(self, error: PublishError | None) -> None:
        """One record's report: the command is answered with its last (a report after
        the command was answered as unreported, Writes.expire, counts below 0: ignored)."""
        if error is not None and self.error is None:
            self.error = error
        self.remaining -= 1
        if self.remaining == 0:
            self.writes.finish(self)


@dataclass(eq=False, slots=True)
class PublishBatch:
    """A run of plain publishes from one read, written together (publish_run): one
    budget share, one ticket for flushes, and one outcome handed to the loop once Kafka
    reported every record — where a PendingWrite, a Request, two callbacks and a
    hand-off to the loop per command were a third of the gateway's time per publish.

    Reports count down on the pump's thread while the loop may still be producing the
    batch: `reports` (itertools.count, atomic under the GIL) is advanced by each report
    and once by the loop's Writes.seal, which sets `expected` (the records produced)
    first, so exactly one of them, the last, draws `expected`."""

    number: int
    ticket: int
    size: int
    commands: int
    publishes: list[Publish] = field(default_factory=list)  # the records produced
    failures: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)
    expected: int = -1
    reports: Iterator[int] = field(default_factory=itertools.count)
    started: float = field(default_factory=time.perf_counter)  # its records produced then


class Writes:
    """One session's LogPublisher, its commands in flight, and the flushes waiting on them."""

    def __init__(self, session: Session, publisher: LogPublisher) -> None:
        self.session = session
        self.publisher = publisher
        self.pump = session.gateway.pump
        self.budget = session.gateway.budget
        self.latencies = session.gateway.stats.publish_latency
        self._issued = itertools.count()
        self._last_ticket = -1
        self._inflight: dict[int, PendingWrite | PublishBatch] = {}  # in ticket order
        self._flushes: list[tuple[int, asyncio.Future[None]]] = []
        self._known: set[str] = set()
        self._batches: dict[int, PublishBatch] = {}  # by number, until reported
        self.delivery = batch_deliveries(self._batches, self.pump, self.finish_batch)
        self.pump.writes.add(self)  # swept for reports lost (DeliveryPump._sweep)

    async def spec(self, topic: str) -> TopicSpec:
        """The topic's spec, with its partition count fresh: both read Kafka now and then
        (the first time, and the count every PARTITION_COUNT_TTL), so that runs off the
        loop — while Kafka was down, a count read on the loop froze every client for 10 s."""
        spec = self.known_spec(topic)
        if spec is None:
            await self.session.gateway.blocking(self._look_up, topic)
            self._known.add(topic)
            spec = self.publisher.spec(topic)
        return spec

    def _look_up(self, topic: str) -> None:
        spec = self.publisher.spec(topic)
        if _placed(spec):
            self.publisher.partition_count(spec.name)

    def known_spec(self, topic: str) -> TopicSpec | None:
        """The topic's spec when spec() would not need to read Kafka, else None. Only a
        topic whose keys are placed has a partition count to keep fresh (an unkeyed one
        went to the pool on every publish)."""
        if topic not in self._known:
            return None
        spec = self.publisher.spec(topic)
        if _placed(spec) and self.publisher.partition_count_due(spec.name, REFRESH_MARGIN):
            return None
        return spec

    async def begin(self, request: Request) -> PendingWrite:
        """Wait for room in the worker's PublishBudget, then number the command."""
        size = charge(request)
        await self.budget.reserve(size)
        return self._issue(request, size)

    def begin_at_once(self, request: Request) -> PendingWrite | None:
        """begin() when the budget has room now; None when the command must wait."""
        size = charge(request)
        if not self.budget.take_now(size):
            return None
        return self._issue(request, size)

    def _issue(self, request: Request, size: int) -> PendingWrite:
        self._last_ticket = next(self._issued)
        pending = PendingWrite(self, request, self._last_ticket, size)
        self._inflight[pending.ticket] = pending
        return pending

    def open_batch(self, size: int, commands: int) -> PublishBatch:
        """A batch holding a budget share of `size` bytes and `commands` commands."""
        self._last_ticket = next(self._issued)
        batch = PublishBatch(next(self.pump.batch_numbers), self._last_ticket, size, commands)
        self._inflight[batch.ticket] = batch
        self._batches[batch.number] = batch
        self.pump.batches[batch.number] = (batch, self.finish_batch)
        return batch

    def seal(self, batch: PublishBatch, unused_size: int) -> None:
        """The loop produced all it will of `batch`: the share of the commands it left
        (`unused_size` bytes) is freed, and the batch finishes once every record it
        produced is reported (now, if they all were)."""
        produced = len(batch.publishes)
        if produced < batch.commands:
            self.budget.release(unused_size, batch.commands - produced)
            batch.size -= unused_size
            batch.commands = produced
        batch.expected = produced
        if next(batch.reports) == produced:
            self.finish_batch(batch)

    def finish_batch(self, batch: PublishBatch) -> None:
        """Kafka reported every record of `batch`: a failure ack for each that failed.
        Once only: a batch answered as unreported (expire) may still have its last
        report's finish on the way."""
        if self._batches.pop(batch.number, None) is None:
            return
        del self.pump.batches[batch.number]
        for index, reason in sorted(batch.failures):
            self.session.send(ack(publish_header(batch.publishes[index]), "persisted", reason))
        succeeded = batch.commands - len(batch.failures)
        if succeeded:
            self.latencies.observe(time.perf_counter() - batch.started, succeeded)
        self._done(batch)

    def written(self, pending: PendingWrite, records: int) -> None:
        """The publisher produced `records` records for this command."""
        pending.remaining += records
        pending.produced = time.perf_counter()
        if not records:
            self.finish(pending)

    def expire(self, cutoff: float) -> int:
        """Answer the commands whose records were produced before `cutoff` (perf_counter)
        and still wait for a report: librdkafka reports each record within PublishTimeout,
        so such a report was lost (DeliveryPump._sweep). Each is answered with a failure
        saying its fate is not known (a batch: each of its records not failed already,
        the ones Kafka took among them, as no report says which) and its budget share is
        freed. The number of commands so answered. In ticket order: a command issued
        after `cutoff` ends the look."""
        overdue = []
        for pending in self._inflight.values():
            if pending.started >= cutoff:
                break
            if isinstance(pending, PublishBatch) or pending.produced < cutoff:
                overdue.append(pending)
        reason = self.pump.lost_reason()
        for pending in overdue:
            if isinstance(pending, PublishBatch):
                failed = {index for index, _ in pending.failures}
                pending.failures.extend(
                    (index, reason) for index in range(pending.commands) if index not in failed
                )
                self.finish_batch(pending)
            else:
                pending.error = pending.error or PublishError(reason)
                pending.remaining = 0
                self.finish(pending)
        return sum(p.commands for p in overdue)

    def abandon(self, pending: PendingWrite) -> None:
        """The publisher refused the command: nothing will be reported for it."""
        self._done(pending)

    def finish(self, pending: PendingWrite) -> None:
        header = pending.request.header
        if pending.error is not None:
            self.session.send(ack(header, "persisted", pending.error.reason))
        else:
            self.latencies.observe(time.perf_counter() - pending.started)
            if pending.request.wants("persisted"):
                self.session.send(ack(header, "persisted"))
        self._done(pending)

    def _done(self, pending: PendingWrite | PublishBatch) -> None:
        self._inflight.pop(pending.ticket, None)
        self.budget.release(pending.size, pending.commands)
        self._release_flushes()

    async def flushed(self) -> None:
        """Wait until every command issued so far is persisted (or failed)."""
        future = asyncio.get_running_loop().create_future()
        self._flushes.append((self._last_ticket, future))
        self._release_flushes()
        await future

    def _release_flushes(self) -> None:
        if not self._flushes:
            return
        oldest = next(iter(self._inflight), None)
        waiting = []
        for target, future in self._flushes:
            if oldest is None or oldest > target:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((target, future))
        self._flushes = waiting


def charge(request: Request) -> int:
    """A command's bytes of the PublishBudget: its payload, and the correlation id (a
    header) and SOW keys (a record each, with the key as its key and a header) its
    records carry. librdkafka's own queue limits count no header, so a client publishing
    a megabyte of correlation id with an empty payload, charged RECORD_OVERHEAD alone,
    could make the worker hold MaxPublishesInFlight megabytes."""
    header, size = request.header, len(request.payload) + RECORD_OVERHEAD
    correlation, keys = header.get("x"), header.get("k")
    if type(correlation) is str:
        size += len(correlation)
    if type(keys) is str:
        keys = keys.split(",")
    if type(keys) is list:  # what is not a str is refused before anything is produced
        size += sum(2 * len(k) + RECORD_OVERHEAD for k in keys if type(k) is str)
        size -= RECORD_OVERHEAD  # the command's own
    return size


def batch_deliveries(
    batches: dict[int, PublishBatch],
    pump: DeliveryPump,
    finish: Callable[[PublishBatch], None],
) -> Callable[[int], Callable[[KafkaError | None, Message], None]]:
    """`delivery(number)`: the report callback of a session's batched record `number`.
    The compiled core's (native/src/publish.rs, BatchDeliveries: made and called with
    no Python frame, on the loop for every record and on the pump's thread for every
    report), else its twin, _batch_delivery."""
    if core is None:
        return _batch_delivery(batches, pump, finish)
    return core.BatchDeliveries(batches, pump.failure_reason, pump.post, finish)  # type: ignore[no-any-return]


def _batch_delivery(
    batches: dict[int, PublishBatch],
    pump: DeliveryPump,
    finish: Callable[[PublishBatch], None],
) -> Callable[[int], Callable[[KafkaError | None, Message], None]]:
    """The type of a session's batched records' delivery callbacks: `Delivery(number)`
    is the record's number (batch << BATCH_BITS | index), an int made in C, as the
    publisher's own (log/publisher.py's _delivery_type), that counts its batch down on
    the pump's thread and posts the batch to the loop once it is the last report. A
    failure keeps its index, so its ack answers the right command with the reason the
    per-command path gives (DeliveryPump.failure_reason)."""

    class Delivery(int):
        __slots__ = ()

        def __call__(self, error: KafkaError | None, message: Message) -> None:
            batch = batches.get(self >> BATCH_BITS)
            if batch is None:  # answered already as unreported (Writes.expire): too late
                return
            if error is not None:
                batch.failures.append((self & INDEX_MASK, pump.failure_reason(error)))
            if next(batch.reports) == batch.expected:
                pump.post(finish, batch)

    return Delivery


def _placed(spec: TopicSpec) -> bool:
    """Whether the publisher places the topic's keys itself, by its partition count."""
    return bool(spec.key or spec.key_from_publish) and not spec.repartition
