"""publish, delta_publish, sow_delete and flush: commands that go to the log.

Every command is written by LogPublisher, the same code path as the `kafka://` client,
so validation (bad JSON, a missing key field) happens there, before Kafka, and becomes a
failure ack. Each session has its own LogPublisher, because the publisher id stamped on
every record is the client's logon name, but they all share the gateway's one producer:
a producer per connection cost 3 threads and up to 1 GiB of buffer each, and took the
worker from 64 to 707 MiB with three publishers during a Kafka outage.

Sequence numbers are the client's (`s`, as AMPS clients number their publishes), so the
log carries them and a republished message keeps its number; without `s` the session's
publisher numbers the command.

Bounds: the commands produced and not yet reported by Kafka are counted against the
worker's PublishBudget (commands and bytes). A session that would exceed it waits, and
while it waits its socket is not read — the client is slowed down, the worker's memory is
not grown. Kafka's `message.timeout.ms` is the gateway's PublishTimeout, so a publish that
Kafka cannot take in time gets a failure ack naming the cause and frees its share.

Acks:
- `persisted` only from Kafka's delivery report (acks=all). librdkafka runs delivery
  callbacks inside poll/flush only, so one DeliveryPump thread serves the shared
  producer and hands the outcomes to the event loop in batches.
- a sow_delete's `processed` ack waits for the worker to apply every record it wrote
  (one per partition for a filter, one per key) and sums what they deleted.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from confluent_kafka import KafkaError, Message, Producer

from amps_on_kafka.errors import AmpsError, PublishError
from amps_on_kafka.log.codecs import avro_document
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.native_producer import CompiledProducer
from amps_on_kafka.log.publisher import LogPublisher, Persisted
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.native import core
from amps_on_kafka.processor.memory import release_freed_memory
from amps_on_kafka.protocol.frames import Event, Publish, publish_header
from amps_on_kafka.security.entitlements import Denied
from amps_on_kafka.server.cluster import RESULTS
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import (
    ProtocolError,
    Request,
    compiled_filter,
    count,
    number,
    sow_keys,
    text,
)
from amps_on_kafka.state.events import CommandResult

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

Outcome = Callable[[PublishError | None], None]  # runs on the loop with Kafka's verdict

IDLE_WAIT = 0.1  # seconds the pump waits for a report when nothing is in flight
SERVE_SLICE = 0.02  # seconds the pump waits for reports while something is in flight
DRAIN_SLICE = 500  # delivery outcomes handled per turn of the event loop
TRIM_AFTER_BYTES = 8 * 1024 * 1024  # see PublishBudget
TRIM_AFTER_COMMANDS = 2_000
# A partition count this close to its expiry is refreshed (off the loop) before a
# publish uses it, so that the publish never finds it expired and asks Kafka on the loop.
REFRESH_MARGIN = 5.0
# What a command costs the budget beyond its payload: headers, key and librdkafka's own
# per-message bookkeeping, so a flood of empty publishes is bounded too.
RECORD_OVERHEAD = 256
# A batch's records are numbered (batch number << BATCH_BITS) | index for their reports.
BATCH_BITS = 32
INDEX_MASK = (1 << BATCH_BITS) - 1


class DeliveryPump:
    """Runs the shared producer's delivery callbacks, off the event loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, producer: Producer | CompiledProducer, timeout: float
    ) -> None:
        self._loop = loop
        self._producer = producer
        self._timeout = timeout
        self._outcomes: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._posted = False
        # Batches by number, every session's (numbered here, so that a compiled producer's
        # reports, which carry only the number, find theirs), with their finish.
        self.batch_numbers = itertools.count()
        self.batches: dict[int, tuple[PublishBatch, Callable[[PublishBatch], None]]] = {}
        if getattr(producer, "compiled", False):  # reports come by the batch (native_producer)
            producer.serve_batches(self._batch_reports)  # type: ignore[union-attr]
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="amps-gateway-deliveries", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def callback(self, handler: Outcome) -> Persisted:
        """An on_persisted callback that runs `handler` on the event loop."""

        def persisted(error: PublishError | None, message: Message) -> None:
            if error is not None:
                error = PublishError(self.failure_reason(message.error()))
            self.post(handler, error)

        return persisted

    def post(self, handler: Callable[[Any], None], argument: Any) -> None:
        """Run `handler(argument)` on the event loop, in the order posted (from the
        thread serving the reports)."""
        self._outcomes.append((handler, argument))
        if not self._posted:  # one loop wake-up per burst of reports
            self._posted = True
            with suppress(RuntimeError):  # the loop is closed: the gateway stopped
                self._loop.call_soon_threadsafe(self._drain)

    def _batch_reports(self, groups: list[tuple[int, int, list[tuple[int, int, str]]]]) -> None:
        """A poll's reports of batched records from the compiled producer, by batch
        (number, reports, failures): counted down as each report is by BatchDelivery."""
        for batch_number, reports, failures in groups:
            batch, finish = self.batches[batch_number]
            for index, code, reason in failures:
                batch.failures.append((index, self.failure_reason(KafkaError(code, reason))))
            draws = batch.reports
            for _ in range(reports):
                if next(draws) == batch.expected:
                    self.post(finish, batch)

    def failure_reason(self, error: KafkaError) -> str:
        """What the publisher is told: a timeout says how long Kafka was given."""
        if error.code() == KafkaError._MSG_TIMED_OUT:
            return f"Kafka did not acknowledge within {self._timeout:g}s: {error.str()}"
        return f"Kafka did not persist the message: {error.str()}"

    def _drain(self) -> None:
        """Hand Kafka's verdicts to the sessions, DRAIN_SLICE at a time: when a broker
        comes back, thousands arrive at once, and the other clients must not wait for
        all of their acks to be written (that was a 0.7 s pause)."""
        self._posted = False
        outcomes = self._outcomes
        for _ in range(min(len(outcomes), DRAIN_SLICE)):
            handler, argument = outcomes.popleft()
            handler(argument)
        if outcomes and not self._posted:
            self._posted = True
            self._loop.call_soon(self._drain)

    def _run(self) -> None:
        producer = self._producer
        while not self._stop.is_set():
            producer.poll(SERVE_SLICE if len(producer) else IDLE_WAIT)


class PublishBudget:
    """The worker's publish commands produced and not yet reported by Kafka, bounded.

    Lives on the event loop. Waiters are served first come, first served, so a heavy
    publisher cannot starve a light one; a command larger than the whole byte budget
    still goes when nothing else is in flight (the frame limit bounds it).

    When the budget empties after holding TRIM_AFTER_BYTES or TRIM_AFTER_COMMANDS (a
    publish costs librdkafka about a kilobyte beside its payload), the freed memory is
    handed back to the system (`release_freed_memory`): librdkafka's copies of the
    publishes are freed in its threads' malloc arenas, which glibc keeps, so a worker
    stayed 35 MiB larger after a Kafka outage (bench robustness, a log topic).
    """

    def __init__(self, max_bytes: int, max_commands: int) -> None:
        self.max_bytes = max_bytes
        self.max_commands = max_commands
        self.bytes = 0
        self.commands = 0
        self.peak = (0, 0)  # bytes, commands held at most since the budget was last empty
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def take_now(self, size: int, commands: int = 1) -> bool:
        """Take `size` bytes and `commands` commands if they fit now, ahead of nobody."""
        if not self._waiting and self._fits(size, commands):
            self._take(size, commands)
            return True
        return False

    def room(self) -> tuple[int, int]:
        """(commands, bytes) a batch may take now; none while others wait."""
        if self._waiting:
            return 0, 0
        return self.max_commands - self.commands, self.max_bytes - self.bytes

    async def reserve(self, size: int) -> None:
        """Take `size` bytes and one command, waiting for room."""
        if self.take_now(size):
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((size, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted just as it was cancelled: give it back
            else:  # those behind it may fit now
                self._waiting = deque(w for w in self._waiting if w[1] is not future)
                self._grant()
            raise

    def release(self, size: int, commands: int = 1) -> None:
        self.bytes -= size
        self.commands -= commands
        self._grant()
        if self.commands == 0:
            if self.peak[0] >= TRIM_AFTER_BYTES or self.peak[1] >= TRIM_AFTER_COMMANDS:
                asyncio.get_running_loop().run_in_executor(None, release_freed_memory)
            self.peak = (0, 0)

    def _grant(self) -> None:
        """Serve the waiters in order while the first one fits."""
        while self._waiting and self._fits(self._waiting[0][0]):
            size, future = self._waiting.popleft()
            if not future.cancelled():
                self._take(size)
                future.set_result(None)

    def _fits(self, size: int, commands: int = 1) -> bool:
        if self.commands + commands > self.max_commands:
            return False
        # one command larger than the byte budget goes alone; a batch never exceeds it
        return (self.commands == 0 and commands == 1) or self.bytes + size <= self.max_bytes

    def _take(self, size: int, commands: int = 1) -> None:
        self.bytes += size
        self.commands += commands
        peak = self.peak
        if self.bytes > peak[0] or self.commands > peak[1]:
            self.peak = (max(peak[0], self.bytes), max(peak[1], self.commands))


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
    commands: ClassVar[int] = 1  # of the budget

    def persisted(self, error: PublishError | None) -> None:
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
    started: float = field(default_factory=time.perf_counter)


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
        size = len(request.payload) + RECORD_OVERHEAD
        await self.budget.reserve(size)
        return self._issue(request, size)

    def begin_at_once(self, request: Request) -> PendingWrite | None:
        """begin() when the budget has room now; None when the command must wait."""
        size = len(request.payload) + RECORD_OVERHEAD
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
        """Kafka reported every record of `batch`: a failure ack for each that failed."""
        del self._batches[batch.number]
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
        if not records:
            self.finish(pending)

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
            batch = batches[self >> BATCH_BITS]
            if error is not None:
                batch.failures.append((self & INDEX_MASK, pump.failure_reason(error)))
            if next(batch.reports) == batch.expected:
                pump.post(finish, batch)

    return Delivery


def _placed(spec: TopicSpec) -> bool:
    """Whether the publisher places the topic's keys itself, by its partition count."""
    return bool(spec.key or spec.key_from_publish) and not spec.repartition


def publish_data(spec: TopicSpec, payload: bytes) -> Any:
    """The wire carries JSON: an Avro topic's publisher encodes the decoded document."""
    return avro_document(payload) if spec.message_type == "avro" else payload


async def publish(session: Session, request: Request) -> None:
    """publish and delta_publish."""
    topic: str = text(request.header, "t", required=True)  # type: ignore[assignment]
    writes = session.writes
    pending = await writes.begin(request)  # first: the spec must be fresh when it is used
    try:
        spec = await writes.spec(topic)
    except BaseException:  # the session closed meanwhile: free its share
        writes.abandon(pending)
        raise
    _write(session, pending, topic, spec)


def publish_at_once(session: Session, header: dict[str, Any], payload: bytes) -> bool:
    """A plain publish (the session checked: no acks asked, nothing to authorize, no
    queue's name) written without a turn of the event loop, when the budget has room and
    the topic's spec is fresh; False, having done nothing, when it must take the full
    path. A refusal is a failure ack, as on the full path. Most of a tcp:// publish's
    cost was the layers of that path, each a coroutine (docs/performance.md)."""
    topic = header.get("t")
    writes = session.writes
    if type(topic) is not str or (spec := writes.known_spec(topic)) is None:
        return False
    pending = writes.begin_at_once(Request(header, payload, NO_ACKS))
    if pending is None:
        return False
    try:
        _write(session, pending, topic, spec)
    except AmpsError as exc:  # as _handle answers it
        session.fail(header, exc.reason, exc)
    return True


NO_ACKS: frozenset[str] = frozenset()


def publish_run(session: Session, events: list[Event], start: int) -> int:
    """Write the run of plain publishes beginning at events[start] as one PublishBatch
    and return the index of the first event not taken, which the session handles as
    ever (the session checked its user: nothing to authorize). A frame publish_encoded
    can't take (bad JSON, no key, a full producer queue...) ends the run, so its error
    is the per-command path's; the run is as long as the budget has room for now, and
    the command after it takes the per-command path (which waits for room).
    Handling a read's publishes by the batch, not one by one, is what tcp:// publishing
    needed (docs/performance.md)."""
    writes = session.writes
    end, size = _plain_run(session, writes, events, start)
    if end == start or not writes.budget.take_now(size, end - start):
        return start
    batch = writes.open_batch(size, end - start)
    run = writes.publisher.publish_run  # compiled: the common case with no Python frame
    position = run(events, start, end, writes.delivery, batch.number << BATCH_BITS, batch.publishes)
    left: list[Publish] = events[position:end]  # type: ignore[assignment]
    writes.seal(batch, sum(len(e[2]) for e in left) + RECORD_OVERHEAD * len(left))
    return position


def _plain_run(
    session: Session, writes: Writes, events: list[Event], start: int
) -> tuple[int, int]:
    """The end of the run of plain publishes (Publish tuples) from `start` that
    publish_encoded may write, and their budget share: to topics whose specs are fresh
    (Writes.known_spec), routed by the publisher, and no queue's; as many as the budget
    has room for now (a run cut short there is not scanned again for each command the
    per-command path then takes)."""
    queues, takes = session.gateway.queues, dict[str, bool]()
    commands, room = writes.budget.room()
    last = min(len(events), start + commands)
    position, size = start, 0
    while position < last:
        event = events[position]
        if type(event) is not tuple:
            break
        topic = event[0]
        taken = takes.get(topic)
        if taken is None:
            taken = takes[topic] = (
                writes.known_spec(topic) is not None
                and writes.publisher.routed(topic)
                and not (queues is not None and queues.serves(topic))
            )
        cost = len(event[2]) + RECORD_OVERHEAD
        if not taken or size + cost > room:
            break
        size += cost
        position += 1
    return position, size


def _write(session: Session, pending: PendingWrite, topic: str, spec: TopicSpec) -> None:
    """Produce a publish or delta_publish whose budget share `pending` holds."""
    header, writes = pending.request.header, pending.writes
    try:
        writes.publisher.publish(  # a field absent is None: no call to read it
            topic,
            publish_data(spec, pending.request.payload),
            expiration=number(header, "e") if "e" in header else None,
            command=Command.PUBLISH if header["c"] == "publish" else Command(header["c"]),
            sow_key=text(header, "k") if "k" in header else None,
            correlation_id=text(header, "x") if "x" in header else None,
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except BaseException:  # refused: free its share
        writes.abandon(pending)
        raise
    writes.written(pending, 1)
    if pending.request.wants("processed"):
        session.send(ack(header, "processed"))


def _only_from_peers(session: Session, header: dict[str, Any]) -> None:
    """Refuse RESULTS (a peer's question for its sow_delete's counts) from a session
    that is not a peer gateway's, once peers log on as such (a PeerSecret): a user's
    session could take another publisher's counts (the peer asking would wait them out)
    and hold a watch per sequence it names for as long as it stays connected."""
    identity = session.identity
    from_peer = identity is not None and identity.method == "peer"
    if RESULTS in header and session.gateway.peer_access.secret is not None and not from_peer:
        raise Denied(f"{RESULTS!r} is for the gateways of one group only")


async def sow_delete(session: Session, request: Request) -> None:
    """By filter `f`, by SOW keys `k`, or by the data in the payload.

    With `s`, the records written are numbered s, s+1, ... (one per partition for a
    filter, one per key): the client reserves that many sequence numbers.
    """
    header = request.header
    topic = text(header, "t", required=True)
    session.gateway.engine.sow_config(topic)  # only this worker's SOW topics can be counted
    cluster = session.gateway.cluster
    _only_from_peers(session, header)
    if cluster is not None and cluster.results_wanted(header):  # a peer counting its delete
        cluster.send_results(session, request)
        return
    filter_text = text(header, "f")
    if filter_text is not None:
        await compiled_filter(session, header)  # a bad filter is refused with its position
    writes = session.writes
    pending = await writes.begin(request)  # first: the spec must be fresh when it is used
    try:
        spec = await writes.spec(topic)
        data = publish_data(spec, request.payload) if request.payload else None
        sequences = writes.publisher.sow_delete(
            topic,
            filter=filter_text,
            keys=sow_keys(header),
            data=data,
            correlation_id=text(header, "x"),
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except BaseException:  # refused, or the session closed meanwhile: free its share
        writes.abandon(pending)
        raise
    writes.written(pending, len(sequences))
    entry = session.gateway.deletes.expect(
        session, request, writes.publisher.publisher_id, sequences
    )
    if cluster is not None and sequences:  # results from the partitions the others serve
        session.spawn(cluster.collect_results(session, topic, entry), request)


async def flush(session: Session, request: Request) -> None:
    """Answered with a processed ack once everything published before it is persisted."""
    session.spawn(_flush(session, request), request)


async def _flush(session: Session, request: Request) -> None:
    await session.writes.flushed()
    session.send(ack(request.header, "processed"))


RECENT_RESULTS = 10_000  # results of records no command here waits for, kept for a peer
MAX_WATCHED = 100_000  # results one connection may await at once (a peer's _results)


@dataclass(eq=False)
class _Delete:
    session: Session
    request: Request
    remaining: int
    publisher_id: str = ""
    sequences: list[int] = field(default_factory=list)
    deleted: int = 0
    errors: list[str] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, result: CommandResult) -> None:
        self.deleted += result.deleted
        if result.error is not None:
            self.errors.append(result.error)
        self.remaining -= 1
        if self.remaining == 0:
            self.done()

    def done(self) -> None:
        self.finished.set()
        reason = "; ".join(self.errors) or None
        if reason or self.request.wants("processed"):
            self.session.send(ack(self.request.header, "processed", reason, matches=self.deleted))


class DeleteTracker:
    """Matches the worker's results of sow_delete records to the commands that wrote them.

    Keyed by (publisher id, sequence), which LogPublisher stamps on every record. Lives on
    the event loop; the engine's results reach it through the gateway's listener.
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], _Delete] = {}
        # For a peer gateway counting a delete it wrote (server/cluster.py): what it asked
        # to be sent, and the results nobody here waited for, the latest RECENT_RESULTS
        # (a result may come before the peer's request does).
        self._watched: dict[tuple[str, int], tuple[Session, Callable[[CommandResult], None]]]
        self._watched = {}
        self._watching: Counter[Session] = Counter()  # per connection, bounded: MAX_WATCHED
        self._recent: dict[tuple[str, int], CommandResult] = {}

    def expect(
        self, session: Session, request: Request, publisher_id: str, sequences: list[int]
    ) -> _Delete:
        entry = _Delete(session, request, len(sequences), publisher_id, sequences)
        if not sequences:
            entry.done()
        for sequence in sequences:
            self._waiting[(publisher_id, sequence)] = entry
        return entry

    def apply(self, results: list[CommandResult]) -> None:
        for result in results:
            if result.publisher_id is None or result.sequence is None:
                continue
            key = (result.publisher_id, result.sequence)
            entry = self._waiting.pop(key, None)
            watcher = self._watched.pop(key, None) if entry is None else None
            if entry is not None:
                entry.add(result)
            elif watcher is not None:
                self._watching[watcher[0]] -= 1
                watcher[1](result)
            else:
                self._recent[key] = result
                if len(self._recent) > RECENT_RESULTS:  # dicts keep insertion order
                    del self._recent[next(iter(self._recent))]

    def watch(
        self,
        session: Session,
        publisher_id: str,
        sequences: list[int],
        deliver: Callable[[CommandResult], None],
    ) -> None:
        """`deliver` each result of these records applied here, past or to come. What a
        connection awaits is bounded (MAX_WATCHED): each costs memory until it comes or
        the connection closes, and any client may ask when no PeerSecret is set."""
        if self._watching[session] + len(sequences) > MAX_WATCHED:
            raise ProtocolError(
                f"{RESULTS!r} asks for {len(sequences)} results where this connection awaits "
                f"{self._watching[session]}: at most {MAX_WATCHED:,} at once"
            )
        for sequence in sequences:
            key = (publisher_id, sequence)
            result = self._recent.pop(key, None)
            if result is not None:
                deliver(result)
            else:
                replaced = self._watched.get(key)
                if replaced is not None:
                    self._watching[replaced[0]] -= 1
                self._watched[key] = (session, deliver)
                self._watching[session] += 1

    def forget(self, session: Session) -> None:
        self._waiting = {k: e for k, e in self._waiting.items() if e.session is not session}
        self._watched = {k: w for k, w in self._watched.items() if w[0] is not session}
        self._watching.pop(session, None)
