"""RingBookmarkStore: only the recovery point per subscription and partition, in a file of
fixed slots (seed 003; the store's rules are in client/bookmark_store.py)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any
from zlib import crc32

import orjson

from amps_on_kafka.client.bookmark_store import BookmarkStore, PartitionMarks
from amps_on_kafka.client.mapped_file import (
    DamagedFile,
    MappedSlots,
    keep_damaged,
)
from amps_on_kafka.log.bookmarks import TP

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
        part = PartitionMarks(recovery, ref=[index, older, recovery])
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

    def _added_partition(self, sub_id: str, tp: TP, part: PartitionMarks) -> None:
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
        part: PartitionMarks,
        offset: int,
        publisher: bytes | None,
        sequence: bytes | None,
        delivered: bool,
    ) -> None:
        self._save(part)

    def _discarded(self, part: PartitionMarks, offset: int, message: Any) -> None:
        self._save(part)

    def _save(self, part: PartitionMarks) -> None:
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
