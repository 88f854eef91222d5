"""Files the client's stores write through a memory map.

A store must not lose what it recorded when the process is killed, yet a write(2) per
delivered message would cost more than the replay it records. A memory-mapped file
gives both: bytes copied into the map are in the kernel's page cache as soon as the copy
returns, so they survive SIGKILL without a system call; only an OS crash or a power cut
can lose what was not synced yet (`sync()`: msync + fsync).

Appended records are text lines. The file grows in zero-filled chunks, so a record torn
by a kill holds a NUL byte: reading stops at the first line that is incomplete or holds
one, which keeps every record before it.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

CHUNK = 1 << 20  # the file grows this much at a time
SYNC_CHECK_MASK = (1 << 15) - 1  # appends look at the clock once per 32 KiB written


def read_lines(path: Path) -> list[bytes]:
    """The complete records of a file written by MappedLog (nothing if there is none)."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return []
    end = content.find(b"\0")
    if end >= 0:
        content = content[:end]
    lines = content.split(b"\n")
    return lines[:-1]  # the last piece has no newline: empty, or a torn record


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
    """An append-only record file: `append` copies bytes into a memory map.

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
    """A file of fixed-size slots after a header, each rewritten in place through a map."""

    def __init__(self, path: Path, header: bytes, slot_size: int) -> None:
        self.path = path
        self.header_size = len(header)
        self.slot_size = slot_size
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if size == 0:
            os.write(self._fd, header)
            size = len(header)
        self._map = mmap.mmap(self._fd, size)
        if self._map[: self.header_size] != header:
            self._map.close()
            os.close(self._fd)
            raise ValueError(f"{path} is not a file of this kind (its header differs)")

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
