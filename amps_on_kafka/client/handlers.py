"""Message handlers: a stream delivered to a callback on a client thread (AMPS's style).

`client.subscribe(topic, on_message=handle)` and `client.execute_async(command, handle)`
open the same stream an iterator would get and hand it to a `Dispatcher`: one daemon
thread per handled stream calls `handle(message)` for each message in order. A handler
that raises is logged (logger `amps_on_kafka.client.handlers`, with the traceback) and
delivery goes on with the next message. The thread ends when the stream ends (a query's
last record, `timeout=` idle seconds, the connection lost), on
`client.unsubscribe(sub_id)` or on `client.close()`.

The thread reads its stream with `next(timeout=TICK_INTERVAL)`, so a stop request is
seen within a tick even in a quiet log, and the stream is closed by the thread that
reads it (a kafka:// replay's consumer is never closed under a poll in progress).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

from amps_on_kafka.client.stream import TICK_INTERVAL, MessageStream
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.message import Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], object]
STOP_TIMEOUT = 10.0  # seconds unsubscribe/close wait for a handler thread to finish


class _Runner:
    """One handled stream and the thread that delivers it."""

    def __init__(
        self, owner: Dispatcher, key: str, stream: MessageStream, handler: Handler
    ) -> None:
        self.key = key
        self.stream = stream
        self.handler = handler
        self.stop = threading.Event()
        self._owner = owner
        self.thread = threading.Thread(target=self._run, name=f"amps-handler-{key}", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    message = self.stream.next(timeout=TICK_INTERVAL)
                except StopIteration:
                    return
                except AmpsError as exc:
                    log.error("subscription %s ended: %s", self.key, exc)
                    return
                if message is not None:
                    self._call(message)
        finally:
            self.stream.close()
            self._owner.forget(self)

    def _call(self, message: Message) -> None:
        try:
            self.handler(message)
        except Exception:
            log.exception("message handler of %s failed on %r; delivery goes on", self.key, message)


class Dispatcher:
    """A client's handled streams, by sub_id (or a generated command id)."""

    def __init__(self) -> None:
        self._runners: dict[str, _Runner] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def new_id(self) -> str:
        """A command id for a command that has no sub_id (a query, a publish)."""
        return f"cmd-{next(self._ids)}"

    def start(self, stream: MessageStream, handler: Handler) -> str:
        """Deliver the stream to `handler` on a new thread; returns its sub_id."""
        key = stream.sub_id or self.new_id()
        runner = _Runner(self, key, stream, handler)
        with self._lock:
            if key in self._runners:
                stream.close()
                raise ValueError(f"a handler already receives {key!r}; pass another sub_id=")
            self._runners[key] = runner
        runner.thread.start()
        return key

    def stop(self, key: str = "all") -> bool:
        """Stop delivering `key` (or every stream) and wait for the threads to finish; a
        handler may stop its own stream (it ends after the handler returns). False if
        no handler received `key`."""
        with self._lock:
            found = self._runners.values() if key == "all" else [self._runners.get(key)]
            runners = [runner for runner in found if runner is not None]
        for runner in runners:
            runner.stop.set()
        for runner in runners:
            if runner.thread is not threading.current_thread():
                runner.thread.join(STOP_TIMEOUT)
        return bool(runners)

    def forget(self, runner: _Runner) -> None:
        with self._lock:
            if self._runners.get(runner.key) is runner:
                del self._runners[runner.key]

    def __contains__(self, key: str) -> bool:
        return key in self._runners
