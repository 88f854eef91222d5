"""Bookmarks: AMPS's replay positions, spelt in Kafka's terms.

A message's bookmark is `topic|partition|offset|` — Kafka topic names can't hold `|`,
so the text splits unambiguously. A comma-separated list is a position on a
multi-partition topic, exactly like an AMPS bookmark list. Specials: `0` (EPOCH),
`0|1|` (NOW), `YYYYmmddTHHMMSS[Z]` (a UTC moment) and MOST_RECENT, which only the
client's bookmark store understands and which never reaches this module's resolver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaException, TopicPartition

from amps_on_kafka import EPOCH, MOST_RECENT, NOW
from amps_on_kafka.errors import InvalidBookmark, TransportError
from amps_on_kafka.log.kafka import METADATA_TIMEOUT

TP = tuple[str, int]
_TIMESTAMP = re.compile(r"^(\d{8})T(\d{6})(Z?)$")
_POSITION = re.compile(r"^([A-Za-z0-9._-]+)\|(\d+)\|(\d+)\|$")


@dataclass(frozen=True, slots=True)
class Position:
    """One message: a topic, a partition and an offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return format_bookmark(self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class Moment:
    """A UTC moment, in milliseconds since the epoch, as Kafka timestamps are."""

    millis: int


class _Special:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


Epoch = _Special("EPOCH")
Now = _Special("NOW")
MostRecent = _Special("MOST_RECENT")
Bookmark = Position | Moment | _Special | tuple[Position, ...]


def format_bookmark(topic: str, partition: int, offset: int) -> str:
    return f"{topic}|{partition}|{offset}|"


def format_list(positions: Iterable[Position]) -> str:
    return ",".join(str(p) for p in positions)


def parse_bookmark(text: str) -> Bookmark:
    """Parse any bookmark form; InvalidBookmark names what is wrong with the text."""
    if not isinstance(text, str):
        raise InvalidBookmark(f"a bookmark must be a string, not {type(text).__name__}")
    if not text.strip():
        raise InvalidBookmark(
            "empty bookmark: expected 0, 0|1|, a timestamp or topic|partition|offset|"
        )
    items = [item.strip() for item in text.split(",")]
    if len(items) == 1:
        return _parse_one(items[0])
    parsed = [_parse_one(item) for item in items]
    if any(p is Epoch for p in parsed):
        return Epoch  # AMPS begins at the oldest bookmark in a list
    if not all(isinstance(p, Position) for p in parsed):
        raise InvalidBookmark(
            f"bookmark list {text!r}: a list may hold only message bookmarks "
            "(topic|partition|offset|)"
        )
    return tuple(parsed)  # type: ignore[arg-type]


def _parse_one(item: str) -> Bookmark:
    if item == EPOCH:
        return Epoch
    if item == NOW:
        return Now
    if item.lower() == MOST_RECENT:
        return MostRecent
    if match := _POSITION.match(item):
        return Position(match[1], int(match[2]), int(match[3]))
    if match := _TIMESTAMP.match(item):
        return Moment(_moment_millis(item, match[1] + match[2]))
    raise InvalidBookmark(
        f"malformed bookmark {item!r}: expected 0 (EPOCH), 0|1| (NOW), "
        "YYYYmmddTHHMMSS[Z] or topic|partition|offset|"
    )


def _moment_millis(item: str, digits: str) -> int:
    try:
        moment = datetime.strptime(digits, "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError as exc:  # strptime's words ("unconverted data remains") name no field
        raise InvalidBookmark(
            f"malformed timestamp bookmark {item!r}: {digits[:8]}T{digits[8:]} is not a date "
            "and time (YYYYmmddTHHMMSS[Z], UTC: month 01-12, day of that month, hour 00-23, "
            "minute and second 00-59)"
        ) from exc
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Watermarks:
    """The offsets a partition holds: [low, high)."""

    low: int
    high: int


def watermarks(consumer: Consumer, partitions: Iterable[TP]) -> dict[TP, Watermarks]:
    marks = {}
    for topic, partition in partitions:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=METADATA_TIMEOUT, cached=False
            )
        except KafkaException as exc:
            raise TransportError(f"can't read offsets of {topic}|{partition}: {exc}") from exc
        marks[(topic, partition)] = Watermarks(low, high)
    return marks


def resolve_start(
    consumer: Consumer, marks: Mapping[TP, Watermarks], bookmark: Bookmark, text: str
) -> dict[TP, int]:
    """The first offset to read in each partition for a subscription starting at bookmark.

    A list names some partitions; the others start at EPOCH. Where a list names one
    partition several times, the oldest bookmark wins, as AMPS begins at the oldest.
    """
    if bookmark is Epoch:
        return {tp: m.low for tp, m in marks.items()}
    if bookmark is Now:
        return {tp: m.high for tp, m in marks.items()}
    if bookmark is MostRecent:
        raise InvalidBookmark("MOST_RECENT is resolved by a bookmark store; this client has none")
    if isinstance(bookmark, Moment):
        return _offsets_for_time(consumer, marks, bookmark.millis)
    positions = (bookmark,) if isinstance(bookmark, Position) else bookmark
    starts = {tp: m.low for tp, m in marks.items()}
    oldest: dict[TP, int] = {}
    for position in positions:  # type: ignore[union-attr]
        tp = _check_position(position, marks, text)
        oldest[tp] = min(oldest.get(tp, position.offset), position.offset)
    starts.update({tp: offset + 1 for tp, offset in oldest.items()})
    return starts


def resolve_stop(
    consumer: Consumer, marks: Mapping[TP, Watermarks], bookmark: Bookmark, text: str
) -> dict[TP, int]:
    """The offset at which each partition stops (exclusive) for `--until`.

    A message bookmark stops after that message; a moment stops before the first record
    stamped at or after it; partitions a list does not name stop at today's end.
    """
    if bookmark is Epoch:
        return {tp: m.low for tp, m in marks.items()}
    if bookmark is Now:
        return {tp: m.high for tp, m in marks.items()}
    if isinstance(bookmark, Moment):
        return _offsets_for_time(consumer, marks, bookmark.millis)
    if bookmark is MostRecent:
        raise InvalidBookmark("MOST_RECENT can't be an end point")
    positions = (bookmark,) if isinstance(bookmark, Position) else bookmark
    stops = {tp: m.high for tp, m in marks.items()}
    for position in positions:  # type: ignore[union-attr]
        stops[_check_position(position, marks, text)] = position.offset + 1
    return stops


def _check_position(position: Position, marks: Mapping[TP, Watermarks], text: str) -> TP:
    tp = (position.topic, position.partition)
    mark = marks.get(tp)
    if mark is None:
        if not any(topic == position.topic for topic, _ in marks):
            raise InvalidBookmark(
                f"bookmark {text!r} names topic {position.topic!r}, "
                "which this subscription does not cover"
            )
        raise InvalidBookmark(
            f"bookmark {text!r} names partition {position.partition} of {position.topic!r}, "
            "which does not exist"
        )
    if position.offset >= mark.high:
        where = f"{position.topic}|{position.partition}"
        last = "holds no record yet" if mark.high == 0 else f"ends at offset {mark.high - 1}"
        raise InvalidBookmark(f"bookmark {position} is past the end of the log ({where} {last})")
    if position.offset + 1 < mark.low:
        raise InvalidBookmark(
            f"bookmark {position} is no longer in the log: retention removed the messages after "
            f"it (the earliest offset of {position.topic}|{position.partition} is {mark.low})"
        )
    return tp


def _offsets_for_time(
    consumer: Consumer, marks: Mapping[TP, Watermarks], millis: int
) -> dict[TP, int]:
    query = [TopicPartition(t, p, millis) for t, p in marks]
    if not query:
        return {}
    try:
        found = consumer.offsets_for_times(query, timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't look up offsets for a time: {exc}") from exc
    offsets = {}
    for tp in found:
        key = (tp.topic, tp.partition)
        # -1: no record at or after that time, so the replay starts at the end.
        offsets[key] = tp.offset if tp.offset >= 0 else marks[key].high
    return offsets
