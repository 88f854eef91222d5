"""Publish stores: what a publisher sent that Kafka has not acknowledged yet.

The HA client writes each publish (and sow_delete) to its store BEFORE producing it,
with the sequence number it will carry, and removes it once Kafka acknowledged it
(publish_flush: every publish before the flush is persisted, like AMPS's cumulative
persisted ack). After a reconnect or a restart, everything still in the store is
published again with its ORIGINAL publisher id and sequence: a copy that did reach Kafka
before the failure is then a duplicate that subscribers' bookmark stores drop.

- MemoryPublishStore: survives reconnects, not a crash of the publisher.
- FilePublishStore(path): an append-only file of entries and removals. An entry is
  written (write(2), so in the kernel) before the publish is produced: it survives the
  publisher's process being killed. With `fsync=True` each entry is also fsynced before
  the publish goes out, which survives an OS crash at the price of a disk sync per
  publish. Removals are written at each flush; the file is compacted on open. Each
  record carries its CRC-32: a damaged one anywhere but at the torn end of a kill makes
  the store refuse the file (DamagedFile) unless opened with `salvage=True`.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from amps_on_kafka.client.mapped_file import (
    DamagedFile,
    keep_damaged,
    read_lines,
    replace_file,
    seal,
    unseal,
)


@dataclass(frozen=True)
class StoredPublish:
    """One command as the HA client will send it again: publish, delta_publish or
    sow_delete, with everything it was called with."""

    sequence: int
    command: str
    topic: str
    data: Any = None
    expiration: float | None = None
    options: dict[str, Any] = field(default_factory=dict)  # sow_key, filter, keys, ...

    def to_json(self) -> bytes:
        raw = isinstance(self.data, bytes | bytearray)
        return orjson.dumps(
            {
                "s": self.sequence,
                "c": self.command,
                "t": self.topic,
                "d": base64.b64encode(self.data).decode() if raw else self.data,
                "b": raw,
                "e": self.expiration,
                "o": self.options,
            }
        )

    @classmethod
    def from_json(cls, text: bytes) -> StoredPublish:
        doc = orjson.loads(text)
        data = base64.b64decode(doc["d"]) if doc.get("b") else doc.get("d")
        return cls(doc["s"], doc["c"], doc["t"], data, doc.get("e"), doc.get("o") or {})


class PublishStore:
    """Entries by sequence, in order; thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[int, StoredPublish] = {}
        self._lock = threading.Lock()
        self.publisher_id: str | None = None

    def claim(self, publisher_id: str) -> None:
        """Bind the store to a publisher: republishing under another name would defeat
        subscribers' duplicate detection, so a store refuses a second name."""
        with self._lock:
            if self.publisher_id not in (None, publisher_id):
                raise ValueError(
                    f"this publish store belongs to publisher {self.publisher_id!r}, "
                    f"not {publisher_id!r}"
                )
            if self.publisher_id is None:
                self.publisher_id = publisher_id
                self._claimed(publisher_id)

    def store(self, entry: StoredPublish) -> None:
        with self._lock:
            self._entries[entry.sequence] = entry
            self._stored(entry)

    def discard_up_to(self, sequence: int) -> int:
        """Kafka acknowledged everything up to `sequence`; returns how many were removed."""
        with self._lock:
            done = [s for s in self._entries if s <= sequence]
            for s in done:
                del self._entries[s]
            if done:
                self._removed(done)
            return len(done)

    def remove(self, sequence: int) -> None:
        """Forget one entry: a command refused before it was sent (a bad argument,
        payload or topic) would be refused again at every reconnect."""
        with self._lock:
            if self._entries.pop(sequence, None) is not None:
                self._removed([sequence])

    def unpersisted(self) -> list[StoredPublish]:
        """What Kafka has not acknowledged, oldest first."""
        with self._lock:
            return [self._entries[s] for s in sorted(self._entries)]

    def last_sequence(self) -> int | None:
        with self._lock:
            return max(self._entries, default=None)

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        """Release the store's file (nothing to do in memory)."""

    def __enter__(self) -> PublishStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claimed(self, publisher_id: str) -> None:
        pass

    def _stored(self, entry: StoredPublish) -> None:
        pass

    def _removed(self, sequences: list[int]) -> None:
        pass


class MemoryPublishStore(PublishStore):
    """Unacknowledged publishes in memory: republished after a reconnect."""


HEADER = b"AMPS-KAFKA PUBLISHES 2"  # records sealed with their CRC-32 (mapped_file.seal)
HEADER_V1 = b"AMPS-KAFKA PUBLISHES 1"  # the same records without checksums: still read
REMEDY = (
    "open it with FilePublishStore(path, salvage=True) to keep every record that reads "
    "(the damaged file is copied beside it as <name>.damaged; a damaged entry's publish "
    "is not sent again, the publishes of a damaged removal are sent again and dropped by "
    "subscribers as duplicates), or move the file away to start with no publish to resend"
)
_UNREADABLE = (ValueError, KeyError, TypeError, IndexError, orjson.JSONDecodeError)


class FilePublishStore(PublishStore):
    """Unacknowledged publishes in a file: republished after the publisher restarts."""

    def __init__(self, path: str | Path, *, fsync: bool = False, salvage: bool = False) -> None:
        super().__init__()
        self.path = Path(path)
        self.fsync = fsync
        self._read(read_lines(self.path), salvage)
        replace_file(self.path, self._snapshot())
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def _read(self, lines: list[bytes], salvage: bool) -> None:
        """Apply every record (read_lines has left out the tail a kill may tear). A
        record that doesn't read is damage: DamagedFile, unless `salvage` (then it is
        skipped and the rest applied: each record stands alone, so the worst a skipped
        one does is lose its own publish or resend publishes already persisted)."""
        if lines and lines[0] not in (HEADER, HEADER_V1):
            raise ValueError(f"{self.path} is not a FilePublishStore file")
        sealed = bool(lines) and lines[0] == HEADER
        damaged = False
        for index in range(1, len(lines)):
            try:
                self._apply(unseal(lines[index]) if sealed else lines[index])
            except _UNREADABLE as exc:
                if not salvage:
                    raise DamagedFile.at_line(self.path, lines, index, exc, REMEDY) from exc
                damaged = True
        if damaged:
            keep_damaged(self.path)

    def _apply(self, record: bytes) -> None:
        kind, _, rest = record.partition(b" ")
        if kind == b"+":
            entry = StoredPublish.from_json(rest)
            self._entries[entry.sequence] = entry
        elif kind == b"-":
            for sequence in rest.split():
                self._entries.pop(int(sequence), None)
        elif kind == b"p":
            self.publisher_id = orjson.loads(rest)
        else:
            raise ValueError(f"unknown record {kind!r}")

    def _snapshot(self) -> bytes:
        records = []
        if self.publisher_id is not None:
            records.append(b"p " + orjson.dumps(self.publisher_id))
        records.extend(b"+ " + entry.to_json() for entry in self._entries.values())
        return HEADER + b"\n" + b"".join(map(seal, records))

    def _write(self, record: bytes, sync: bool) -> None:
        os.write(self._fd, record)
        if sync:
            os.fsync(self._fd)

    def _claimed(self, publisher_id: str) -> None:
        self._write(seal(b"p " + orjson.dumps(publisher_id)), True)

    def _stored(self, entry: StoredPublish) -> None:
        self._write(seal(b"+ " + entry.to_json()), self.fsync)

    def _removed(self, sequences: Iterable[int]) -> None:
        self._write(seal(b"- " + b" ".join(b"%d" % s for s in sequences)), self.fsync)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
