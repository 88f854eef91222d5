"""Gateway frames: `[total length][header length][header JSON][payload]`, both ends.

Both lengths are 4-byte big-endian unsigned integers; the total, N, counts every byte
after itself (4 + header + payload) and is the frame size the limit applies to. The
header is a JSON object of AMPS-style keys; the payload is the message, untouched, so
the gateway never parses what it only forwards.

`FrameDecoder` is sans-IO: feed it whatever bytes arrived, get back whole frames. A frame
larger than the limit is never buffered: its header is read (to answer the right
command) and the rest is discarded as it arrives, so the connection stays in step and
survives. Only a total length too small to hold the header length can't be skipped.

The gateway's decoder (`publishes=True`) gives a plain publish — a header of exactly `c`
"publish", `t` and at most a whole number `s` — as a `Publish` tuple, not a Frame: the
session writes a read's run of them as one batch (server/publishing.py, publish_run), and
the compiled core (native/src/frames.rs) reads such a header without a dict.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from amps_on_kafka.native import core

_LENGTH = struct.Struct(">I")
_PREFIX = struct.Struct(">II")
MAX_PEEK = 64 * 1024  # the most of an oversized frame's header read to find its command id
# Bytes asked of the socket per read, at both ends. Below glibc's mmap threshold (128 KiB)
# on purpose: a 256 KiB recv buffer is mapped and unmapped on every read, which measured
# 16 us per read against 2.6 us for 64 KiB, and a busy connection reads a few frames a time.
READ_SIZE = 64 * 1024


@dataclass(slots=True)
class Frame:
    """Not frozen, though nothing assigns its fields: one is built per frame at both
    ends, and a frozen dataclass is built through object.__setattr__ (5x the cost)."""

    header: dict[str, Any]
    payload: bytes


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame that could not be used; `fatal` when the stream can't be resynchronised."""

    reason: str
    header: dict[str, Any] | None = None
    fatal: bool = False


Publish = tuple[str, int | None, bytes]  # a plain publish: topic, `s` (None: none), payload
Event = Frame | BadFrame | Publish
Decode = Callable[[int, int, int], Event]  # (header start, header length, frame end)
Split = Callable[[bytearray, int, int, Decode], tuple[list[Event], int]]  # split_frames


def plain_publish(header: dict[str, Any]) -> tuple[str, int | None] | None:
    """(topic, s) of a plain publish's header (keys `c` "publish", `t` text and at most
    `s`, a whole number), else None."""
    if header.get("c") != "publish" or len(header) != (3 if "s" in header else 2):
        return None
    topic, sequence = header.get("t"), header.get("s", 0)
    if type(topic) is not str or type(sequence) is not int or sequence < 0:
        return None
    return topic, header.get("s")


def publish_header(publish: Publish) -> dict[str, Any]:
    """The header a Publish was read from (for its acks and the per-command path)."""
    topic, sequence, _payload = publish
    return (
        {"c": "publish", "t": topic}
        if sequence is None
        else {"c": "publish", "t": topic, "s": sequence}
    )


def split_frames(
    buffer: bytearray, pos: int, limit: int, decode: Decode
) -> tuple[list[Event], int]:
    """The events `decode` makes of the whole frames within `limit` from `pos` on, and
    the position after them; it stops at the first thing it doesn't take (a frame not
    whole yet, too large, or whose lengths disagree), which FrameDecoder._step handles.
    The compiled core's split_frames gives the same, reading plain publishes itself."""
    events: list[Event] = []
    available, unpack = len(buffer), _PREFIX.unpack_from
    while available - pos >= 8:
        total, header_length = unpack(buffer, pos)
        end = pos + 4 + total
        if total < 4 or header_length > total - 4 or total > limit or end > available:
            break
        events.append(decode(pos + 8, header_length, end))
        pos = end
    return events, pos


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return frame_of(orjson.dumps(header), payload)


def frame_of(encoded: bytes, payload: bytes = b"") -> bytes:
    """A frame of a header encoded already: the gateway builds a key look-up's answer
    from pieces of JSON encoded once (server/queries.py)."""
    return b"".join((_PREFIX.pack(4 + len(encoded) + len(payload), len(encoded)), encoded, payload))


def count_frames(frames: bytes) -> int:
    """How many frames `frames`, encoded back to back, holds (the gateway counts what it
    sends a burst at a time)."""
    count = offset = 0
    while offset + 4 <= len(frames):
        offset += 4 + _LENGTH.unpack_from(frames, offset)[0]
        count += 1
    return count


def parse_header(raw: bytes | bytearray) -> dict[str, Any]:
    """The header object; ValueError says why it isn't one."""
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"frame header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"frame header must be a JSON object, not {type(header).__name__}")
    return header


class FrameDecoder:
    """Turns a byte stream, split anywhere, into Frame and BadFrame events."""

    def __init__(self, max_frame_bytes: int, *, publishes: bool = False) -> None:
        """`publishes`: give plain publishes as Publish tuples (the gateway's reads)."""
        self.max_frame_bytes = max_frame_bytes
        self.broken = False
        self._decode: Decode = self._publish_or_frame if publishes else self._frame
        self._split: Split = split_frames
        if core is not None:  # the compiled split: a client's frames made without a Python
            # frame each (client_frames), the gateway's plain publishes read without a dict
            self._split = (
                core.split_frames
                if publishes
                else functools.partial(core.client_frames, loads=orjson.loads, frame=Frame)
            )
        self._buffer = bytearray()
        self._pos = 0
        self._skip = 0  # bytes of an oversized or malformed frame still to discard
        self._peek: tuple[int, int] | None = None  # (total, header length) of an oversized frame

    @property
    def partial(self) -> bool:
        """Whether a frame has begun and not ended (the gateway times such a frame out)."""
        return bool(self._buffer) or self._skip > 0 or self._peek is not None

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self.broken:
            return events
        if self._skip and not self._buffer:
            data = self._discard(data)  # don't even copy what is being skipped
        self._buffer += data
        self._whole_frames(events)
        while not self.broken and self._step(events):
            pass
        del self._buffer[: self._pos]
        self._pos = 0
        return events

    def _whole_frames(self, events: list[Event]) -> None:
        """The common case in one call: well-formed frames within the limit, each whole
        in the buffer (a busy connection reads a few hundred at a time)."""
        if self._skip or self._peek is not None:
            return
        whole, self._pos = self._split(self._buffer, self._pos, self.max_frame_bytes, self._decode)
        events += whole

    def _discard(self, data: bytes) -> bytes:
        dropped = min(self._skip, len(data))
        self._skip -= dropped
        return data[dropped:]

    def _step(self, events: list[Event]) -> bool:
        """Consume one frame or one piece of a skipped frame; False when bytes are missing."""
        available = len(self._buffer) - self._pos
        if self._skip:
            dropped = min(self._skip, available)
            self._pos += dropped
            self._skip -= dropped
            return self._skip == 0
        if self._peek is not None:
            return self._peek_oversized(events, available)
        if available < 4:
            return False
        (total,) = _LENGTH.unpack_from(self._buffer, self._pos)
        if total < 4:
            self.broken = True
            events.append(BadFrame(f"frame length {total} can't hold a header length", fatal=True))
            return False
        if available < 8:
            return False
        (header_length,) = _LENGTH.unpack_from(self._buffer, self._pos + 4)
        if header_length > total - 4 or total > self.max_frame_bytes:
            return self._refuse(events, total, header_length)
        if available < 4 + total:
            return False
        events.append(self._decode(self._pos + 8, header_length, self._pos + 4 + total))
        self._pos += 4 + total
        return True

    def _frame(self, start: int, header_length: int, end: int) -> Frame | BadFrame:
        try:
            header = parse_header(self._buffer[start : start + header_length])
        except ValueError as exc:
            return BadFrame(str(exc))
        if end == start + header_length:  # most commands have none: no view to make
            return Frame(header, b"")
        with memoryview(self._buffer) as view:  # one copy of the payload, not two
            return Frame(header, bytes(view[start + header_length : end]))

    def _publish_or_frame(self, start: int, header_length: int, end: int) -> Event:
        frame = self._frame(start, header_length, end)
        if type(frame) is Frame and (plain := plain_publish(frame.header)) is not None:
            return (*plain, frame.payload)
        return frame

    def _refuse(self, events: list[Event], total: int, header_length: int) -> bool:
        """Skip a frame whose lengths disagree or that is too large, reading its header if small."""
        self._pos += 8
        if header_length > total - 4:
            self._skip = total - 4
            reason = f"header length {header_length} exceeds the frame length {total}"
            events.append(BadFrame(reason))
        elif header_length <= min(MAX_PEEK, self.max_frame_bytes):
            self._peek = (total, header_length)
        else:
            self._skip = total - 4
            events.append(BadFrame(self._too_large(total)))
        return True

    def _peek_oversized(self, events: list[Event], available: int) -> bool:
        total, header_length = self._peek  # type: ignore[misc]
        if available < header_length:
            return False
        try:
            header = parse_header(self._buffer[self._pos : self._pos + header_length])
        except ValueError:
            header = None
        self._pos += header_length
        self._skip = total - 4 - header_length
        self._peek = None
        events.append(BadFrame(self._too_large(total), header))
        return True

    def _too_large(self, total: int) -> str:
        return f"frame of {total} bytes exceeds the limit of {self.max_frame_bytes}"
