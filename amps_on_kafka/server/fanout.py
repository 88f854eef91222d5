"""From the engine's applied batches to subscriptions and sow_delete acks.

The gateway registers ONE listener on the engine. It runs on the worker's thread under
the engine lock, so it only numbers the batch and hands it to the event loop; there the
batch is split by topic and offered to each SOW subscription of that topic, and its
command results complete waiting sow_delete acks.

Batch numbers let sow_and_subscribe join its snapshot to the live stream exactly: see
Boundary.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Protocol

from amps_on_kafka.processor.engine import QueryResult, SowEngine
from amps_on_kafka.state.events import BatchApplied, Change

if TYPE_CHECKING:
    from amps_on_kafka.server.publishing import DeleteTracker


class ChangeSink(Protocol):
    topic: str

    def on_changes(self, number: int, changes: list[Change]) -> None: ...


class Fanout:
    def __init__(
        self, engine: SowEngine, loop: asyncio.AbstractEventLoop, deletes: DeleteTracker
    ) -> None:
        self.engine = engine
        self.deletes = deletes
        self.batches = 0  # batches numbered so far; written only under engine.lock
        self._last: BatchApplied | None = None
        self._loop = loop
        self._sinks: dict[str, set[ChangeSink]] = defaultdict(set)

    # -- the worker's thread, under engine.lock ------------------------------------
    def listener(self, applied: BatchApplied) -> None:
        self.batches += 1
        self._last = applied
        with suppress(RuntimeError):  # the loop is closed: the gateway is stopping
            self._loop.call_soon_threadsafe(self._deliver, self.batches, applied)

    def number_of(self, applied: BatchApplied) -> int:
        """The number `applied` has, or gets when this listener runs after the caller."""
        return self.batches if self._last is applied else self.batches + 1

    # -- the event loop ------------------------------------------------------------
    def add(self, sink: ChangeSink) -> None:
        self._sinks[sink.topic].add(sink)

    def remove(self, sink: ChangeSink) -> None:
        sinks = self._sinks.get(sink.topic)
        if sinks is not None:
            sinks.discard(sink)
            if not sinks:
                del self._sinks[sink.topic]

    def _deliver(self, number: int, applied: BatchApplied) -> None:
        if applied.results:
            self.deletes.apply(applied.results)
        if not self._sinks or not applied.changes:  # unread, a blind batch stays unbuilt
            return
        by_topic: dict[str, list[Change]] = defaultdict(list)
        for change in applied.changes:
            by_topic[change.topic].append(change)
        for topic, changes in by_topic.items():
            for sink in list(self._sinks.get(topic, ())):
                sink.on_changes(number, changes)


class Boundary:
    """Where a sow_and_subscribe's snapshot falls in the numbered stream of batches.

    `engine.query(listener=self)` adds this one-shot listener in the same moment the
    snapshot is taken, so the first batch it sees is the first one the snapshot lacks;
    if none came by the end of the query, the first is whichever comes next. Both are
    decided under the engine lock, where batches are numbered: batches numbered below
    `first` are in the snapshot, the others must be delivered live.
    """

    def __init__(self, fanout: Fanout) -> None:
        self.fanout = fanout
        self.first: int | None = None

    def __call__(self, applied: BatchApplied) -> None:
        if self.first is None:
            self.first = self.fanout.number_of(applied)
        self.fanout.engine.remove_listener(self)

    def query(self, topic: str, **kwargs: Any) -> QueryResult:
        engine = self.fanout.engine
        try:
            return engine.query(topic, listener=self, **kwargs)
        finally:
            with engine.lock:
                engine.remove_listener(self)
                if self.first is None:
                    self.first = self.fanout.batches + 1
