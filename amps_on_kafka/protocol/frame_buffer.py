"""The tcp:// client's outbox bytes: frames waiting for the socket, and the publish
sequence numbers, numbered and queued in one step.

`FrameBuffer` is the compiled core's (native/src/frame_buffer.rs) when it is installed,
else `PyFrameBuffer`, its twin here; tests/native/test_frame_buffer.py holds them to the
same bytes, numbers and errors. A plain publish is numbered and its frame appended in
one call: the compiled one writes the header from a template straight into the pending
bytes, so a publish costs no header dict, orjson call, frame object or join (a tcp://
publisher's app thread spent most of its time there: docs/performance.md). Numbering
and queueing are one step, so a connection's publishes are queued in sequence order
even from several threads.

The buffer is not bounded itself: its owner (client/tcp_outbox.py, Outbox) reads
the bytes pending before each append and holds publishers back past its limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from amps_on_kafka.native import core
from amps_on_kafka.protocol.frames import encode_frame

MAX_SEQUENCE = 2**63 - 1  # the compiled buffer counts in 64 bits


def publish_frame(topic: str, sequence: int, payload: bytes) -> bytes:
    """A plain publish's frame, as TcpTransport.publish encodes one with no options."""
    return encode_frame({"c": "publish", "t": topic, "s": sequence}, payload)


class PyFrameBuffer:
    """The twin: a list of frames under a lock."""

    def __init__(self, first_sequence: int, frame: Callable[[str, int, bytes], bytes]) -> None:
        """`frame(topic, sequence, payload)`: a plain publish's frame (publish_frame)."""
        if not -MAX_SEQUENCE - 1 <= first_sequence <= MAX_SEQUENCE:
            raise OverflowError(f"sequence {first_sequence} does not fit 64 bits")
        self._frame = frame
        self._lock = threading.Lock()
        self._frames: list[bytes] = []
        self._size = 0
        self._next = first_sequence
        self._closed = False

    def reserve(self, count: int) -> int:
        """The first of `count` consecutive sequence numbers."""
        with self._lock:
            return self._number(count)

    def publish(self, topic: str, payload: bytes) -> tuple[int, int]:
        """Number a plain publish and queue its frame: (its sequence, the bytes pending
        before it, -1 if closed). The number is taken even when the frame is refused."""
        with self._lock:  # one step, as the compiled call is: queued in sequence order
            sequence = self._number(1)
            return sequence, self._append(self._frame(topic, sequence, payload))

    def append(self, frame: bytes) -> int:
        """Queue a frame: the bytes pending before it, -1 if closed (nothing queued)."""
        with self._lock:
            return self._append(frame)

    def _append(self, frame: bytes) -> int:
        if self._closed:
            return -1
        before = self._size
        self._frames.append(frame)
        self._size += len(frame)
        return before

    def take(self) -> bytes:
        """Every pending byte, in order; the buffer is empty after."""
        with self._lock:
            frames, self._frames, self._size = self._frames, [], 0
        return b"".join(frames)

    def close(self) -> None:
        """Refuse every later frame (append and publish give -1); what is pending stays."""
        with self._lock:
            self._closed = True

    def __len__(self) -> int:
        return self._size

    def _number(self, count: int) -> int:
        if count < 0:
            raise ValueError(f"can't reserve {count} sequence numbers")
        first = self._next
        if first + count > MAX_SEQUENCE:
            raise OverflowError("publish sequence numbers exhausted")
        self._next = first + count
        return first


FrameBuffer = PyFrameBuffer if core is None else core.FrameBuffer
