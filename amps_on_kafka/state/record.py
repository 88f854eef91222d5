"""A SOW record as stored: the payload and what AMPS keeps beside it.

Each record keeps the offset (hence the bookmark) and the timestamp of its last update,
and its absolute expiration deadline. The deadline is stored, never recomputed: seed
000 says a changed topic default must not change the lifetime of records already held.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from amps_on_kafka.log.codecs import Codec

_HEADER = struct.Struct(">qqq")  # offset, timestamp ms, deadline ms (0 = never)
NEVER = 0
MAX_DEADLINE = 2**63 - 1  # the largest deadline the packed header's signed 64 bits hold


#: pack_header(offset, timestamp, deadline): the bytes before the payload of a record as
#: stored (pack_record), for code that packs a whole batch without a call per record.
pack_header = _HEADER.pack
#: unpack_header(stored) -> (offset, timestamp, deadline); the payload starts at HEADER_SIZE
#: (a scan reads the header of a record it may skip without building a SowRecord).
unpack_header = _HEADER.unpack_from
HEADER_SIZE = _HEADER.size


def pack_record(offset: int, timestamp: int, deadline: int, payload: bytes) -> bytes:
    """A record as stored, built without a SowRecord where nothing else needs one."""
    return pack_header(offset, timestamp, deadline) + payload


def deadline_of(stored: bytes) -> int:
    """A stored record's deadline, read without decoding the rest."""
    return _HEADER.unpack_from(stored)[2]


@dataclass(slots=True)
class SowRecord:
    """The latest state of one SOW key in one partition of a topic."""

    topic: str
    partition: int
    sow_key: str
    payload: bytes
    offset: int
    timestamp: int
    deadline: int = NEVER
    codec: Codec | None = field(default=None, repr=False, compare=False)
    _data: Any = field(default=None, repr=False, compare=False)

    @property
    def bookmark(self) -> str:
        return f"{self.topic}|{self.partition}|{self.offset}|"

    @property
    def data(self) -> Any:
        """The decoded payload, decoded once however many subscriptions filter on it."""
        if self._data is None and self.codec is not None:
            self._data = self.codec.decode(self.payload)
        return self._data

    @property
    def expiration(self) -> float | None:
        """Seconds left to live as of the record's last update, or None when it never expires."""
        return None if self.deadline == NEVER else (self.deadline - self.timestamp) / 1000

    def expired_at(self, millis: int) -> bool:
        return self.deadline != NEVER and self.deadline <= millis

    def encode(self) -> bytes:
        return pack_record(self.offset, self.timestamp, self.deadline, self.payload)

    @classmethod
    def decode(
        cls, topic: str, partition: int, key: bytes, raw: bytes, codec: Codec | None
    ) -> SowRecord:
        offset, timestamp, deadline = _HEADER.unpack_from(raw)
        return cls(
            topic, partition, key.decode(), raw[_HEADER.size :], offset, timestamp, deadline, codec
        )
