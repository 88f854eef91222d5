"""Acknowledging queue messages, batched as AMPS clients batch them (seed 002).

`message.ack()` hands the bookmark to an AckBatcher; one `sow_delete` carries the
bookmarks of many messages as a comma-separated list. A batch is sent when it holds
`batch_size` bookmarks, or `timeout` seconds after its first one, or on `flush()`.
Acks are sent without a command id: the gateway answers only failures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from amps_on_kafka.errors import AmpsError

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1  # every ack goes at once unless the application asks for batching
DEFAULT_TIMEOUT = 0.005  # seconds a partial batch waits for more bookmarks
LINGER = 1.0  # seconds the timer thread stays awake after the last batch began
OPTIONS = (None, "cancel", "expire")

Send = Callable[[dict[str, Any]], None]


class AckBatcher:
    def __init__(
        self, send: Send, batch_size: int = DEFAULT_BATCH_SIZE, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._send = send
        self.batch_size = batch_size
        self.timeout = timeout
        self._pending: dict[tuple[str, str | None], list[str]] = {}
        self._count = 0
        self._first = 0.0  # when the batch waiting now began
        self._closed = False
        self._idle = False  # the timer thread sleeps until a batch starts
        # `add` takes the lock itself (a C call), not through the Condition's Python
        # __enter__ and __exit__: an ack a message, by the thousand
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def configure(self, batch_size: int | None = None, timeout: float | None = None) -> None:
        if batch_size is not None:
            if batch_size < 1:
                raise ValueError(f"ack batch size must be at least 1, not {batch_size}")
            self.batch_size = batch_size
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"ack timeout can't be negative: {timeout}")
            self.timeout = timeout

    def add(self, topic: str, bookmark: str, option: str | None = None) -> None:
        """Queue one acknowledgement: none (processed), "cancel" or "expire"."""
        if option is not None:
            check_ack_option(option)
        key = (topic, option)
        with self._lock:
            bookmarks = self._pending.get(key)  # not setdefault: no list made an ack
            if bookmarks is None:
                self._pending[key] = [bookmark]
            else:
                bookmarks.append(bookmark)
            self._count += 1
            if self._count < self.batch_size:
                if self._count == 1:  # the first of a batch: the timer sends it in time
                    self._start_timer()
                return
            batches = self._take()
        self._send_all(batches)

    def flush(self) -> None:
        with self._changed:
            batches = self._take()
        self._send_all(batches)

    def close(self) -> None:
        """Send what waits, and stop the timer thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def _take(self) -> dict[tuple[str, str | None], list[str]]:
        batches, self._pending, self._count = self._pending, {}, 0
        return batches

    def _send_all(self, batches: dict[tuple[str, str | None], list[str]]) -> None:
        for (topic, option), bookmarks in batches.items():
            header: dict[str, Any] = {"c": "sow_delete", "t": topic, "bm": ",".join(bookmarks)}
            if option is not None:
                header["o"] = option
            self._send(header)

    def _start_timer(self) -> None:
        """Under the lock, at a batch's first ack: the timer thread sends a partial batch
        `timeout` after its first.

        The thread is woken only from an idle sleep. While acks keep coming it stays
        awake, looking every `timeout`, which costs less than a wake-up per batch."""
        self._first = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._timer, name="amps-acks", daemon=True)
            self._thread.start()
        elif self._idle:
            self._changed.notify_all()

    def _timer(self) -> None:
        with self._changed:
            while not self._closed:
                if not self._count:
                    if time.monotonic() - self._first < LINGER:
                        self._changed.wait(self.timeout)
                    else:
                        self._idle = True
                        self._changed.wait()
                        self._idle = False
                    continue
                remaining = self._first + self.timeout - time.monotonic()
                if remaining > 0:
                    self._changed.wait(remaining)
                    continue
                batches = self._take()
                self._changed.release()
                try:
                    self._send_all(batches)
                except AmpsError as exc:  # the connection is gone: nobody to send them to
                    log.warning("acks not sent: %s", exc)
                finally:
                    self._changed.acquire()


def check_ack_option(option: str | None) -> None:
    """Checked by the client, so message.ack() and client.ack() refuse alike, before sending."""
    if option not in OPTIONS:
        raise ValueError(f"ack option must be cancel or expire, not {option!r}")
