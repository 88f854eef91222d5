"""Message streams: what subscriptions and queries return, to iterate in a for loop.

A stream's source yields messages and, while nothing arrives, TICK about every
TICK_INTERVAL seconds (a quiet tcp:// route wakes that often; a quiet kafka:// replay
after each empty poll of 0.2 s). The ticks never reach the application: they let
`next(timeout=...)` give up on time while leaving the stream open, and let the stream
end after `idle_timeout` quiet seconds, without a thread per stream.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from amps_on_kafka.log.controls import TICK
from amps_on_kafka.log.message import Message

TICK_INTERVAL = 0.1  # seconds between ticks of a quiet tcp:// stream

Item = Message | object  # a Message, or TICK


def check_timeout(timeout: float | None, *, wait: bool = False) -> None:
    """A stream's `timeout=` is None (no limit) or seconds above 0; next()'s (`wait`) may
    be 0 (don't wait). AMPS clients read 0 as "no limit": refused here rather than ending
    the stream at once, and NaN, which would never end it, is refused too."""
    if timeout is None:
        return
    number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not number or not (timeout >= 0 if wait else timeout > 0):
        least = "0 or more" if wait else "above 0"
        raise ValueError(
            f"timeout must be a number of seconds {least}, or None for no limit (got {timeout!r})"
        )


def wait_limit(timeout: float | None) -> float | None:
    """A call's `timeout=` (logon, publish_flush, heartbeat) as the waits under it take
    it: None or seconds of 0 or more, `inf` meaning no limit (a wait of inf overflowed:
    OverflowError "timestamp out of range"); NaN or a negative is a ValueError."""
    check_timeout(timeout, wait=True)
    return None if timeout == math.inf else timeout


class MessageStream:
    """An iterable of messages (and a `completed` marker where one was asked for).

    `for message in stream` waits as long as it takes; `stream.next(timeout=1.0)` waits
    at most that long and returns None, leaving the stream open. `idle_timeout` (the
    `timeout=` of the call that opened the stream) ends the stream after that many
    quiet seconds. Closing the stream ends the subscription; use it as a context manager.
    """

    def __init__(
        self,
        source: Iterator[Item],
        on_close: Callable[[], None],
        sub_id: str | None = None,
        *,
        idle_timeout: float | None = None,
    ) -> None:
        self._source = source
        self._on_close = on_close
        self._closed = False
        self._ended = False
        self.sub_id = sub_id
        self.idle_timeout = idle_timeout
        self._quiet_since = time.monotonic()

    @property
    def ended(self) -> bool:
        """True once the stream delivered its last message (or was closed)."""
        return self._ended or self._closed

    @property
    def source(self) -> Iterator[Item]:
        """The items, ticks included: for a stream built on this one (a bookmark
        subscription over tcp://, an HA stream), which keeps its own clock."""
        return self._source

    def __iter__(self) -> Iterator[Message]:
        return self._messages() if not self.ended else iter(())

    def _messages(self) -> Iterator[Message]:
        """The messages, ticks left out: one generator frame per message, no method call.
        Leaving a for loop early leaves the stream open: iterate it again to go on."""
        idle = self.idle_timeout
        for item in self._source:
            if item is TICK:
                if self._closed or self._idle_over(idle):
                    break
                continue
            if idle is not None:
                self._quiet_since = time.monotonic()
            yield item  # type: ignore[misc]  # not TICK: a Message
        self._end()

    def __next__(self) -> Message:
        message = self.next()
        assert message is not None  # without a timeout, next waits for one
        return message

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message; None if none came within `timeout` seconds (None: wait as
        long as it takes). The stream stays open after a timeout: call again to go on
        waiting. A timeout may overrun by up to a tick (0.1 s on tcp://, 0.2 s on
        kafka://). Raises StopIteration once the stream has ended (see `ended`)."""
        check_timeout(timeout, wait=True)
        if self.ended:
            raise StopIteration
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = next(self._source)
            except StopIteration:
                self._end()
                raise
            if item is TICK:
                if self._closed or self._idle_over(self.idle_timeout):
                    self._end()
                    raise StopIteration
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if self.idle_timeout is not None:
                self._quiet_since = time.monotonic()
            return item  # type: ignore[return-value]  # not TICK: a Message

    def _idle_over(self, idle: float | None) -> bool:
        return idle is not None and time.monotonic() - self._quiet_since >= idle

    def _end(self) -> None:
        """The source has nothing more: release the subscription behind it."""
        if not self._ended:
            self._ended = True
            self.close()

    def close(self) -> None:
        """End the stream and the subscription behind it (idempotent)."""
        if not self._closed:
            self._closed = True
            self._on_close()

    def __enter__(self) -> MessageStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
