"""LoggedBookmarkStore: every delivery and discard recorded in a file of sealed records, so
a subscriber resumes after a crash with its out-of-order discards and duplicate detection
intact (seed 003; the store's rules are in client/bookmark_store.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from amps_on_kafka.client.bookmark_store import BookmarkStore, PartitionMarks
from amps_on_kafka.client.mapped_file import (
    DamagedFile,
    MappedLog,
    keep_damaged,
    read_lines,
    seal,
    unseal,
)
from amps_on_kafka.log.bookmarks import TP

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

    def _added_partition(self, sub_id: str, tp: TP, part: PartitionMarks) -> None:
        part.ref = self._new_id()
        self._file.append(_partition_record(part.ref, self._sub_ids[sub_id], tp))
        if part.recovery >= 0:
            self._file.append(b"c %d %d %d" % (part.ref, part.recovery, part.seen))

    def _logged(
        self,
        part: PartitionMarks,
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

    def _discarded(self, part: PartitionMarks, offset: int, message: Any) -> None:
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

    def _write_unwritten(self, part: PartitionMarks) -> None:
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

    def _publisher_records(self, part: PartitionMarks) -> Iterable[bytes]:
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

    def __init__(self, subs: dict[str, dict[TP, PartitionMarks]]) -> None:
        self.subs = subs
        self.sub_ids: dict[int, str] = {}
        self.parts: dict[int, PartitionMarks] = {}
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
            self.parts[ref] = self.subs[self.sub_ids[int(fields[2])]][tp] = PartitionMarks()
        elif kind == b"P":
            self.publishers[ref] = bytes.fromhex(fields[2].decode())
        else:
            raise ValueError(f"unknown record {kind!r}")

    def _delivered(self, kind: bytes, part: PartitionMarks, fields: list[bytes]) -> None:
        offset = int(fields[2])
        publisher = self.publishers[int(fields[3])] if len(fields) > 3 else None
        sequence = _digits(fields[4]) if len(fields) > 4 else None
        if offset <= part.session_seen:
            raise ValueError("a delivery out of order: the record is not this store's")
        part.log(offset, publisher, sequence)
        if kind == b"x":
            part.discard(offset)
