"""The tcp:// client's outbox (client/tcp_transport.py): frames for the gateway's socket,
in order, written by the thread that finds the socket idle or by the writer thread, and
the publish sequence numbers. Apart from the transport because it is the one part that
writes: the transport's commands queue frames here, and its reader thread
(client/tcp_connection.py) never touches it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from amps_on_kafka.protocol.frame_buffer import FrameBuffer, publish_frame

MAX_OUTBOX = 16 * 1024 * 1024  # bytes queued for the socket before publishers wait


class Outbox:
    """Frames for the socket, in order, and the publish sequence numbers.

    A thread that finds the socket idle writes its frame itself: a lone command or batch
    of acks costs no thread switch. Frames put while a write is under way queue up and
    the writer thread sends them together, so busy publishers share system calls. A
    publish, which nobody waits for, is `deferred`: always left to the writer thread,
    which sends it with every publish queued behind it by the time it runs (a system
    call per publish was half of a tcp:// publisher's time; docs/performance.md). A
    plain publish is numbered and queued by `publish` without this class's lock: only
    the one that finds the buffer empty wakes the writer. A publisher that outruns the
    gateway blocks once more than MAX_OUTBOX bytes wait (each blocked publisher's own
    frame is queued already), instead of filling memory.
    """

    def __init__(self, sock: socket.socket, on_error: Callable[[str], None]) -> None:
        self._sock = sock
        self._on_error = on_error
        # publish sequence numbers: microseconds now, so they rise across restarts
        self.buffer = FrameBuffer(time.time_ns() // 1000 + 1, publish_frame)
        self._writing = False  # some thread is in sendall
        self._closing = False
        self._failed = False
        # Held as `with self._lock`, the condition's own lock: the same lock as `with
        # self._changed`, without Condition.__enter__/__exit__'s two Python calls (every
        # command takes it twice; docs/performance.md, the look-up's seventh round).
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._write, name="amps-tcp-writer", daemon=True)
        self._thread.start()

    def publish(self, topic: str, payload: bytes) -> int | None:
        """Number and queue a plain publish for the writer thread: its sequence number,
        or None once the socket failed or the outbox closed."""
        sequence, before = self.buffer.publish(topic, payload)
        if (before > 0 and before + len(payload) <= MAX_OUTBOX) or self._queued(before):
            return sequence
        return None

    def put(self, frame: bytes, *, deferred: bool = False) -> bool:
        """Send or queue a frame; False once the socket failed or the outbox closed. A
        command that finds the socket idle and nothing queued is written as it is, not
        appended to the buffer and taken back out (a look-up's send: docs/performance.md,
        the look-up's tenth round)."""
        with self._lock:
            if not (self._writing or deferred or len(self.buffer)):
                if self._failed or self._closing:  # the buffer is closed: append() refuses
                    return False
                self._writing = True
                data = frame
            else:
                data = self._queue(frame, deferred)
                if type(data) is bool:
                    return data
        return self._send(data)

    def _queue(self, frame: bytes, deferred: bool) -> bytes | bool:
        """Under the lock: append `frame` behind what waits; the bytes this caller writes
        now, or True (queued for the writer thread) or False (the outbox is closed)."""
        self._wait_for_room()
        before = self.buffer.append(frame)
        if before < 0:
            return False
        if self._writing or deferred:
            if before == 0:
                self._changed.notify_all()  # the writer sends it (after the write under way)
            return True
        return self._take()

    def close(self, timeout: float) -> None:
        """Send what is queued, then stop the writer."""
        with self._lock:
            self._closing = True
            self.buffer.close()
            self._changed.notify_all()
        self._thread.join(timeout)

    def _queued(self, before: int) -> bool:
        """After a publish found the buffer empty (wake the writer), took it past
        MAX_OUTBOX (wait for room, as put() waits before its frame) or found it closed
        (-1: False, not queued). A queued frame is sent unless the socket fails (a
        closing outbox sends what it holds)."""
        if before < 0:
            return False
        with self._lock:
            if before == 0:
                self._changed.notify_all()
            else:
                self._wait_for_room()
            return not self._failed

    def _wait_for_room(self) -> None:
        """Under the lock: until at most MAX_OUTBOX bytes wait, or the outbox ended."""
        while len(self.buffer) > MAX_OUTBOX and not (self._failed or self._closing):
            self._changed.wait()

    def _write(self) -> None:
        while True:
            with self._lock:
                while not (self._closing or len(self.buffer)) or self._writing:
                    self._changed.wait()
                data = self._take()
            if not data or not self._send(data):
                return

    def _take(self) -> bytes:
        """Under the lock: the bytes to write now; the caller becomes the writer."""
        if len(self.buffer) > MAX_OUTBOX:
            self._changed.notify_all()  # room again for blocked publishers
        self._writing = True
        return self.buffer.take()

    def _send(self, data: bytes) -> bool:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            with self._lock:
                self._failed, self._writing = True, False
                self.buffer.close()
                self._changed.notify_all()
            self._on_error(f"sending to the gateway failed: {exc}")
            return False
        with self._lock:
            self._writing = False
            if len(self.buffer) or self._closing:
                self._changed.notify_all()  # the writer thread takes what queued meanwhile
        return True
