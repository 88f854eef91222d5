"""One queue at run time (QueueRuntime): its state machine, store, consumer, events log and
the thread that drives them. The engine (processor/queues.py) owns the runtimes and is
their way to subscribers; the durability rules are in its docstring.

This module keeps the runtime's state, its thread's loop and the reading of the
underlying topics; how a queue is recovered at start is processor/queue_recovery.py, and
how its changes are recorded (events, dead letters, checkpoints, answers once durable)
processor/queue_recording.py. Both are mixins of QueueRuntime; their log lines keep this
module's logger, which operators filter on (docs/operations.md, Logging)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, fields
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from amps_on_kafka.config import QueueConfig
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.bookmarks import watermarks
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.envelope import (
    H_COMMAND,
    H_EXPIRATION,
    Command,
    EnvelopeError,
    check_expiration,
    headers_of,
)
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, consume_available
from amps_on_kafka.native import core
from amps_on_kafka.processor.collections import collections_paused
from amps_on_kafka.processor.queue_events import EventsWriter
from amps_on_kafka.processor.queue_recording import Done, Recording
from amps_on_kafka.processor.queue_recovery import Recovery, Reread
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_store import QueueStore
from amps_on_kafka.state.queue_types import TP, MessageId, QueueEntry, QueuePolicy, RecoveryPoint

if TYPE_CHECKING:
    from amps_on_kafka.processor.queues import QueueEngine

log = logging.getLogger(__name__)  # also the mixins' (queue_recovery.py, queue_recording.py)

EVENTS_PREFIX = "_amps_queue."
BATCH_SIZE = 2000
MAX_WAIT = 0.05  # seconds: bounds lease and expiry lag, and checkpoint delay
DISCOVER_EVERY = 5.0  # seconds between looks for new topics that UnderlyingTopic matches
# A turn of the queue's thread longer than this (a frozen process) may have outlived the
# ownership (the least session timeout is 1 s): deliveries then wait for a commit.
STALL = 0.5


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def events_topic(queue: str) -> str:
    return f"{EVENTS_PREFIX}{queue}"


class QueueRuntime(Recovery, Recording):
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
        # the messages checkpoints leave in their topics (state/queue_store_runs.py), and
        # a restart's reading them again until the topics are read to their ends
        self.runs: Any = None
        self._reread: Reread | None = None

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
        with self.engine.lock:  # see track_entries: the queue may be dropped after this
            track_entries(self.state.entries.values())
            track_entries(self.state.leased())  # at-most-once: taken, no longer in entries
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

    # -- the loop ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._recover()
            self._loop(self._caught_up(watermarks(self._consumer, self.state.positions)))
            if self._halted.is_set():
                return
            self._finish_reread()
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
        # the compiled reader's batches stay librdkafka's records (log/native_reader.py)
        available = getattr(consumer, "available", None) or partial(consume_available, consumer)
        self._turned = time.monotonic()  # recovering (and looking up the ends) is no stall
        while not (engine._stop.is_set() or self._halted.is_set() or done()):
            with collections_paused():  # see processor/collections.py
                records = available(BATCH_SIZE, self._wait())
                read = self._entries(records) if records else ()
                del records
                with engine.lock:
                    self._turn()
                    if self._reread is not None:
                        read = self._reread.take(state, read)
                    state.enqueue_read(read)
                    state.tick()
                    engine.settle()
                    if time.monotonic() >= self._checkpoint_due:
                        self.checkpoint()
            self.commit_ready()
            self._flow_control()
            self._commit_recovery()
            if self.ready.is_set():
                self._discover()

    def _finish_reread(self) -> None:
        """Read to the ends at startup: what the checkpoint left in the topics is back."""
        if self._reread is not None:
            with self.engine.lock:
                self._reread.finish(self.state, self.name)
                self._reread = None

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

    def _entries(self, records: Sequence[Message]) -> list[QueueEntry | tuple[TP, int]]:
        """The messages read, and (partition, offset) of records that are not messages:
        `records` is confluent-kafka's, or the compiled reader's batch (core.RawBatch,
        whose `records[at]` gives a record's error alone).

        Outside the engine lock: the state is not touched here."""
        entries: list[QueueEntry | tuple[TP, int]] = []
        bad: list[MessageId] = []
        at, end = 0, len(records)
        while at < end:
            at = read_records(records, at, self._codecs, entries, bad)
            self._skip(bad)
            if at < end:  # a record with an error: why the read stopped there
                error = cast(KafkaError, records[at].error())
                if error.fatal():
                    raise KafkaException(error)
                log.warning("queue %s: consumer error %s", self.name, error.str())
                at += 1
        if entries:  # each record that is not an error is in it
            self._read = True
        return entries

    def _skip(self, bad: list[MessageId]) -> None:
        """Records whose header does not decode: not messages, counted and logged."""
        for topic, partition, offset in bad:
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
        bad.clear()

    def _flow_control(self) -> None:
        """TargetQueueDepth: read no further while messages wait beyond the active part."""
        if self.state.policy.target_depth is None or self._reread is not None:
            return
        consumer = self._consumer
        assigned = consumer.assignment()  # type: ignore[union-attr]
        if self.state.waiting and not self._paused:
            consumer.pause(assigned)  # type: ignore[union-attr]
            self._paused = True
        elif self._paused and not self.state.waiting:
            consumer.resume(assigned)  # type: ignore[union-attr]
            self._paused = False

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


def _read_records_twin(
    records: list[Message],
    start: int,
    codecs: dict[str, Codec],
    entries: list[QueueEntry | tuple[TP, int]],
    bad: list[MessageId],
) -> int:
    """read_records in Python (used without the compiled core)."""
    for at in range(start, len(records)):
        record = records[at]
        if record.error() is not None:
            return at
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        try:
            headers = headers_of(record)
        except EnvelopeError:
            headers, expiration = None, _BAD_HEADER
        else:
            expiration = _message_expiration(headers)
        if expiration is _NOT_A_MESSAGE or expiration is _BAD_HEADER:
            entries.append(((topic, partition), offset))
            if expiration is _BAD_HEADER:
                bad.append((topic, partition, offset))
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
    return len(records)


def _entry_defaults() -> list[tuple[str, Any]]:
    """Every QueueEntry slot a record does not fill, with its default: what the compiled
    reader writes into each entry it makes, as the dataclass's __init__ does."""
    filled = {"id", "timestamp", "payload", "codec", "headers", "expiration"}
    defaults = [(f.name, f.default) for f in fields(QueueEntry) if f.name not in filled]
    missing = [name for name, default in defaults if default is MISSING]
    if missing:
        raise TypeError(f"QueueEntry fields {missing} have no default: read_records fills none")
    return defaults


def _track_entries_twin(entries: Iterable[QueueEntry]) -> None:
    """track_entries without the core: every entry the twin makes is tracked already."""


_reader = (
    core.EntryReader(
        QueueEntry, _entry_defaults(), _message_expiration, _NOT_A_MESSAGE, _BAD_HEADER
    )
    if core is not None
    else None
)
# The records of a consumed batch from index `start` read into `entries` (a QueueEntry
# per message, ((topic, partition), offset) per record that is not one) and the ids of
# those whose header is bad into `bad`, up to the first record with an error: its index
# is returned (len(records) when none). The compiled reader writes each entry's slots
# directly (the twin: ~1.1 us a record on the queue's thread), and the cyclic collector
# does not track the entries it makes: a message waits in the queue until acked, and
# the collector's passes walked each of them (~0.6 us a message).
read_records: Callable[..., int] = _reader.read if _reader is not None else _read_records_twin
# The entries the compiled reader made given back to the collector: the only reference
# out of an entry that can lead back to it is its lease's holder (a subscription, whose
# callbacks reach the engine and its queues), so a closing queue tracks what it holds.
track_entries: Callable[[Iterable[QueueEntry]], None] = (
    _reader.track if _reader is not None else _track_entries_twin
)
