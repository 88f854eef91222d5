"""Files the client's stores write through a memory map.

A store must not lose what it recorded when the process is killed, yet a write(2) per
delivered message would cost more than the replay it records. A memory-mapped file
gives both: bytes copied into the map are in the kernel's page cache as soon as the copy
returns, so they survive SIGKILL without a system call; only an OS crash or a power cut
can lose what was not synced yet (`sync()`: msync + fsync).

Appended records are text lines, each sealed with its CRC-32 (`seal`). The file grows in
zero-filled chunks, and a kill tears at most the record being written: the last one, which
then lacks its newline and is followed only by zero bytes. That tail is dropped on reading;
anything else that doesn't read (a record whose checksum fails, a zero byte before the
last record) is damage, and the stores refuse such a file with DamagedFile rather than
drop the records after it (see docs/subscribers.md, "A damaged store file").
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import time
from pathlib import Path
from zlib import crc32

from amps_on_kafka.errors import AmpsError

CHUNK = 1 << 20  # the file grows this much at a time
SYNC_CHECK_MASK = (1 << 15) - 1  # appends look at the clock once per 32 KiB written

log = logging.getLogger(__name__)


class DamagedFile(AmpsError, ValueError):
    """A store file with a record that can't be read before its end. Refused, with
    where and how to recover: dropping the records after it would silently bring back
    (or lose) what they recorded."""

    def __init__(self, path: Path, offset: int, problem: str, remedy: str) -> None:
        super().__init__(
            f"{path} is damaged at byte {offset}: {problem}. The file was left as it is; {remedy}"
        )
        self.path = path
        self.offset = offset

    @classmethod
    def at_line(
        cls, path: Path, lines: list[bytes], index: int, cause: Exception, remedy: str
    ) -> DamagedFile:
        """The damage of the line at `index` of read_lines' answer: where it starts in
        the file, and what it holds."""
        offset = sum(len(line) + 1 for line in lines[:index])
        problem = f"record {index + 1} ({lines[index][:60]!r}) doesn't read: {cause!r}"
        return cls(path, offset, problem, remedy)


def read_lines(path: Path) -> list[bytes]:
    """The complete records of a file written by MappedLog or appended to with write(2)
    (nothing if there is none). The zero fill after the last record, and a last record
    without its newline (torn by a kill), are left out; a record damaged anywhere else
    is returned as it is, for the reader to refuse."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = content.rstrip(b"\0").split(b"\n")
    return lines[:-1]  # the last piece has no newline: empty, or a torn record


def seal(record: bytes) -> bytes:
    """A record as a line of the file: the record, a space, its CRC-32 in hex, a newline.
    A damaged record then fails its check instead of reading as another record."""
    return b"%b %08x\n" % (record, crc32(record))


def unseal(line: bytes) -> bytes:
    """The record of a sealed line; ValueError when its checksum doesn't match."""
    record, _, check = line.rpartition(b" ")
    if len(check) != 8 or int(check, 16) != crc32(record):
        raise ValueError("its checksum doesn't match")
    return record


def keep_damaged(path: Path) -> Path:
    """Copy a damaged file beside it (`<name>.damaged`, or `.damaged.N` if taken) before
    a store rewrites it from the records it could read."""
    kept = path.with_name(path.name + ".damaged")
    number = 0
    while kept.exists():
        number += 1
        kept = path.with_name(f"{path.name}.damaged.{number}")
    shutil.copy2(path, kept)
    with open(kept, "rb+") as copy:
        os.fsync(copy.fileno())
    log.warning("%s is damaged: a copy is kept as %s", path, kept)
    return kept


def replace_file(path: Path, content: bytes) -> None:
    """Write a file whole, atomically: a crash leaves the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class MappedLog:
    """An append-only record file: `append` seals a record and copies it into a memory map.

    `sync_interval` bounds what an OS crash can lose: every so many seconds (checked each
    32 KiB of records) the map is flushed to disk; `sync()` and `close()` flush too.
    """

    def __init__(self, path: Path, content: bytes, *, sync_interval: float | None = 1.0) -> None:
        replace_file(path, content)
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._size = 0
        self._map: mmap.mmap | None = None
        self._end = len(content)
        self._grow(self._end + 1)
        self._sync_interval = sync_interval
        self._synced_at = time.monotonic()

    def append(self, record: bytes) -> None:
        """Add one record (without its newline: see `seal`)."""
        record = b"%b %08x\n" % (record, crc32(record))  # seal(), inline: once per message
        start, size = self._end, len(record)
        end = start + size
        if end >= self._size:
            self._grow(end + 1)
        self._map[start:end] = record  # type: ignore[index]
        self._end = end
        if end & SYNC_CHECK_MASK < size:  # crossed a 32 KiB boundary: time to sync?
            self._maybe_sync()

    def _maybe_sync(self) -> None:
        interval = self._sync_interval
        if interval is not None and time.monotonic() - self._synced_at >= interval:
            self.sync()

    def _grow(self, needed: int) -> None:
        size = (needed // CHUNK + 1) * CHUNK
        if self._map is not None:
            self._map.close()  # what it holds stays in the page cache: no sync needed
        os.ftruncate(self._fd, size)
        # MAP_POPULATE: the pages are made once here, not one fault at a time in append
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._map = mmap.mmap(self._fd, size, flags=flags)
        self._size = size

    def sync(self) -> None:
        """Make every record so far durable against an OS crash."""
        if self._map is not None:
            self._map.flush()
            os.fsync(self._fd)
            self._synced_at = time.monotonic()

    def close(self) -> None:
        """Sync, and cut the file at its last record (the zero-filled tail goes)."""
        if self._map is None:
            return
        self.sync()
        self._map.close()
        self._map = None
        os.ftruncate(self._fd, self._end)
        os.fsync(self._fd)
        os.close(self._fd)


class MappedSlots:
    """A file of fixed-size slots after a header, each rewritten in place through a map.

    `headers` are those of the formats it reads, all of one length: a new file gets the
    first; `header` is the one the file has.
    """

    def __init__(self, path: Path, headers: tuple[bytes, ...], slot_size: int) -> None:
        self.path = path
        self.header_size = len(headers[0])
        self.slot_size = slot_size
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if size == 0:
            os.write(self._fd, headers[0])
            size = len(headers[0])
        self._map = mmap.mmap(self._fd, size)
        self.header = self._map[: self.header_size]
        if self.header not in headers:
            self._map.close()
            os.close(self._fd)
            raise ValueError(f"{path} is not a file of this kind (its header differs)")

    def set_header(self, header: bytes) -> None:
        """Rewrite the header (same length): after the slots were brought to its format."""
        self._map[: self.header_size] = header
        self.header = header

    @property
    def count(self) -> int:
        return (len(self._map) - self.header_size) // self.slot_size

    def slot(self, index: int) -> bytes:
        start = self.header_size + index * self.slot_size
        return self._map[start : start + self.slot_size]

    def write(self, index: int, at: int, data: bytes) -> None:
        start = self.header_size + index * self.slot_size + at
        self._map[start : start + len(data)] = data

    def add_slots(self, count: int) -> None:
        """Grow the file by `count` zero-filled slots."""
        size = len(self._map) + count * self.slot_size
        self._map.flush()
        self._map.close()
        os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)

    def sync(self) -> None:
        self._map.flush()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            self._map.close()
            os.close(self._fd)
            self._fd = -1
