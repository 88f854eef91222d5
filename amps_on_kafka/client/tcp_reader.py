"""Who reads a tcp:// connection's socket (client/tcp_connection.py): the reader baton.

Only one thread reads the socket at a time: whoever holds the baton. A caller waiting
for the reply to its command takes the baton when no other thread holds it, reads until
something has been routed to its own queue, and gives it back. Every frame it reads is
routed as the reader thread routes it (deliveries to their subscriptions' queues, other
commands' replies to their callers, a refused publish to the failed-write handler), in
the order read, with the one FrameDecoder of the connection. A round trip then wakes one
thread of the client, not two (the reader thread, then the caller): docs/performance.md,
the look-up's eighth round.

The reader thread reads whenever the socket must be read and no caller is reading it:
- while a subscription is open (its stream waits on its queue for the reader thread);
- while a caller waits on its queue with nothing in it (the baton was held when it came,
  or it had less than a SLICE left: see below);
- once no caller has come for IDLE seconds (so a refused publish or a lost connection is
  seen within one to two IDLEs while the application is quiet);
- to read to the end once the connection is closed.
Otherwise, after a read that left every waiting caller something, it parks: the next
command's caller finds the socket free. A caller wakes it only when one of the above
holds, so back-to-back commands cost the reader thread nothing.

Every read waits at most a SLICE (the socket's receive timeout, SO_RCVTIMEO), so the
holder looks at its deadline at least that often; one with less than a slice left gives
the baton back and waits on its queue for the rest, the reader thread reading for it.
"""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from amps_on_kafka.client.stream import TICK_INTERVAL
from amps_on_kafka.client.tls import TlsSocket
from amps_on_kafka.protocol.frames import READ_SIZE, Event, FrameDecoder

MAX_INBOUND_FRAME = 1 << 30  # the gateway bounds its frames; this only guards the decoder
SLICE = 0.05  # seconds: a read's longest wait, under a stream's TICK_INTERVAL
IDLE = TICK_INTERVAL  # seconds without a caller before the reader thread reads again


def read_in_slices(sock: socket.socket) -> None:
    """Bound each blocking read of `sock` to a SLICE (a quiet read raises BlockingIOError);
    writes are not bounded (SO_SNDTIMEO is apart)."""
    seconds, fraction = divmod(SLICE, 1)
    timeval = struct.pack("ll", int(seconds), int(fraction * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)


class SocketReader:
    """The reader baton of one connection, and its reader thread (the module's doc)."""

    def __init__(
        self,
        sock: socket.socket | TlsSocket,
        name: str,
        route: Callable[[list[Event]], None],
        lose: Callable[[str], None],
        subscriptions: dict[str, queue.SimpleQueue[Any]],
    ) -> None:
        """`route` a read's frames (and bad frames) to their waiters, in order; `lose`
        the connection (which calls end()); `subscriptions`: the open ones' routes
        (their streams need the reader thread)."""
        self._sock = sock
        self._decoder = FrameDecoder(MAX_INBOUND_FRAME)
        self._route, self._lose, self._subscriptions = route, lose, subscriptions
        self._lock = threading.Lock()  # guards the fields below
        self._turn = threading.Condition(self._lock)  # where the reader thread parks
        self._held = False  # the baton: some thread reads the socket
        self._waiting: list[queue.SimpleQueue[Any]] = []  # callers' queues, waiting for a reader
        self._caller_came = False  # a caller wanted frames since the reader last looked
        self._idle = False  # no caller came for an IDLE: the reader thread reads
        self._closing = False  # the socket was shut down: read to its end
        self._ended = False  # the connection is gone: nobody reads any more
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the reader thread (once the connection can take its `lose`)."""
        self._thread.start()

    def next(self, replies: queue.SimpleQueue[Any], timeout: float | None) -> Any:
        """The next item routed to `replies`, reading the socket for it while no other
        thread does; queue.Empty once `timeout` seconds passed (None: no limit)."""
        if not replies.empty():
            return replies.get_nowait()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if not self._take(replies, left):
                return self._wait(replies, left)
            try:
                self._read_for(replies, deadline)
            finally:
                self._give_back()
            if not replies.empty():
                return replies.get_nowait()

    def end(self) -> None:
        """The connection is gone (its waiters failed by the caller): nobody reads any
        more, and the reader thread exits."""
        with self._lock:
            self._ended = True
            self._turn.notify()

    def close(self, timeout: float) -> None:
        """Once the socket is shut down: the reader thread reads to its end (so whoever
        still waits fails as on a lost connection), then exits; wait for it."""
        with self._lock:
            self._closing = True
            self._turn.notify()
        self._thread.join(timeout)

    # -- a caller -------------------------------------------------------------------------
    def _take(self, replies: queue.SimpleQueue[Any], left: float | None) -> bool:
        """Take the baton if it is free and a slice is left. Else wait as a caller the
        reader thread reads for: woken now if the baton is free, else by its holder."""
        with self._lock:
            self._caller_came, self._idle = True, False
            if not self._held and not self._ended and (left is None or left >= SLICE):
                self._held = True
                return True
            self._waiting.append(replies)
            if not self._held:
                self._turn.notify()
            return False

    def _wait(self, replies: queue.SimpleQueue[Any], left: float | None) -> Any:
        try:
            return replies.get(timeout=None if left is None else max(left, 0.0))
        finally:
            with self._lock:
                self._waiting.remove(replies)

    def _read_for(self, replies: queue.SimpleQueue[Any], deadline: float | None) -> None:
        """Holding the baton: read until something is routed to `replies`, the
        connection ends or less than a slice is left."""
        while replies.empty() and not self._ended:
            if deadline is not None and deadline - time.monotonic() < SLICE:
                return
            self._read_once()

    def _give_back(self) -> None:
        with self._lock:
            self._held = False
            if self._needed():
                self._turn.notify()

    # -- the reader thread ----------------------------------------------------------------
    def _run(self) -> None:
        while self._my_turn():
            try:
                self._read_once()
            finally:
                self._give_back()

    def _my_turn(self) -> bool:
        """Wait until the socket needs the reader thread and is free, and take the baton;
        False once the connection is gone. A quiet IDLE with no caller makes it idle."""
        with self._lock:
            while not self._ended:
                if not self._held and (self._idle or self._needed()):
                    self._held = True
                    return True
                if not self._turn.wait(IDLE):
                    self._idle, self._caller_came = not self._caller_came, False
            return False

    def _needed(self) -> bool:
        """Under the lock: whether the socket must be read though no caller reads it."""
        if self._closing or self._subscriptions:
            return True
        return bool(self._waiting) and any(replies.empty() for replies in self._waiting)

    # -- either ---------------------------------------------------------------------------
    def _read_once(self) -> None:
        """Holding the baton: one read, its frames routed in order; nothing after a quiet
        SLICE; the connection lost on its end or an error."""
        try:
            data = self._sock.recv(READ_SIZE)
        except BlockingIOError:  # a quiet slice (SO_RCVTIMEO)
            return
        except OSError as exc:
            self._lose(f"connection to the gateway lost: {exc}")
            return
        if not data:
            self._lose("the gateway closed the connection")
            return
        self._route(self._decoder.feed(data))
