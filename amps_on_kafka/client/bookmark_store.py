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

import struct
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from zlib import crc32

import orjson

from amps_on_kafka import EPOCH
from amps_on_kafka.client.mapped_file import (
    DamagedFile,
    MappedLog,
    MappedSlots,
    keep_damaged,
    read_lines,
    seal,
    unseal,
)
from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.log.bookmarks import TP, Position, format_bookmark, parse_bookmark
from amps_on_kafka.log.envelope import H_PUBLISHER, H_SEQUENCE, EnvelopeError
from amps_on_kafka.log.message import LogMessage


class _Partition:
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

    def __init__(self, store: BookmarkStore, sub_id: str, parts: dict[TP, _Partition]) -> None:
        self._store = store
        self.sub_id = sub_id
        self._parts = parts
        # Bound once, and the last partition kept: this runs for every message, and each
        # object it doesn't allocate is one the garbage collector doesn't scan.
        self._acquire, self._release = store._lock.acquire, store._lock.release
        self._logged, self._discarded = store._logged, store._discarded
        self._last: tuple[str, int, _Partition] | None = None

    def _part(self, topic: str, partition: int) -> _Partition | None:
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
        self._subs: dict[str, dict[TP, _Partition]] = {}
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
    def _subscription_parts(self, sub_id: str) -> dict[TP, _Partition]:
        parts = self._subs.get(sub_id)
        if parts is None:
            parts = self._subs[sub_id] = {}
            self._added_subscription(sub_id)
        return parts

    def _partition(self, sub_id: str, tp: TP, recovery: int) -> _Partition:
        parts = self._subscription_parts(sub_id)
        part = parts.get(tp)
        if part is None:
            part = parts[tp] = _Partition(recovery)
            self._added_partition(sub_id, tp, part)
        return part

    # -- hooks for file-backed stores, called under the lock --------------------------------
    def _added_subscription(self, sub_id: str) -> None:
        pass

    def _added_partition(self, sub_id: str, tp: TP, part: _Partition) -> None:
        pass

    def _logged(
        self,
        part: _Partition,
        offset: int,
        publisher: bytes | None,
        sequence: bytes | None,
        delivered: bool,
    ) -> None:
        pass

    def _discarded(self, part: _Partition, offset: int, message: Any) -> None:
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


# -- the logged store ------------------------------------------------------------------------

LOG_HEADER = b"AMPS-KAFKA BOOKMARKS 2"  # records sealed with their CRC-32 (mapped_file.seal)
LOG_HEADER_V1 = b"AMPS-KAFKA BOOKMARKS 1"  # the same records without checksums: still read
LOG_REMEDY = (
    "open it with LoggedBookmarkStore(path, salvage=True) to keep the state its records "
    "before the damage give (the damaged file is copied beside it as <name>.damaged; "
    "messages discarded after that point are delivered again), or move the file away to "
    "start its subscriptions afresh"
)
UNWRITTEN_LIMIT = 4096  # deliveries kept back at most, per partition, before writing them


class LoggedBookmarkStore(BookmarkStore):
    """A bookmark store that survives a crash: every delivery and discard is in a file.

    The file is an append-only log of text records (docs/subscribers.md lists them),
    written through a memory map: a record is safe from a process crash (SIGKILL) as
    soon as `log` or `discard` returns, with no system call. Against an OS crash or power
    cut, the file is synced every `sync_interval` seconds, on `sync()` and on `close()`.

    Replaying the log rebuilds the state, so on open the store reads it and rewrites it
    compacted: per partition its recovery point, newest offset, discards after the
    recovery point and newest sequence per publisher. Each record carries its CRC-32: a
    record that doesn't read anywhere but at the torn end of a kill makes the store
    refuse the file (DamagedFile, which says where and how to recover) unless opened
    with `salvage=True`.

    To keep pace with a replay, a delivery's record is held back until something needs
    it: when the application discards messages in the order they came, each message costs
    one record ("delivered and discarded"). A delivery not yet written when the process
    dies is simply delivered again after the restart, which is what its state requires.
    """

    def __init__(
        self, path: str | Path, *, sync_interval: float | None = 1.0, salvage: bool = False
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self._sync_interval = sync_interval
        self._sub_ids: dict[str, int] = {}
        self._publisher_ids: dict[bytes, bytes] = {}  # publisher -> b"<id> " in the file
        self._next_id = 1
        self._read(salvage)
        for parts in self._subs.values():
            for part in parts.values():
                part.reopened()
        self._file = MappedLog(self.path, self._snapshot(), sync_interval=sync_interval)

    def _read(self, salvage: bool) -> None:
        """Rebuild the state from the file. A record that doesn't read before the last one
        is damage: DamagedFile, unless `salvage` (then the state its records before the
        damage give, an earlier state whose only loss is redelivery; a copy of the file
        is kept). Skipping the bad record and reading on is not safe: a lost delivery
        record would let the recovery point move past a message never discarded."""
        lines = read_lines(self.path)
        damage = _LogReader(self._subs).read(lines)
        if damage is None:
            return
        if not salvage:
            raise DamagedFile.at_line(self.path, lines, *damage, LOG_REMEDY) from damage[1]
        keep_damaged(self.path)

    def sync(self) -> None:
        with self._lock:
            self._file.sync()

    def close(self) -> None:
        with self._lock:
            for parts in self._subs.values():
                for part in parts.values():
                    self._write_unwritten(part)
            self._file.close()

    # -- writing ------------------------------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _added_subscription(self, sub_id: str) -> None:
        self._sub_ids[sub_id] = sid = self._new_id()
        self._file.append(b"S %d %s" % (sid, orjson.dumps(sub_id)))

    def _added_partition(self, sub_id: str, tp: TP, part: _Partition) -> None:
        part.ref = self._new_id()
        self._file.append(_partition_record(part.ref, self._sub_ids[sub_id], tp))
        if part.recovery >= 0:
            self._file.append(b"c %d %d %d" % (part.ref, part.recovery, part.seen))

    def _logged(
        self,
        part: _Partition,
        offset: int,
        publisher: bytes | None,
        sequence: bytes | None,
        delivered: bool,
    ) -> None:
        if delivered:
            part.unwritten.append((offset, publisher, sequence))
            if len(part.unwritten) > UNWRITTEN_LIMIT:
                self._write_unwritten(part)
            return
        self._write_unwritten(part)  # a refused message: recorded in order, at once
        self._file.append(self._delivery(b"l", part.ref, offset, publisher, sequence))

    def _discarded(self, part: _Partition, offset: int, message: Any) -> None:
        unwritten = part.unwritten
        if unwritten and unwritten[0][0] == offset:  # in order: "delivered and discarded"
            _, publisher, sequence = unwritten.popleft()
            pid = self._publisher_ids.get(publisher) if publisher is not None else None
            if pid is not None:
                self._file.append(b"x %d %d %b%b" % (part.ref, offset, pid, sequence))
            else:
                self._file.append(self._delivery(b"x", part.ref, offset, publisher, sequence))
            return
        self._write_unwritten(part)
        self._file.append(b"d %d %d" % (part.ref, offset))

    def _write_unwritten(self, part: _Partition) -> None:
        while part.unwritten:
            offset, publisher, sequence = part.unwritten.popleft()
            self._file.append(self._delivery(b"l", part.ref, offset, publisher, sequence))

    def _delivery(
        self, kind: bytes, ref: int, offset: int, publisher: bytes | None, sequence: bytes | None
    ) -> bytes:
        if publisher is None or sequence is None:
            return b"%b %d %d" % (kind, ref, offset)
        pid = self._publisher_ids.get(publisher)
        if pid is None:
            pid = self._publisher_ids[publisher] = b"%d " % self._new_id()
            self._file.append(b"P %b%b" % (pid, publisher.hex().encode()))
        return b"%b %d %d %b%b" % (kind, ref, offset, pid, sequence)

    def _purged(self, sub_id: str | None) -> None:
        self._file.close()
        self._file = MappedLog(self.path, self._snapshot(), sync_interval=self._sync_interval)

    def _snapshot(self) -> bytes:
        """The whole state as records, renumbering every id."""
        self._sub_ids, self._publisher_ids, self._next_id = {}, {}, 1
        records = []
        for sub_id, parts in self._subs.items():
            self._sub_ids[sub_id] = sid = self._new_id()
            records.append(b"S %d %s" % (sid, orjson.dumps(sub_id)))
            for tp, part in parts.items():
                part.ref = self._new_id()
                records.append(_partition_record(part.ref, sid, tp))
                records.append(b"c %d %d %d" % (part.ref, part.recovery, part.seen))
                records.extend(b"d %d %d" % (part.ref, o) for o in sorted(part.discarded))
                records.extend(self._publisher_records(part))
                written = len(part.pending) - len(part.unwritten)  # the rest follow later
                records.extend(b"l %d %d" % (part.ref, o) for o in list(part.pending)[:written])
        return LOG_HEADER + b"\n" + b"".join(map(seal, records))

    def _publisher_records(self, part: _Partition) -> Iterable[bytes]:
        for publisher, sequence in part.publishers.items():
            pid = self._publisher_ids.get(publisher)
            if pid is None:
                pid = self._publisher_ids[publisher] = b"%d " % self._new_id()
                yield b"P %b%b" % (pid, publisher.hex().encode())
            yield b"q %d %b%b" % (part.ref, pid, sequence)


def _digits(field: bytes) -> bytes:
    if not field.isdigit():
        raise ValueError(f"a sequence must be decimal digits, not {field!r}")
    return field


def _partition_record(ref: int, sid: int, tp: TP) -> bytes:
    return b"T %d %d %d %b" % (ref, sid, tp[1], tp[0].encode())


class _LogReader:
    """Rebuilds the state by applying a log's records, in order, to partitions.

    Reading stops at the first record that doesn't read (read_lines has already left
    out the tail a kill may tear) and says which and why: the store decides.
    """

    def __init__(self, subs: dict[str, dict[TP, _Partition]]) -> None:
        self.subs = subs
        self.sub_ids: dict[int, str] = {}
        self.parts: dict[int, _Partition] = {}
        self.publishers: dict[int, bytes] = {}

    def read(self, lines: list[bytes]) -> tuple[int, Exception] | None:
        """Apply every record; the index of the first that doesn't read and why, if any."""
        if not lines:
            return None
        if lines[0] not in (LOG_HEADER, LOG_HEADER_V1):
            raise ValueError(f"not a LoggedBookmarkStore file (no {LOG_HEADER!r} header)")
        sealed = lines[0] == LOG_HEADER
        for index in range(1, len(lines)):
            line = lines[index]
            try:
                self._apply((unseal(line) if sealed else line).split(b" "))
            except (KeyError, ValueError, IndexError, orjson.JSONDecodeError) as exc:
                return index, exc
        return None

    def _apply(self, fields: list[bytes]) -> None:
        kind, ref = fields[0], int(fields[1])
        if kind in (b"l", b"x"):
            self._delivered(kind, self.parts[ref], fields)
        elif kind == b"d":
            self.parts[ref].discard(int(fields[2]))
        elif kind == b"c":
            part = self.parts[ref]
            part.recovery = part.session_seen = int(fields[2])
            part.seen = int(fields[3])
        elif kind == b"q":
            self.parts[ref].publishers[self.publishers[int(fields[2])]] = _digits(fields[3])
        elif kind == b"S":
            self.sub_ids[ref] = sub_id = orjson.loads(b" ".join(fields[2:]))
            self.subs.setdefault(sub_id, {})
        elif kind == b"T":
            tp = (fields[4].decode(), int(fields[3]))
            self.parts[ref] = self.subs[self.sub_ids[int(fields[2])]][tp] = _Partition()
        elif kind == b"P":
            self.publishers[ref] = bytes.fromhex(fields[2].decode())
        else:
            raise ValueError(f"unknown record {kind!r}")

    def _delivered(self, kind: bytes, part: _Partition, fields: list[bytes]) -> None:
        offset = int(fields[2])
        publisher = self.publishers[int(fields[3])] if len(fields) > 3 else None
        sequence = _digits(fields[4]) if len(fields) > 4 else None
        if offset <= part.session_seen:
            raise ValueError("a delivery out of order: the record is not this store's")
        part.log(offset, publisher, sequence)
        if kind == b"x":
            part.discard(offset)


# -- the ring store ---------------------------------------------------------------------------

RING_HEADER = b"AMPS-KAFKA RING 2\n"  # the length word holds the key's CRC-32 too
RING_HEADER_V1 = b"AMPS-KAFKA RING 1\n"  # a length word of the length alone: still read
RING_REMEDY = (
    "open it with RingBookmarkStore(path, salvage=True) to drop the damaged slots (the "
    "damaged file is copied beside it as <name>.damaged; the partitions they held are "
    "read again from EPOCH), or move the file away to start every subscription afresh"
)
SLOT_SIZE = 512
KEY_SPACE = SLOT_SIZE - 8 - 32  # a length word, then the key, then two cells
_LENGTH = struct.Struct("<Q")  # key length | CRC-32 of the key << 32 (0: a free slot)
_CELL = struct.Struct("<qq")
_CHECK = 0x5A5A_5A5A_5A5A_5A5A  # a cell holds (value, value ^ _CHECK): a torn one won't match
GROW_SLOTS = 64


class RingBookmarkStore(BookmarkStore):
    """Keeps only each subscription's recovery point per partition, in fixed file slots.

    A slot holds the key (sub_id, topic, partition) and two cells; each change of the
    recovery point overwrites the older cell, so a write torn by a crash leaves the other
    cell good. Nothing else reaches the file: after a restart, everything after the
    recovery point is delivered again, including messages discarded out of order, and
    duplicate detection knows only what this run has seen.
    """

    def __init__(self, path: str | Path, *, salvage: bool = False) -> None:
        super().__init__()
        self.path = Path(path)
        self._slots = MappedSlots(self.path, (RING_HEADER, RING_HEADER_V1), SLOT_SIZE)
        self._free: list[int] = []
        try:
            self._load(salvage)
        except BaseException:
            self._slots.close()
            raise

    def _load(self, salvage: bool) -> None:
        """Read every slot. A slot in use that doesn't read (its key's checksum or shape,
        or both cells) is damage: DamagedFile, unless `salvage` (then it is dropped, so
        its partition is read again from EPOCH, after a copy of the file is kept). Taking
        it for a free slot, as before, forgot its recovery point without a word."""
        damaged = []
        for index in range(self._slots.count):
            try:
                self._load_slot(index)
            except (ValueError, orjson.JSONDecodeError) as exc:
                offset = self._slots.header_size + index * SLOT_SIZE
                if not salvage:
                    problem = f"slot {index} doesn't read: {exc}"
                    raise DamagedFile(self.path, offset, problem, RING_REMEDY) from exc
                damaged.append(index)
        if damaged:
            keep_damaged(self.path)
            for index in damaged:
                self._slots.write(index, 0, _LENGTH.pack(0))
            self._free.extend(damaged)
        if self._slots.header == RING_HEADER_V1:
            self._upgrade()

    def _load_slot(self, index: int) -> None:
        key = _slot_key(self._slots.slot(index), self._slots.header == RING_HEADER)
        if key is None:
            self._free.append(index)
            return
        slot = self._slots.slot(index)
        sub_id, topic, partition = orjson.loads(key)
        if not (isinstance(sub_id, str) and isinstance(topic, str) and type(partition) is int):
            raise ValueError(f"its key {key[:60]!r} is not [sub_id, topic, partition]")
        cells = [_CELL.unpack_from(slot, 8 + KEY_SPACE + 16 * i) for i in (0, 1)]
        good = [value for value, check in cells if value ^ _CHECK == check]
        if not good:
            raise ValueError("neither of its cells holds a recovery point")
        recovery = max(good)
        older = 0 if cells[0][0] != recovery else 1
        part = _Partition(recovery, ref=[index, older, recovery])
        self._subs.setdefault(sub_id, {})[(topic, partition)] = part

    def _upgrade(self) -> None:
        """Bring a file of the first format to the second: each key's checksum, then
        the header (a crash between leaves a first-format file that still reads)."""
        for parts in self._subs.values():
            for part in parts.values():
                index = part.ref[0]
                key = _slot_key(self._slots.slot(index), False)
                self._slots.write(index, 0, _length_word(key))  # type: ignore[arg-type]
        self._slots.sync()
        self._slots.set_header(RING_HEADER)

    def close(self) -> None:
        with self._lock:
            self._slots.close()

    def _added_partition(self, sub_id: str, tp: TP, part: _Partition) -> None:
        key = orjson.dumps([sub_id, tp[0], tp[1]])
        if len(key) > KEY_SPACE:
            raise ValueError(f"sub_id and topic too long for a ring slot: {key[:60]!r}...")
        if not self._free:
            first = self._slots.count
            self._slots.add_slots(GROW_SLOTS)
            self._free.extend(range(first + GROW_SLOTS - 1, first - 1, -1))
        index = self._free.pop()
        cell = _CELL.pack(part.recovery, part.recovery ^ _CHECK)
        self._slots.write(index, 8, key.ljust(KEY_SPACE, b"\0") + cell + cell)
        self._slots.write(index, 0, _length_word(key))  # last: the slot is now in use
        part.ref = [index, 0, part.recovery]

    def _logged(
        self,
        part: _Partition,
        offset: int,
        publisher: bytes | None,
        sequence: bytes | None,
        delivered: bool,
    ) -> None:
        self._save(part)

    def _discarded(self, part: _Partition, offset: int, message: Any) -> None:
        self._save(part)

    def _save(self, part: _Partition) -> None:
        """Write the recovery point when it moved, into the slot's older cell."""
        if part.recovery == part.ref[2]:
            return
        ref, value = part.ref, part.recovery
        self._slots.write(ref[0], 8 + KEY_SPACE + 16 * ref[1], _CELL.pack(value, value ^ _CHECK))
        ref[1] ^= 1
        ref[2] = value

    def _purged(self, sub_id: str | None) -> None:
        for index in range(self._slots.count):
            if index in self._free:
                continue
            key = _slot_key(self._slots.slot(index), False)
            if sub_id is None or orjson.loads(key)[0] == sub_id:  # type: ignore[arg-type]
                self._slots.write(index, 0, _LENGTH.pack(0))
                self._free.append(index)


def _length_word(key: bytes) -> bytes:
    return _LENGTH.pack(len(key) | crc32(key) << 32)


def _slot_key(slot: bytes, checked: bool) -> bytes | None:
    """A slot's key; None for a free slot; ValueError when the length word is damaged
    (out of range, or with `checked`, a checksum the key doesn't match)."""
    (word,) = _LENGTH.unpack_from(slot)
    if word == 0:
        return None
    length = word & 0xFFFF_FFFF
    if not 0 < length <= KEY_SPACE:
        raise ValueError(f"its key length {length} is out of range")
    key = slot[8 : 8 + length]
    if checked and word >> 32 != crc32(key):
        raise ValueError("its key's checksum doesn't match")
    return key
