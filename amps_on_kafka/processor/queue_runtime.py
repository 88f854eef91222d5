"""One queue at run time (QueueRuntime): its state machine, store, consumer, events log and
the thread that drives them. The engine (processor/queues.py) owns the runtimes and is
their way to subscribers; the durability rules are in its docstring."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import NewTopic

from amps_on_kafka.config import QueueConfig
from amps_on_kafka.errors import (
    AmpsError,
    PartitionsMoving,
    PublishError,
    TransportError,
    UnknownTopic,
)
from amps_on_kafka.log.bookmarks import watermarks
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.envelope import (
    H_COMMAND,
    H_EXPIRATION,
    Command,
    EnvelopeError,
    check_expiration,
    dead_letter_headers,
    headers_of,
)
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    consume_available,
    partitions_matching,
    reader,
)
from amps_on_kafka.processor.collections import collections_paused
from amps_on_kafka.processor.queue_events import EventsWriter, Pending
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_store import (
    QueueStore,
    StoredQueue,
    decode_events,
    encode_events,
    queue_store_path,
)
from amps_on_kafka.state.queue_types import (
    TP,
    Delivery,
    EventKind,
    MessageId,
    Outbox,
    QueueEntry,
    QueuePolicy,
    RecoveryPoint,
)

if TYPE_CHECKING:
    from amps_on_kafka.processor.queues import QueueEngine

log = logging.getLogger(__name__)

EVENTS_PREFIX = "_amps_queue."
GROUP_PREFIX = "amps-queue."
BATCH_SIZE = 2000
MAX_WAIT = 0.05  # seconds: bounds lease and expiry lag, and checkpoint delay
RECOVERY_EVERY = 1.0  # seconds between commits of the recovery point to Kafka
CHECKPOINT_EVERY = 0.2  # seconds: a message acked sooner never costs a RocksDB write
DISCOVER_EVERY = 5.0  # seconds between looks for new topics that UnderlyingTopic matches
# A turn of the queue's thread longer than this (a frozen process) may have outlived the
# ownership (the least session timeout is 1 s): deliveries then wait for a commit.
STALL = 0.5
_NO_COMMITTED = -1001


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def events_topic(queue: str) -> str:
    return f"{EVENTS_PREFIX}{queue}"


Done = Callable[[Any], None]  # called with the result, or with the exception


class QueueRuntime:
    """One queue: state machine, store, reader of the underlying topics, events log."""

    def __init__(self, engine: QueueEngine, config: QueueConfig) -> None:
        self.engine = engine
        self.config = config
        self.name = config.name
        self.events_topic = events_topic(config.name)
        self.state = QueueState(QueuePolicy.from_config(config), engine.clock, self._in_log)
        self.ready = threading.Event()
        self.failure: str | None = None
        self.store: QueueStore | None = None
        self._codecs: dict[str, Codec] = {}
        self._consumer = None
        self._thread = threading.Thread(
            target=self._run, name=f"amps-queue-{self.name}", daemon=True
        )
        self._store_lock = threading.Lock()
        self._closing = threading.Lock()
        self._halted = threading.Event()  # this runtime stops; the engine may go on
        self._writer = EventsWriter(
            engine.bootstrap, self.name, self._transaction_committed, self._lost, self._failed
        )
        self.refusal: AmpsError | None = None  # why commands fail now (fenced, moved)
        self._turned = time.monotonic()  # when the queue's thread last turned
        self._suspect_from = 0  # >0 after a stall: deliveries wait for this sequence
        self._produced = 0  # events records produced (a sequence number)
        self._durable = 0  # the last one committed to Kafka
        self._durable_next = 0  # the events offset after it
        # checkpoints waiting for their events: [events needed, batch, events offset or None]
        self._pending: deque[list[Any]] = deque()
        self._waiters: deque[tuple[int, Done, Any]] = deque()
        self._read = False  # records read since the last checkpoint
        self.skipped = 0  # records not taken as messages because a header doesn't decode
        # since start, for the admin port: delivered, redelivered, dead_lettered, and the
        # Reason each message left the queue for (ack, expire, taken, barrier)
        self.counts: Counter[str] = Counter()
        self._checkpoint_due = 0.0
        self._paused = False
        self._recovery_sent: tuple[float, RecoveryPoint | None] = (0.0, None)
        self._admin = None
        self._discover_due = time.monotonic() + DISCOVER_EVERY

    def start(self) -> None:
        self._thread.start()

    def halt(self, timeout: float = 30.0) -> None:
        """Stop this queue's thread alone (its ownership moved to another worker)."""
        self._halted.set()
        self.join(timeout)

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def drain(self, timeout: float) -> None:
        """Until the events produced so far are committed (after the last checkpoint)."""
        self._writer.drain(timeout)

    def close(self) -> None:
        """Once; both the election (release) and the writer (fenced) may call it."""
        with self._closing:
            self._writer.close()
            if self._consumer is not None:
                if self.refusal is None:  # fenced: the recovery point is the new owner's
                    self._commit_recovery(force=True)
                self._consumer.close()
                self._consumer = None
            self._admin = None  # an AdminClient has no close(): dropping it lets its threads go
            if self.store is not None:
                self.store.close()
                self.store = None

    def _in_log(self, message: MessageId) -> bool:
        """Whether Kafka holds `message`, which the queue has not read: an early ack is
        remembered only for a message that exists, or a bookmark naming an offset past the
        end of the log would silently swallow whatever is published there later."""
        topic, partition, offset = message
        where = TopicPartition(topic, partition)
        consumer = self._consumer
        if consumer is None:  # closed: the queue moved
            return False
        try:
            _, end = consumer.get_watermark_offsets(where, cached=True)
            if offset >= end:  # the cached end may be behind: ask the broker
                _, end = consumer.get_watermark_offsets(where, timeout=METADATA_TIMEOUT)
        except KafkaException:
            return False
        return offset < end

    # -- recovery ------------------------------------------------------------------
    def _recover(self) -> None:
        """Load the store (or start at the recovery point), replay the events log, then
        read the underlying topics from where the state ends."""
        admin = admin_client(self.engine.bootstrap)
        _ensure_events_topic(admin, self.events_topic)
        self._writer.open()  # fences the previous owner before its events are read
        self._consumer = reader(
            self.engine.bootstrap,
            **{"group.id": f"{GROUP_PREFIX}{self.name}", "auto.offset.reset": "earliest"},
        )
        self._admin = admin
        partitions = self._underlying(admin)
        if not partitions:
            raise UnknownTopic(f"no topic matches UnderlyingTopic {self.config.topic_pattern!r}")
        stored = self._open_store()
        if stored is not None:
            starts, events_from = stored.positions, stored.events_offset
        else:
            starts, events_from = self._committed(partitions)
        state = self.state
        for tp in partitions:
            state.start_at(tp, starts.get(tp, 0))
        if stored is not None:
            for entry in stored.entries:
                state.restore(entry)
            for message, early in stored.early.items():
                state.restore_early(message, early)
            state.next_seq = max(state.next_seq, stored.next_seq)
        self._durable_next = self._replay_events(events_from)
        state.ev_next = self._durable_next
        self._read = True
        self._consumer.assign(
            [TopicPartition(t, p, state.positions[(t, p)]) for t, p in partitions]
        )
        log.info(
            "queue %s: %d messages after recovery, reading %d partitions",
            self.name,
            state.depth,
            len(partitions),
        )

    def _open_store(self) -> StoredQueue | None:
        """The store, unless the events since it are no longer all in the events topic
        (retention deleted some: a worker that owned the queue long ago): it is then
        emptied, and the queue rebuilt from the recovery point its last owner committed."""
        path = queue_store_path(self.engine.state_dir, self.name)
        self.store = QueueStore(path)
        stored = self.store.load(self._codecs.get)
        kept = watermarks(self._consumer, [(self.events_topic, 0)])[(self.events_topic, 0)].low  # type: ignore[arg-type]
        if stored is None or stored.events_offset >= kept:
            return stored
        log.warning(
            "queue %s: its store needs the events from offset %d, the events topic keeps "
            "them from %d: rebuilt from the recovery point instead",
            self.name,
            stored.events_offset,
            kept,
        )
        self.store.close()
        shutil.rmtree(path)
        self.store = QueueStore(path)
        return None

    def _underlying(self, admin) -> list[TP]:
        """Every partition of the topics UnderlyingTopic matches now, codecs known."""
        partitions = partitions_matching(admin, self.config.views)
        for topic in {t for t, _ in partitions} - self._codecs.keys():
            self._codecs[topic] = self.engine.registry.spec(topic).codec
        return partitions

    def _discover(self) -> None:
        """UnderlyingTopic is a pattern: a topic created after the queue started, or a
        partition added to one, joins the queue from its start (checked every
        DISCOVER_EVERY seconds, on the queue's own thread)."""
        if time.monotonic() < self._discover_due:
            return
        self._discover_due = time.monotonic() + DISCOVER_EVERY
        try:
            found = self._underlying(self._admin)
            new = [tp for tp in found if tp not in self.state.positions]
            starts = {tp: mark.low for tp, mark in watermarks(self._consumer, new).items()}  # type: ignore[arg-type]
        except AmpsError as exc:
            log.warning("queue %s: looking for new underlying topics failed: %s", self.name, exc)
            return
        if not starts:
            return
        with self.engine.lock:
            for tp, offset in starts.items():
                self.state.start_at(tp, offset)
            self._read = True  # the next checkpoint stores the new positions
        self._consumer.incremental_assign(  # type: ignore[union-attr]
            [TopicPartition(t, p, offset) for (t, p), offset in starts.items()]
        )
        log.info("queue %s: now reading %s", self.name, ", ".join(f"{t}|{p}" for t, p in starts))

    def _committed(self, partitions: list[TP]) -> tuple[dict[TP, int], int]:
        """The recovery point committed to Kafka; the start of the logs when there is none."""
        wanted = [TopicPartition(t, p) for t, p in [*partitions, (self.events_topic, 0)]]
        found = self._consumer.committed(wanted, timeout=METADATA_TIMEOUT)  # type: ignore[union-attr]
        marks = watermarks(self._consumer, [*partitions, (self.events_topic, 0)])  # type: ignore[arg-type]
        offsets = {
            (tp.topic, tp.partition): tp.offset
            if tp.offset != _NO_COMMITTED
            else marks[(tp.topic, tp.partition)].low
            for tp in found
        }
        events = offsets.pop((self.events_topic, 0))
        return offsets, events

    def _replay_events(self, start: int) -> int:
        """Apply the events committed after the state's events offset; returns the end.
        Read read_committed: what a fenced owner wrote after this one opened is aborted."""
        consumer = reader(self.engine.bootstrap, **{"isolation.level": "read_committed"})
        where = TopicPartition(self.events_topic, 0)
        try:
            end = watermarks(consumer, [(self.events_topic, 0)])[(self.events_topic, 0)]
            if start < end.low:
                log.error(
                    "queue %s: its state needs the events from offset %d, the events topic "
                    "keeps them from %d (retention): acks recorded before are lost, and "
                    "their messages may be delivered again",
                    self.name,
                    start,
                    end.low,
                )
            start = max(start, end.low)
            position = start
            if start < end.high:
                consumer.assign([TopicPartition(self.events_topic, 0, start)])
            deadline = time.monotonic() + 10 * METADATA_TIMEOUT
            while position < end.high:
                if time.monotonic() > deadline:
                    raise TransportError(f"queue {self.name}: timed out replaying its events")
                for record in consume_available(consumer, 1000, 0.1):
                    if record.error() is None and record.offset() < end.high:
                        for event in decode_events(record.value()):
                            self.state.apply_event(event)
                        position = record.offset() + 1
                if position < end.high:  # transaction markers are read past, never returned
                    position = max(position, consumer.position([where])[0].offset)
            return end.high
        finally:
            consumer.close()

    # -- the loop ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._recover()
            self._loop(self._caught_up(watermarks(self._consumer, self.state.positions)))
            if self._halted.is_set():
                return
            self.ready.set()
            self._loop(lambda: False)
        except AmpsError as exc:  # a reason for the operator, which a traceback would bury
            self.failure = exc.reason
            log.error("queue %s failed: %s", self.name, exc.reason)
        except BaseException as exc:
            self.failure = str(exc)
            log.exception("queue %s failed", self.name)

    def _caught_up(self, marks) -> Callable[[], bool]:
        """Whether the queue has read its topics up to their ends at startup (or stopped
        reading at TargetQueueDepth): ready means recovered, as AMPS replays its journal
        before it serves a queue."""
        ends = [TopicPartition(t, p) for t, p in marks]
        highs = {tp: mark.high for tp, mark in marks.items()}

        def done() -> bool:
            if self._paused:
                return True
            read = self.state.positions
            behind = [
                tp
                for tp in ends
                if read[(tp.topic, tp.partition)] < highs[(tp.topic, tp.partition)]
            ]
            if not behind:
                return True
            # offsets without a message (transaction markers, compaction) count as read
            fetched = self._consumer.position(behind)  # type: ignore[union-attr]
            return all(tp.offset >= highs[(tp.topic, tp.partition)] for tp in fetched)

        return done

    def _loop(self, done: Callable[[], bool]) -> None:
        engine, state, consumer = self.engine, self.state, self._consumer
        self._turned = time.monotonic()  # recovering (and looking up the ends) is no stall
        while not (engine._stop.is_set() or self._halted.is_set() or done()):
            with collections_paused():  # see processor/collections.py
                records = consume_available(consumer, BATCH_SIZE, self._wait())
                read = self._entries(records) if records else ()
                del records
                with engine.lock:
                    self._turn()
                    for item in read:
                        if isinstance(item, QueueEntry):
                            state.enqueue(item)
                        else:
                            state.start_at(item[0], item[1] + 1)  # not a message: read past it
                    state.tick()
                    engine.settle()
                    if time.monotonic() >= self._checkpoint_due:
                        self.checkpoint()
            self.commit_ready()
            self._flow_control()
            self._commit_recovery()
            if self.ready.is_set():
                self._discover()

    def _turn(self) -> None:
        """Under the engine lock, each turn of the queue's thread: after a stall (the
        process frozen, maybe past the ownership's session timeout) deliveries wait until
        a transaction proves no other worker took the queue meanwhile."""
        now = time.monotonic()
        self._stalled(now)
        self._turned = now

    def _stalled(self, now: float) -> bool:
        if now - self._turned > STALL and not self._suspect_from:
            log.warning(
                "queue %s: stalled %.1f s; deliveries wait for a commit",
                self.name,
                now - self._turned,
            )
            self._suspect_from = self._produced + 1
        return self._suspect_from > 0

    def _wait(self) -> float:
        due = self.state.next_due()
        if due is None:
            return MAX_WAIT
        return max(0.0, min(MAX_WAIT, (due - self.engine.clock()) / 1000))

    def _entries(self, records: list[Message]) -> list[QueueEntry | tuple[TP, int]]:
        """The messages read, and (partition, offset) of records that are not messages.

        Outside the engine lock: the state is not touched here."""
        codecs = self._codecs
        entries: list[QueueEntry | tuple[TP, int]] = []
        for record in records:
            error = record.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                log.warning("queue %s: consumer error %s", self.name, error.str())
                continue
            self._read = True
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            try:
                headers = headers_of(record)
            except EnvelopeError:
                headers, expiration = None, _BAD_HEADER
            else:
                expiration = _message_expiration(headers)
            if expiration is _NOT_A_MESSAGE or expiration is _BAD_HEADER:
                if expiration is _BAD_HEADER:
                    self.skipped += 1
                    log.warning(
                        "queue %s: %s|%s|%s| has a bad header: not a message",
                        self.name,
                        topic,
                        partition,
                        offset,
                        extra={
                            "event": "skipped",
                            "queue": self.name,
                            "topic": topic,
                            "partition": partition,
                            "offset": offset,
                            "reason": "bad_header",
                        },
                    )
                entries.append(((topic, partition), offset))
                continue
            entries.append(
                QueueEntry(
                    (topic, partition, offset),
                    record.timestamp()[1],
                    record.value() or b"",
                    codecs[topic],
                    headers,
                    expiration,  # type: ignore[arg-type]
                )
            )
        return entries

    def _flow_control(self) -> None:
        """TargetQueueDepth: read no further while messages wait beyond the active part."""
        if self.state.policy.target_depth is None:
            return
        consumer = self._consumer
        assigned = consumer.assignment()  # type: ignore[union-attr]
        if self.state.waiting and not self._paused:
            consumer.pause(assigned)  # type: ignore[union-attr]
            self._paused = True
        elif self._paused and not self.state.waiting:
            consumer.resume(assigned)  # type: ignore[union-attr]
            self._paused = False

    # -- recording -----------------------------------------------------------------
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
        for event in box.events:
            if event.kind is EventKind.REMOVE:
                counts[event.reason] += 1  # type: ignore[index]
        deliveries = box.deliveries
        if deliveries:
            counts["delivered"] += len(deliveries)
            counts["redelivered"] += sum(d.entry.deliveries > 1 for d in deliveries)
        if box.dead_letters and self.config.dead_letter_topic is not None:
            counts["dead_lettered"] += len(box.dead_letters)

    def _produce(self, events, deferred: list[Delivery] | None) -> None:
        self._produced += 1
        record = Pending(self.events_topic, encode_events(events), None, self._produced, deferred)
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
        with self.engine.lock:
            if self._suspect_from and sequence >= self._suspect_from:
                self._suspect_from = 0  # still the owner after the stall
            for deliveries in deferred:
                if deliveries and self.refusal is None:
                    self.engine.send(self.name, deliveries)

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
        if self.store is None or self.failure is not None:
            return
        self._checkpoint_due = time.monotonic() + CHECKPOINT_EVERY
        changed, early = state.take_dirty()
        if not (changed or early or self._read):
            return
        self._read = False
        point = state.recovery_point()
        batch = self.store.prepare(changed, early, state.positions, state.next_seq, point)
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


_NOT_A_MESSAGE = object()
_BAD_HEADER = object()  # skipped and counted (QueueRuntime.skipped), never fatal
# no command header is a publish; a foreign producer may still write "publish"
_MESSAGES = (None, Command.PUBLISH.value.encode(), Command.DELTA_PUBLISH.value.encode())
_COMMANDS = frozenset(c.value.encode() for c in Command)


def _message_expiration(headers: list[tuple[str, bytes]] | None) -> float | object | None:
    """A publish's own expiration (seconds, or None), _NOT_A_MESSAGE for a record that is
    no message (a sow_delete), or _BAD_HEADER for one whose command or expiration does
    not decode (an expiration the SOW could not store either, log/envelope.py). Reads
    just the two headers that matter, since every record read passes here."""
    command = expiration = None
    for name, value in headers or ():
        if value is None:  # as Envelope.from_headers: a header without a value says nothing
            continue
        if name == H_COMMAND:
            command = value
        elif name == H_EXPIRATION:
            expiration = value
    if command not in _MESSAGES:
        return _NOT_A_MESSAGE if command in _COMMANDS else _BAD_HEADER
    try:
        return None if expiration is None else check_expiration(float(expiration))
    except ValueError:  # MessageError is one too
        return _BAD_HEADER


def _settle_future(future: Future, outcome: Any) -> None:
    """Set a result (or an exception), unless the waiter gave up (a closed connection)."""
    if future.set_running_or_notify_cancel():
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _ensure_events_topic(admin, name: str) -> None:
    futures = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=METADATA_TIMEOUT)
    try:
        futures[name].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TransportError(f"can't create the queue-events topic {name!r}: {exc}") from exc
