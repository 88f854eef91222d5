"""Reading the log from a bookmark: the engine behind bookmark subscriptions and replay.

One consumer, assigned (never subscribed), so the position is exactly the bookmark and
Kafka's group protocol never moves it. The end offsets taken when the replay starts
decide when the `completed` marker is due: everything before them is replay, anything
after is live.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from amps_on_kafka.errors import InvalidBookmark, MessageError, TransportError, UnknownTopic
from amps_on_kafka.expr.patterns import PatternError, compile_pattern
from amps_on_kafka.log import replay_watch
from amps_on_kafka.log.bookmarks import (
    TP,
    Bookmark,
    parse_bookmark,
    resolve_start,
    resolve_stop,
    watermarks,
)
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.kafka import (
    consume_available,
    partitions_of,
    reader_config,
    topic_names,
)
from amps_on_kafka.log.message import (
    COMPLETED,
    RECORD_BUILDER,
    TICK,
    Completed,
    LogMessage,
    RecordMessage,
    record_messages,
)
from amps_on_kafka.log.native_reader import native_reader, positions
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.replay_watch import ReplayWatch

Predicate = Callable[[Any], bool]
_PLAIN_TOPIC = re.compile(r"^[A-Za-z0-9._-]+$")
# Records consumed at a time. Each consumed record is an object the cyclic collector
# tracks, alive until the batch has been read: a batch over the collector's first
# threshold (700 allocations by default) starts collections that traverse its records,
# promote them, and so start full collections, ~0.4 us a record at 2,000 a batch
# (docs/performance.md). Under it, the records are freed, and the collector's count
# falls back, before a collection is due.
BATCH_SIZE = 500


def select_topics(client, pattern: str) -> list[str]:
    """A topic name, or a regular expression over topic names (AMPS's topic regex)."""
    if _PLAIN_TOPIC.match(pattern):
        partitions_of(client, pattern)
        return [pattern]
    try:  # RE2, linear time: the pattern may come from any client of a gateway
        compile_pattern(pattern)  # alone first: wrapping must not make a bad pattern good
        whole = compile_pattern(f"^(?:{pattern})$")
    except PatternError as exc:
        raise UnknownTopic(
            f"topic pattern {pattern!r} is not a valid regular expression: {exc}"
        ) from exc
    matched = [name for name in topic_names(client) if whole(name)]
    if not matched:
        raise UnknownTopic(f"no topic matches the pattern {pattern!r}")
    return matched


class Replay:
    """Iterates the log from a bookmark: messages, one COMPLETED, then live messages.

    With `until`, iteration ends at that point instead of following the log. With
    `max_idle`, iteration ends when nothing was yielded for that many seconds: a quiet log,
    or records the predicate drops (checked between batches, so iterating again goes on
    exactly where it stopped). That is what lets a follower of the replay wake on time.

    A topic deleted while it is replayed ends the replay with UnknownTopic, and Kafka not
    answering for `outage_limit` seconds (replay_watch.OUTAGE_LIMIT, 60, by default) with
    TransportError: both are noticed while polls come back empty (log/replay_watch.py).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        bookmark: str | Bookmark = "0",
        *,
        predicate: Predicate | None = None,
        until: str | None = None,
        registry: TopicRegistry | None = None,
        max_idle: float | None = None,
        batch_size: int = BATCH_SIZE,
        outage_limit: float | None = None,
    ) -> None:
        self.predicate = predicate
        self.max_idle = max_idle
        self.finished = False  # reached `until` on every partition: iterating again ends too
        self.batch_size = batch_size
        config = reader_config(bootstrap)
        self._consumer = Consumer(config)
        # The compiled reader (log/native_reader.py) of a replay with nothing to check per
        # record (no filter, no stop): it reads, the consumer only prepares. Made first, so
        # it connects while the consumer prepares.
        plain = predicate is None and until is None and RECORD_BUILDER is not None
        self._native: Any = native_reader(config) if plain else None
        self._watch: ReplayWatch | None = None
        try:
            self._prepare(bootstrap, topic, bookmark, until, registry)
            limit = replay_watch.OUTAGE_LIMIT if outage_limit is None else outage_limit
            self._watch = ReplayWatch(bootstrap, self.topics, limit)
            self._open()
        except BaseException:
            self.close()
            raise

    def _prepare(self, bootstrap, topic, bookmark, until, registry) -> None:
        registry = registry or TopicRegistry(bootstrap)
        self.topics = select_topics(self._consumer, topic)
        if self._native is not None:
            self._native.look_up(self.topics)
        self._codecs = {name: registry.spec(name).codec for name in self.topics}
        partitions = [
            (name, p) for name in self.topics for p in partitions_of(self._consumer, name)
        ]
        marks = watermarks(self._consumer, partitions)
        text = bookmark if isinstance(bookmark, str) else str(bookmark)
        parsed = parse_bookmark(bookmark) if isinstance(bookmark, str) else bookmark
        self.starts = resolve_start(self._consumer, marks, parsed, text)
        self.ends = {tp: m.high for tp, m in marks.items()}
        self.stops: dict[TP, int] | None = None
        if until is not None:
            self.stops = resolve_stop(self._consumer, marks, parse_bookmark(until), until)
        self._pending = {tp for tp, start in self.starts.items() if start < self.ends[tp]}

    def _open(self) -> None:
        """Start reading from the start offsets, through the compiled reader if there is
        one (it can read as the consumer does)."""
        if self._native is None:
            self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in self.starts.items()])
            return
        self._native.assign([(t, p, o) for (t, p), o in self.starts.items()])
        self._consumer.close()  # done preparing: its threads and connections go now

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
        self._consumer.close()
        if self._watch is not None:
            self._watch.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[LogMessage | Completed]:
        return self._items(ticking=False)  # type: ignore[return-value]  # yields no TICK

    def ticking(self, batches: bool = False) -> Iterator[LogMessage | Completed | object]:
        """The replay followed until it is finished (for good without `until`), TICK
        after each quiet `max_idle` instead of ending, so a reader bounded by `until`
        wakes too. One generator: no layer between the records and the reader.

        With `batches`, a batch that needs no check per record comes as one iterator of
        its messages (a `BATCH`) instead of message by message, which spares a generator
        resumption a message. The reader takes what it wants from it before asking for
        the next item; any messages it left come next, one by one."""
        return self._items(ticking=True, batches=batches)

    def _items(
        self, ticking: bool, batches: bool = False
    ) -> Iterator[LogMessage | Completed | object]:
        if not self._pending:
            yield COMPLETED
        if self._stop_finished_partitions():
            self.finished = True
            return
        idle_since = time.monotonic()
        codecs, pending = self._codecs, self._pending  # the set _catch_up_gaps empties
        consumer, batch_size, native = self._consumer, self.batch_size, self._native
        watch = self._watch  # asks Kafka whether the topics are still there, while quiet
        assert watch is not None  # made with the replay
        plain = self.predicate is None and self.stops is None  # every record is delivered
        codec = next(iter(codecs.values())) if len(codecs) == 1 else None
        # a filter and no stop: a batch with no end of the replay in it is built at once
        filter_codec = codec if self.predicate is not None and self.stops is None else None
        while True:
            if native is not None:
                records = native.consume(batch_size, 0.2, RECORD_BUILDER, codec)
            else:
                records = consume_available(consumer, batch_size, 0.2)
            if not records:
                watch.quiet()
                if not self._idle_over(idle_since):
                    if pending and self._catch_up_gaps():
                        yield COMPLETED
                        idle_since = time.monotonic()
                    continue
            elif plain and not (pending and self._batch_reaches_an_end()):
                # The per-record hot path (docs/performance.md): no filter, no stop and no
                # end of replay in this batch, so nothing to check per record. One codec:
                # the batch's messages are built in one call, up to a record that is an
                # error, and the loop below goes on from that one.
                if native is not None:  # here, not in a helper: a generator frame a message
                    if codec is not None:
                        if batches:
                            yield records
                        yield from records  # what the reader left of it, or all of it
                        if records.error is not None:
                            _raise_consumer_error(KafkaError(*records.error))
                    records = records.records(KafkaError)  # without one codec: all of it
                elif codec is not None:
                    built = record_messages(records, codec)
                    if batches:
                        yield built
                    else:
                        yield from built
                    records = records[built.read :]  # an error record, and what was left
                for record in records:
                    if record.error():
                        _raise_consumer_error(record.error())
                    yield RecordMessage(record, codec or codecs[record.topic()])
                idle_since = time.monotonic()  # once per batch, not per message
                if not self._idle_over(idle_since):
                    continue
            else:
                if native is not None:
                    records = records.records(KafkaError)
                if filter_codec is not None and not (pending and self._batch_reaches_an_end()):
                    batch = self._filtered(records, filter_codec)
                else:
                    batch = self._checked(records)
                yielded = yield from batch
                if yielded:
                    idle_since = time.monotonic()
                if self._stop_finished_partitions():
                    self.finished = True
                    return
                if not self._idle_over(idle_since):
                    continue  # a batch the predicate dropped entirely goes on to the next
            # quiet for max_idle: the end of this iteration, or a tick
            if not ticking:
                return
            yield TICK
            if self._stop_finished_partitions():
                self.finished = True
                return
            idle_since = time.monotonic()

    def _checked(self, records: list) -> Generator[LogMessage | Completed, None, bool]:
        """A batch read record by record: the filter, `until`, and the end of the replay
        (COMPLETED right after the last record it covers). True if it yielded anything."""
        predicate, codecs, stops, ends = self.predicate, self._codecs, self.stops, self.ends
        pending = self._pending
        yielded = False
        for record in records:
            if record.error():
                _raise_consumer_error(record.error())
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            if stops is not None and offset >= stops[(topic, partition)]:
                continue
            message = RecordMessage(record, codecs[topic])
            if predicate is None or _matches(predicate, message):
                yield message
                yielded = True
            if pending and offset + 1 >= ends[(topic, partition)]:
                pending.discard((topic, partition))
                if not pending:
                    yield COMPLETED
                    yielded = True
        return yielded

    def _filtered(
        self, records: list, codec: Codec
    ) -> Generator[LogMessage | Completed, None, bool]:
        """A batch with no end of the replay in it, under a filter and no `until`: its
        messages built in one call, only the filter checked per record (a record that is an
        error, and those after it, go through _checked). True if it yielded anything."""
        predicate = self.predicate
        assert predicate is not None  # filtered replays only
        built = record_messages(records, codec)
        yielded = False
        for message in built:
            if _matches(predicate, message):
                yield message
                yielded = True
        rest = records[built.read :]
        if rest:
            yielded = (yield from self._checked(rest)) or yielded
        return yielded

    def _batch_reaches_an_end(self) -> bool:
        """Whether the batch just consumed holds the last replayed record of a partition.

        The consumer's position is past the batch's records, so a batch that reaches
        no end offset is delivered without an end check per record.
        """
        ends = self.ends
        return any(offset >= ends[tp] for tp, offset in self._positions(list(self._pending)))

    def _positions(self, partitions: list[TP]) -> list[tuple[TP, int]]:
        """Each partition's position: the offset after its last consumed record."""
        if self._native is not None:
            return positions(self._native, partitions)
        current = self._consumer.position([TopicPartition(t, p) for t, p in partitions])
        return [((tp.topic, tp.partition), tp.offset) for tp in current]

    def _idle_over(self, idle_since: float) -> bool:
        return self.max_idle is not None and time.monotonic() - idle_since > self.max_idle

    def _catch_up_gaps(self) -> bool:
        """Offsets with no record (compaction, control records) still count as read."""
        for key, offset in self._positions(list(self._pending)):
            if offset >= self.ends[key]:
                self._pending.discard(key)
        return not self._pending

    def _stop_finished_partitions(self) -> bool:
        """Pause partitions that reached `until`; True when all of them have."""
        if self.stops is None:
            return False
        tps = list(self.stops)
        current = self._consumer.position([TopicPartition(t, p) for t, p in tps])
        reached = {(tp.topic, tp.partition): tp.offset for tp in current}
        done = [tp for tp in tps if max(reached[tp], self.starts[tp]) >= self.stops[tp]]
        if done:
            self._consumer.pause([TopicPartition(t, p) for t, p in done])
        return len(done) == len(self.stops)


def _matches(predicate: Predicate, message: LogMessage) -> bool:
    try:
        return predicate(message.data)
    except MessageError:
        return False  # a payload that doesn't decode can't match a content filter


def _raise_consumer_error(error: KafkaError) -> None:
    if error.code() == KafkaError._PARTITION_EOF:
        return
    if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        raise UnknownTopic(f"a topic was deleted while it was replayed: {error.str()}")
    if error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
        raise InvalidBookmark(
            f"the replay position left the log (retention removed it): {error.str()}"
        )
    raise TransportError(f"reading the log failed: {error.str()}")
