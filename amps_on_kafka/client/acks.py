"""Acknowledging queue messages, batched as AMPS clients batch them (seed 002).

`message.ack()` hands its header to an AckBatcher; one `sow_delete` carries the
bookmarks of many messages as a comma-separated list. A batch is sent when it holds
`batch_size` bookmarks, or `timeout` seconds after its first one, or on `flush()`.
Acks are sent without a command id: the gateway answers only failures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.native import core

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1  # every ack goes at once unless the application asks for batching
DEFAULT_TIMEOUT = 0.005  # seconds a partial batch waits for more bookmarks
MAX_BATCH_SIZE = 2**63  # what the compiled batcher counts to; a larger size is as good
OPTIONS = (None, "cancel", "expire")

Send = Callable[[dict[str, Any]], None]
Batches = dict[tuple[str, str | None], list[str]]  # the bookmarks to send, by topic and option
Due = Batches | bool | None  # what `add` asks of its caller: see PendingAcks.add


class PendingAcks:
    """The acks waiting to be sent, by (topic, option), and what the ack timer needs to
    know: the twin of the compiled `AckPending` (native/src/batches.rs), which
    `message.ack()` calls directly (tests/native/test_ack_pending.py holds the two
    alike). The compiled one needs no lock: each of its calls runs whole under the GIL."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.count = 0
        self._pending: Batches = {}
        self._first = 0.0  # when the batch waiting now began
        self._idle = True  # the timer sleeps until a batch begins (or is not started)
        self._closed = False
        self._lock = threading.Lock()

    def add(self, topic: str | None, meta: dict[str, Any], option: str | None) -> Due:
        """Queue the ack of a message with header (or `recs` entry) `meta`: nothing when it
        has no bookmark, topic or lease (a barrier message needs no ack). Returns None,
        True when a batch began while the timer sleeps until one does (wake it), or the
        batches to send when this ack filled one."""
        bookmark = meta.get("bm")
        if bookmark is None or topic is None or meta.get("lp") is None:
            return None
        check_ack_option(option)
        key = (topic, option)
        with self._lock:
            bookmarks = self._pending.get(key)
            if bookmarks is None:
                self._pending[key] = [bookmark]
            else:
                bookmarks.append(bookmark)
            self.count += 1
            if self.count >= self.batch_size:
                return self._take()
            if self.count == 1:
                self._first = time.monotonic()
                if self._idle and not self._closed:
                    self._idle = False
                    return True
            return None

    def take(self) -> Batches:
        """Everything pending, handed over."""
        with self._lock:
            return self._take()

    def due(self, timeout: float) -> Batches | float | None:
        """The timer's look: None once closed (the timer ends), the batches to send when
        the waiting one is `timeout` old, else the seconds to sleep (-1: until a batch
        begins; `add` then says to wake it)."""
        with self._lock:
            if self._closed:
                return None
            if not self.count:
                self._idle = True
                return -1.0
            left = timeout - (time.monotonic() - self._first)
            return left if left > 0 else self._take()

    def close(self) -> None:
        """No batch wakes the timer from now on; its next look ends it."""
        with self._lock:
            self._closed = True

    def _take(self) -> Batches:
        batches, self._pending, self.count = self._pending, {}, 0
        return batches


class AckBatcher:
    """A connection's batched acks: `message.ack()` calls `add` (the compiled
    AckPending's own method when the core is there: one C call an ack) and `settle` with
    what it returns, when anything.

    The timer thread sleeps on a plain lock (a C call), not a Condition: until the batch
    waiting is due, or, with none waiting, until `add` says one began. So an application
    that fills its batches wakes it about twice a batch, not every `timeout`."""

    def __init__(
        self, send: Send, batch_size: int = DEFAULT_BATCH_SIZE, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._send = send
        self.timeout = timeout
        self._pending = PendingAcks(batch_size) if core is None else core.AckPending(batch_size)
        self.add: Callable[[str | None, dict[str, Any], str | None], Due] = self._pending.add
        self._wake = threading.Lock()  # held but while the timer is to wake
        self._wake.acquire()
        self._thread: threading.Thread | None = None

    def configure(self, batch_size: int | None = None, timeout: float | None = None) -> None:
        if batch_size is not None:
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(
                    f"ack batch size must be a whole number of at least 1, not {batch_size!r}"
                )
            self._pending.batch_size = min(batch_size, MAX_BATCH_SIZE)
        if timeout is not None:
            if not timeout >= 0:  # NaN too: the timer's waits would fail on it
                raise ValueError(f"ack timeout must be seconds, at least 0, not {timeout!r}")
            self.timeout = timeout

    def settle(self, due: Batches | bool) -> None:
        """Do what `add` asked: send the batches it filled, or wake the timer (True)."""
        if due is True:
            if self._thread is None:
                self._thread = threading.Thread(target=self._timer, name="amps-acks", daemon=True)
                self._thread.start()
            else:
                self._wake.release()  # the timer sleeps on it until a batch begins
        else:
            self._send_all(due)  # type: ignore[arg-type]

    def flush(self) -> None:
        self._send_all(self._pending.take())

    def close(self) -> None:
        """Send what waits, and stop the timer thread."""
        self._pending.close()
        if self._thread is not None:
            with suppress(RuntimeError):  # released already: the timer is waking
                self._wake.release()
            self._thread.join()
        self.flush()

    def _send_all(self, batches: Batches) -> None:
        for (topic, option), bookmarks in batches.items():
            header: dict[str, Any] = {"c": "sow_delete", "t": topic, "bm": ",".join(bookmarks)}
            if option is not None:
                header["o"] = option
            self._send(header)

    def _timer(self) -> None:
        """Send a partial batch `timeout` after its first ack."""
        while True:
            due = self._pending.due(self.timeout)
            if due is None:
                return  # closed
            if type(due) is float:  # -1: until a batch begins
                self._wake.acquire(True, min(due, threading.TIMEOUT_MAX))
                continue
            try:
                self._send_all(due)
            except AmpsError as exc:  # the connection is gone: nobody to send them to
                log.warning("acks not sent: %s", exc)


def check_ack_option(option: str | None) -> None:
    """Checked by the client, so message.ack() and client.ack() refuse alike, before sending."""
    if option not in OPTIONS:
        raise ValueError(f"ack option must be cancel or expire, not {option!r}")
