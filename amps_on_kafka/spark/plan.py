"""Turning bookmarks into per-partition offsets, on the driver, before Spark does any work.

A Spark job must read a fixed range of the log: the offsets are resolved once, here, with
the project's own resolvers (parse_bookmark, resolve_start, resolve_stop), and handed to
every task as numbers. A missing topic (UnknownTopic) or a bookmark outside the log
(InvalidBookmark) is therefore reported before a JVM is started.

One rule is added for multi-partition topics: a message bookmark names one point in one
partition, and the partitions it does not name are cut at that message's moment (its
LogAppendTime). `--as-of orders|2|1041|` is then "the log as it stood when that message
was written", in every partition, instead of one partition then and the others now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson
from confluent_kafka import Consumer, TopicPartition

from amps_on_kafka.errors import InvalidBookmark, TransportError
from amps_on_kafka.log.bookmarks import (
    TP,
    Bookmark,
    Epoch,
    Moment,
    Now,
    Position,
    Watermarks,
    parse_bookmark,
    resolve_start,
    resolve_stop,
    watermarks,
)
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, partitions_of, reader

Resolver = Callable[[Consumer, Mapping[TP, Watermarks], Bookmark, str], dict[TP, int]]


@dataclass(frozen=True)
class LogRange:
    """The records [start, stop) of each partition of one topic, fixed for a whole job."""

    topic: str
    starts: dict[int, int]
    stops: dict[int, int]

    @property
    def partitions(self) -> list[int]:
        return sorted(self.stops)

    @property
    def records(self) -> int:
        """An upper bound on the records in the range (offsets, not all of them records)."""
        return sum(max(0, self.stops[p] - self.starts[p]) for p in self.stops)

    def to_json(self) -> str:
        """The range as a data source option: {"partition": [start, stop], ...}."""
        return orjson.dumps(
            {str(p): [self.starts[p], self.stops[p]] for p in self.partitions}
        ).decode()

    @classmethod
    def from_json(cls, topic: str, text: str) -> LogRange:
        doc = orjson.loads(text)
        return cls(
            topic,
            {int(p): int(v[0]) for p, v in doc.items()},
            {int(p): int(v[1]) for p, v in doc.items()},
        )


@dataclass(frozen=True)
class AsOf:
    """The log up to a point, and the moment (ms) at which expirations are judged."""

    range: LogRange
    millis: int


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def plan_range(bootstrap: str, topic: str, start: str = "0", stop: str = "0|1|") -> LogRange:
    """The records after bookmark `start` up to and including bookmark `stop`.

    `start` means what it means to a bookmark subscription: the records after it (EPOCH:
    all of them); `stop` what it means to `replay --until`.
    """
    with _Log(bootstrap, topic) as log:
        starts = log.offsets(start, resolve_start)
        stops = log.offsets(stop, resolve_stop)
    for partition, first in starts.items():
        if first > stops[partition]:
            raise InvalidBookmark(
                f"--from {start!r} is after --to {stop!r} in partition {partition} of {topic!r} "
                f"(offsets {first} and {stops[partition]})"
            )
    return LogRange(topic, starts, stops)


def plan_as_of(bootstrap: str, topic: str, as_of: str) -> AsOf:
    """The whole log up to `as_of`, and the moment expirations are judged at.

    That moment is the time itself for a timestamp bookmark (which may not be in the
    future), the LogAppendTime of the named message for a message bookmark (the latest
    one for a list), and the current time for NOW.
    """
    parsed = parse_bookmark(as_of)
    with _Log(bootstrap, topic) as log:
        stops = log.offsets(as_of, resolve_stop)
        millis = log.moment(parsed, as_of)
        starts = {p: log.marks[(topic, p)].low for p in stops}
    return AsOf(LogRange(topic, starts, stops), millis)


class _Log:
    """A reader consumer and the watermarks of one topic, for the time of the planning."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = reader(bootstrap)
        try:
            tps = [(topic, p) for p in partitions_of(self.consumer, topic)]
            self.marks = watermarks(self.consumer, tps)
        except BaseException:
            self.consumer.close()
            raise

    def __enter__(self) -> _Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    def offsets(self, text: str, resolve: Resolver) -> dict[int, int]:
        """Resolve a bookmark; partitions a message bookmark leaves out are cut at its moment."""
        parsed = parse_bookmark(text)
        offsets = resolve(self.consumer, self.marks, parsed, text)
        named = {(p.topic, p.partition) for p in _positions(parsed)}
        others = {tp: mark for tp, mark in self.marks.items() if tp not in named}
        if named and others:
            cut = Moment(self.moment(parsed, text) + 1)  # records stamped at the moment: before
            offsets.update(resolve_stop(self.consumer, others, cut, text))
        return {partition: offset for (_, partition), offset in offsets.items()}

    def moment(self, parsed: Bookmark, text: str) -> int:
        if isinstance(parsed, Moment):
            if parsed.millis > now_ms():
                raise InvalidBookmark(f"bookmark {text!r} is in the future")
            return parsed.millis
        if parsed is Now:
            return now_ms()
        if parsed is Epoch:
            return 0
        return max(self._timestamp(position, text) for position in _positions(parsed))

    def _timestamp(self, position: Position, text: str) -> int:
        """The LogAppendTime of the message a bookmark names."""
        self.consumer.assign([TopicPartition(position.topic, position.partition, position.offset)])
        try:
            deadline = time.monotonic() + METADATA_TIMEOUT
            while time.monotonic() < deadline:
                for record in self.consumer.consume(1, timeout=0.5):
                    if record.error() or record.offset() != position.offset:
                        raise InvalidBookmark(f"bookmark {text!r}: no message at {position}")
                    return record.timestamp()[1]
            raise TransportError(f"timed out reading the message at {position}")
        finally:
            self.consumer.unassign()


def _positions(parsed: Bookmark) -> tuple[Position, ...]:
    if isinstance(parsed, Position):
        return (parsed,)
    if isinstance(parsed, tuple):
        return parsed
    return ()
