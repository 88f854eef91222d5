"""Bookmark stores: a subscriber's place in the log, kept across reconnects and restarts.

Seed 003. A store sees every message a bookmark subscription delivers (`log`) and every
message the application has finished with (`discard`). Per subscription and partition
it keeps the **recovery point**: the newest bookmark such that it and every message
before it that the subscription delivered is discarded. `get_most_recent(sub_id)` is
the list of those bookmarks, one per partition: what MOST_RECENT resolves to.

Messages may be processed in another order than they arrive (seed 003's moving windows):
the store remembers what was discarded after the recovery point, and after a
resubscribe from it `log` refuses those messages, so the application sees only what it
had not finished. `log` also refuses duplicates (seed 003): a message whose sequence
from its publisher is not newer than one already seen. Kafka orders records per
partition, so "newer" is judged per partition: a publisher's records in one partition
have rising sequences; across partitions they interleave freely.

- MemoryBookmarkStore: all of this in memory; survives reconnects, not restarts.
- LoggedBookmarkStore(path): records each delivery and discard in a file, so it also
  survives a crash; filtering and duplicate detection hold across restarts.
- RingBookmarkStore(path): keeps only the recovery point per subscription and partition
  in a file of fixed slots. Faster to keep, but after a restart everything after the
  recovery point is delivered again, including what was processed out of order, and
  duplicate detection starts afresh. Right for applications that discard in order.

All stores are thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from amps_on_kafka import EPOCH
from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.log.bookmarks import TP, Position, format_bookmark, parse_bookmark
from amps_on_kafka.log.envelope import H_PUBLISHER, H_SEQUENCE, EnvelopeError
from amps_on_kafka.log.message import LogMessage


class PartitionMarks:
    """One subscription's state in one partition.

    recovery      the recovery point's offset (-1: nothing before it to skip)
    seen          the newest offset ever delivered (kept across restarts where possible)
    session_seen  the newest offset delivered since the store was opened: anything at
                  or before it is already with the application (or discarded)
    pending       offsets delivered since the recovery point, in delivery order
    discarded     offsets after the recovery point that are discarded
    publishers    the newest sequence seen per publisher, for duplicate detection, as the
                  header's decimal digits: compared by length, then bytes, never parsed
    """

    __slots__ = (
        "discarded",
        "pending",
        "publishers",
        "recovery",
        "ref",
        "seen",
        "session_seen",
        "unwritten",
    )

    def __init__(self, recovery: int = -1, ref: Any = None) -> None:
        self.recovery = self.seen = self.session_seen = recovery
        self.pending: deque[int] = deque()
        self.discarded: set[int] = set()
        self.publishers: dict[bytes, bytes] = {}
        self.ref = ref  # the file store's handle on this partition
        # deliveries the logged store holds back: (offset, publisher, sequence)
        self.unwritten: deque[tuple[int, bytes | None, bytes | None]] = deque()

    def log(self, offset: int, publisher: bytes | None, sequence: bytes | None) -> bool:
        """A delivery after session_seen; False when the application must not see it."""
        self.session_seen = offset
        self.pending.append(offset)
        if self.discarded and offset in self.discarded:
            self._advance()
            return False  # processed out of order before a restart
        if offset <= self.seen:
            return True  # delivered again after a restart: its sequence is known
        self.seen = offset
        if publisher is not None and sequence is not None:
            last = self.publishers.get(publisher)
            if last is not None and (
                sequence <= last if len(sequence) == len(last) else len(sequence) < len(last)
            ):
                self.discarded.add(offset)  # a duplicate: finished with, never delivered
                self._advance()
                return False
            self.publishers[publisher] = sequence
        return True

    def discard(self, offset: int) -> bool:
        """Mark an offset processed; False when it already was."""
        pending = self.pending
        if pending and pending[0] == offset:  # in-order processing: the common case
            pending.popleft()
            self.recovery = offset
            if pending and self.discarded:
                self._advance()
            return True
        if offset <= self.recovery or offset in self.discarded:
            return False
        self.discarded.add(offset)
        return True

    def _advance(self) -> None:
        pending, discarded = self.pending, self.discarded
        while pending and pending[0] in discarded:
            offset = pending.popleft()
            discarded.remove(offset)
            self.recovery = offset

    def reopened(self) -> None:
        """After a restart: everything pending will be delivered again."""
        self.pending.clear()
        self.session_seen = self.recovery
        self.discarded = {offset for offset in self.discarded if offset > self.recovery}

    def is_discarded(self, offset: int) -> bool:
        return offset <= self.recovery or offset in self.discarded


class SubscriptionBookmarks:
    """One subscription's part of a store: what the client calls for every message it
    delivers and every discard, without looking the subscription up each time."""

    __slots__ = (
        "_acquire",
        "_discarded",
        "_last",
        "_logged",
        "_parts",
        "_release",
        "_store",
        "sub_id",
    )

    def __init__(self, store: BookmarkStore, sub_id: str, parts: dict[TP, PartitionMarks]) -> None:
        self._store = store
        self.sub_id = sub_id
        self._parts = parts
        # Bound once, and the last partition kept: this runs for every message, and each
        # object it doesn't allocate is one the garbage collector doesn't scan.
        self._acquire, self._release = store._lock.acquire, store._lock.release
        self._logged, self._discarded = store._logged, store._discarded
        self._last: tuple[str, int, PartitionMarks] | None = None

    def _part(self, topic: str, partition: int) -> PartitionMarks | None:
        last = self._last
        if last is not None and last[1] == partition and last[0] == topic:
            return last[2]
        part = self._parts.get((topic, partition))
        if part is not None:
            self._last = (topic, partition, part)
        return part

    def forget_partitions(self) -> None:
        """After a purge: the partition kept at hand may be gone."""
        self._last = None

    def log(self, message: Any) -> bool:
        """Record a delivered message; False when it must not reach the application:
        already delivered, discarded before a restart, or a duplicate."""
        if isinstance(message, LogMessage):
            topic, partition, offset = message.topic, message.partition, message.offset
        else:
            (topic, partition), offset = _located(message)
        self._acquire()  # not `with`: this runs for every message, and costs half as much
        try:
            part = self._part(topic, partition)
            if part is None:
                part = self._store._partition(self.sub_id, (topic, partition), -1)
            if offset <= part.session_seen:
                return False
            publisher = sequence = None
            if offset <= part.seen:
                pass  # delivered again after a restart: its sequence was seen
            elif isinstance(message, LogMessage):  # the headers, not the whole envelope
                try:
                    headers = message.headers or ()
                except EnvelopeError:  # unreadable: delivered, unchecked, the stream goes on
                    headers = ()
                for name, value in headers:
                    if name == H_PUBLISHER:
                        publisher = value
                    elif name == H_SEQUENCE:
                        sequence = value
            else:
                publisher, sequence = _stamp(message)
            delivered = part.log(offset, publisher, sequence)
            self._logged(part, offset, publisher, sequence, delivered)
            return delivered
        finally:
            self._release()

    def discard(self, message: Any) -> None:
        """The application has finished with this message: recovery may move past it."""
        if isinstance(message, LogMessage):
            topic, partition, offset = message.topic, message.partition, message.offset
        else:
            (topic, partition), offset = _located(message)
        self._acquire()
        try:
            part = self._part(topic, partition)
            if part is not None and part.discard(offset):
                self._discarded(part, offset, message)
        finally:
            self._release()


class BookmarkStore:
    """What every store does; a file-backed store also records it through the hooks.

    Messages are identified by subscription (`message.sub_id`, or `sub_id=`), topic,
    partition and offset. Use a store through a Client (`client.set_bookmark_store`),
    which logs every message it delivers and binds `message.discard()`.
    """

    def __init__(self) -> None:
        self._subs: dict[str, dict[TP, PartitionMarks]] = {}
        self._handles: dict[str, SubscriptionBookmarks] = {}
        self._lock = threading.Lock()
        self._acquire, self._release = self._lock.acquire, self._lock.release

    # -- the AMPS API ---------------------------------------------------------------------
    def subscription(self, sub_id: str) -> SubscriptionBookmarks:
        handle = self._handles.get(sub_id)
        if handle is None:
            with self._lock:
                parts = self._subscription_parts(sub_id)
                handle = self._handles.setdefault(
                    sub_id, SubscriptionBookmarks(self, sub_id, parts)
                )
        return handle

    def log(self, message: Any, sub_id: str | None = None) -> bool:
        """Record a delivered message; False when it must not reach the application."""
        return self.subscription(message.sub_id if sub_id is None else sub_id).log(message)

    def discard(self, message: Any, sub_id: str | None = None) -> None:
        """The application has finished with this message: recovery may move past it."""
        self.subscription(message.sub_id if sub_id is None else sub_id).discard(message)

    def is_discarded(self, message: Any, sub_id: str | None = None) -> bool:
        if isinstance(message, LogMessage):
            tp, offset = (message.topic, message.partition), message.offset
        else:
            tp, offset = _located(message)
        sub_id = message.sub_id if sub_id is None else sub_id
        with self._lock:
            part = self._subs.get(sub_id, {}).get(tp)
            return part is not None and part.is_discarded(offset)

    def get_most_recent(self, sub_id: str) -> str:
        """The recovery point: one bookmark per partition, or EPOCH if there is none."""
        with self._lock:
            parts = self._subs.get(sub_id, {})
            marks = [
                format_bookmark(topic, partition, part.recovery)
                for (topic, partition), part in sorted(parts.items())
                if part.recovery >= 0
            ]
        return ",".join(marks) or EPOCH

    def purge(self, sub_id: str | None = None) -> None:
        """Forget one subscription, or all of them (handles stay valid: emptied in place)."""
        with self._lock:
            for name, parts in self._subs.items():
                if sub_id is None or name == sub_id:
                    parts.clear()
            for handle in self._handles.values():
                handle.forget_partitions()
            self._purged(sub_id)

    def note_start(self, sub_id: str, starts: Mapping[TP, int]) -> None:
        """Where a new subscription starts reading, per partition: the recovery point of a
        partition that delivers nothing before a crash (a NOW subscription must not come
        back at EPOCH). Partitions the store already knows keep their state."""
        with self._lock:
            for tp, start in starts.items():
                self._partition(sub_id, tp, start - 1)

    def close(self) -> None:
        """Release the store's file (nothing to do for the memory store)."""

    def __enter__(self) -> BookmarkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ----------------------------------------------------------------------------
    def _subscription_parts(self, sub_id: str) -> dict[TP, PartitionMarks]:
        parts = self._subs.get(sub_id)
        if parts is None:
            parts = self._subs[sub_id] = {}
            self._added_subscription(sub_id)
        return parts

    def _partition(self, sub_id: str, tp: TP, recovery: int) -> PartitionMarks:
        parts = self._subscription_parts(sub_id)
        part = parts.get(tp)
        if part is None:
            part = parts[tp] = PartitionMarks(recovery)
            self._added_partition(sub_id, tp, part)
        return part

    # -- hooks for file-backed stores, called under the lock --------------------------------
    def _added_subscription(self, sub_id: str) -> None:
        pass

    def _added_partition(self, sub_id: str, tp: TP, part: PartitionMarks) -> None:
        pass

    def _logged(
        self,
        part: PartitionMarks,
        offset: int,
        publisher: bytes | None,
        sequence: bytes | None,
        delivered: bool,
    ) -> None:
        pass

    def _discarded(self, part: PartitionMarks, offset: int, message: Any) -> None:
        pass

    def _purged(self, sub_id: str | None) -> None:
        pass


class MemoryBookmarkStore(BookmarkStore):
    """Recovery points, out-of-order filtering and duplicate detection, in memory: a
    reconnect resumes where the application left off; a restart starts afresh."""


def _located(message: Any) -> tuple[TP, int]:
    """Where a gateway's message is in the log: its bookmark says."""
    position = parse_bookmark(message.bookmark)
    if not isinstance(position, Position):
        raise InvalidBookmark(f"message bookmark {message.bookmark!r} names no single message")
    return (position.topic, position.partition), position.offset


def _stamp(message: Any) -> tuple[bytes | None, bytes | None]:
    """A gateway message's publisher id and sequence, as a log record's headers hold them."""
    publisher, sequence = (getattr(message, a, None) for a in ("publisher_id", "sequence"))
    if publisher is None or sequence is None:
        return None, None
    return publisher.encode(), b"%d" % sequence
