"""From the engine's applied batches to subscriptions and sow_delete acks.

The gateway registers ONE listener on the engine. It runs on the worker's thread under
the engine lock, so it only numbers the batch and hands it to the event loop. There the
batch's command results complete waiting sow_delete acks at once, and its changes join
the fan-out backlog.

Filtering is not done on the loop: a legal filter (64 LIKE patterns, string functions)
takes a large fraction of a second on a record of a megabyte, and every other session,
heartbeats included, waited for it. One job at a time takes the backlog's oldest
batches (up to JOB_CHANGES changes) to the gateway's pool, where every subscription of
each batch's topic filters the changes and encodes its frames (RE2 releases the GIL
while it matches, and Python hands it back to the loop every switch interval); the loop
then writes each subscription's frames. Jobs run one after another, so every
subscription receives its changes in log order, as before.

Bound: the backlog (the batches waiting for or in a job) may hold MAX_BACKLOG_CHANGES
changes and MAX_BACKLOG_BYTES of records. At the end of a job that leaves more, and no
smaller than after the last such failure (the subscriptions
left are not catching up either), the subscription whose filtering took the longest in
that job is failed with a reason (a failure ack naming it), as a reader too slow for its
deliveries is disconnected: live changes can't wait for one subscriber.

A job takes at most JOB_BYTES of records (a larger batch goes in pieces), and its frames
are freed as they are written: each subscription encodes its own, so a job holds its
records' size once per subscription of their topic until the loop writes them (a worker
turn applies up to 5,000 records of any size, all one batch: with 8 subscriptions,
100 MB of them made 800 MB of frames at once before).

Batch numbers let sow_and_subscribe join its snapshot to the live stream exactly: see
Boundary.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from amps_on_kafka.processor.engine import QueryResult, SowEngine
from amps_on_kafka.processor.memory import release_freed_memory
from amps_on_kafka.state.events import BatchApplied, Change

if TYPE_CHECKING:
    from amps_on_kafka.server.deletes import DeleteTracker

log = logging.getLogger(__name__)

MAX_BACKLOG_CHANGES = 100_000
MAX_BACKLOG_BYTES = 64 * 1024 * 1024
JOB_CHANGES = 2_000  # changes one job takes: enough to spread a pool hop over many
# ... and bytes of records: every subscription's frames of a job are held at once until
# the loop writes them (each subscription encodes its own), so this bounds that copy
JOB_BYTES = 4 * 1024 * 1024
TRIM_AFTER_BYTES = 64 * 1024 * 1024  # frames made before the backlog emptied

Blocking = Callable[..., Awaitable[Any]]  # Gateway.blocking: work on the gateway's pool


class ChangeSink(Protocol):
    topic: str
    closed: bool

    def frames_for(self, changes: list[Change]) -> bytes:
        """The pool: the encoded frames these changes give this sink (maybe none)."""
        ...

    def on_frames(self, number: int, offered: int, frames: bytes) -> None:
        """The loop: batch `number` gave `frames` from `offered` changes of the topic."""
        ...

    def fail(self, reason: str) -> None:
        """The loop: end this sink, telling its client why."""
        ...


class Waiting(NamedTuple):
    """A batch in the backlog, with what it holds (BatchApplied.size); or a piece of one
    (its changes from `start`): a batch of more than JOB_BYTES goes in pieces."""

    number: int
    applied: BatchApplied
    changes: int  # 0: nothing to filter (no subscription when it came), only its turn
    held: int
    start: int = 0


# What a job found: each sink's frames per batch, in order; each sink's filtering time;
# the sinks whose frames could not be made (a bug), with the reason
Found = tuple[
    list[tuple[int, ChangeSink, int, bytes]], dict[ChangeSink, float], dict[ChangeSink, str]
]


class Fanout:
    def __init__(
        self,
        engine: SowEngine,
        loop: asyncio.AbstractEventLoop,
        deletes: DeleteTracker,
        blocking: Blocking,
    ) -> None:
        self.engine = engine
        self.deletes = deletes
        self.batches = 0  # batches numbered so far; written only under engine.lock
        # the batch numbered last, weakly: Boundary asks about it during its notify, and
        # holding it would keep a whole worker turn of records (old and new) alive
        self._last: weakref.ref[BatchApplied] | None = None
        self._loop = loop
        self._blocking = blocking
        self._sinks: dict[str, set[ChangeSink]] = defaultdict(set)
        self._backlog: deque[Waiting] = deque()
        self.backlog_changes = 0
        self.backlog_bytes = 0
        self._job: asyncio.Task[None] | None = None
        self.delivered = 0  # the last batch number whose frames are all written (the loop)
        self._failed_at: tuple[int, int] | None = None  # the backlog after the last failure

    # -- the worker's thread, under engine.lock ------------------------------------
    def listener(self, applied: BatchApplied) -> None:
        self.batches += 1
        self._last = weakref.ref(applied)
        with suppress(RuntimeError):  # the loop is closed: the gateway is stopping
            self._loop.call_soon_threadsafe(self._deliver, self.batches, applied)

    def number_of(self, applied: BatchApplied) -> int:
        """The number `applied` has, or gets when this listener runs after the caller."""
        last = self._last() if self._last is not None else None
        return self.batches if last is applied else self.batches + 1

    # -- the event loop ------------------------------------------------------------
    def add(self, sink: ChangeSink) -> None:
        self._sinks[sink.topic].add(sink)

    def remove(self, sink: ChangeSink) -> None:
        sinks = self._sinks.get(sink.topic)
        if sinks is not None:
            sinks.discard(sink)
            if not sinks:
                del self._sinks[sink.topic]

    def stop(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _deliver(self, number: int, applied: BatchApplied) -> None:
        if applied.results:
            self.deletes.apply(applied.results)
        # unread without a subscription, a blind batch stays unbuilt
        changes, held = applied.size() if self._sinks else (0, 0)
        if not changes and self._job is None:
            self.delivered = number
            return
        self._backlog.append(Waiting(number, applied, changes, held))
        self.backlog_changes += changes
        self.backlog_bytes += held
        if self._job is None:
            self._job = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        """Jobs one after another while the backlog holds batches; then, if they made
        TRIM_AFTER_BYTES of frames (every subscription's), the memory those took goes back
        to the system (`release_freed_memory`, on a thread: the worker's own trim came when
        its loop went idle, before these were written, and an idle worker does not trim
        again)."""
        made = 0
        try:
            while self._backlog:
                work = self._take()
                sinks = {topic: list(sinks) for topic, sinks in self._sinks.items()}
                found, costs, broken = await self._blocking(_filter, work, sinks)
                made += sum(len(frames) for _, _, _, frames in found)
                _write(found)
                for sink, reason in broken.items():
                    if not sink.closed:
                        sink.fail(reason)
                for done in work:
                    self.backlog_changes -= done.changes
                    self.backlog_bytes -= done.held
                last = work[-1].number  # all written, unless the rest of it is to come
                self.delivered = (
                    last - 1 if self._backlog and self._backlog[0].number == last else last
                )
                self._bound(costs)
            if made >= TRIM_AFTER_BYTES:
                self._loop.run_in_executor(None, release_freed_memory)
        finally:
            self._job = None

    def _take(self) -> list[Waiting]:
        """The oldest batches, up to JOB_CHANGES changes and JOB_BYTES (at least one)."""
        work: list[Waiting] = []
        taken = held = 0
        while self._backlog and (not work or self._fits(taken, held)):
            work.append(self._next_piece())
            taken += work[-1].changes
            held += work[-1].held
        return work

    def _next_piece(self) -> Waiting:
        """The backlog's oldest batch, or its first JOB_BYTES (about: the changes are
        counted off as if their records were of one size) if it holds more."""
        first = self._backlog[0]
        if first.held <= JOB_BYTES or first.changes <= 1:
            return self._backlog.popleft()
        count = max(1, first.changes * JOB_BYTES // first.held)
        held = first.held * count // first.changes
        piece = first._replace(changes=count, held=held)
        self._backlog[0] = first._replace(
            changes=first.changes - count, held=first.held - held, start=first.start + count
        )
        return piece

    def _fits(self, taken: int, held: int) -> bool:
        """Whether the backlog's next batch fits in a job that has these already."""
        following = self._backlog[0]
        return taken + following.changes <= JOB_CHANGES and held + following.held <= JOB_BYTES

    def _bound(self, costs: dict[ChangeSink, float]) -> None:
        """Over the backlog's bound: fail the subscription that cost the job the most."""
        backlog = (self.backlog_changes, self.backlog_bytes)
        if backlog[0] <= MAX_BACKLOG_CHANGES and backlog[1] <= MAX_BACKLOG_BYTES:
            self._failed_at = None
            return
        if self._failed_at is not None and (
            backlog[0] < self._failed_at[0] or backlog[1] < self._failed_at[1]
        ):
            return  # shrinking since the last failure: the others are catching up
        live = [(cost, sink) for sink, cost in costs.items() if not sink.closed]
        if not live:
            return
        cost, sink = max(live, key=lambda pair: pair[0])
        reason = (
            f"its filter can't keep up with the changes of {sink.topic} (it took {cost:.2f} s "
            f"of the gateway's last filtering job; more than {MAX_BACKLOG_CHANGES:,} changes or "
            f"{MAX_BACKLOG_BYTES >> 20} MiB wait for the gateway's subscriptions)"
        )
        log.warning("failing a subscription to %s: %s", sink.topic, reason)
        sink.fail(reason)
        self._failed_at = backlog


def _write(found: list[tuple[int, ChangeSink, int, bytes]]) -> None:
    """Each sink's frames, in order, each freed once written (the transport copies it):
    not all of a job's frames held until the last is written."""
    found.reverse()
    while found:
        number, sink, offered, frames = found.pop()
        if not sink.closed:
            sink.on_frames(number, offered, frames)


def _filter(work: list[Waiting], sinks: dict[str, list[ChangeSink]]) -> Found:
    """The pool: each batch's changes, by topic, through the sinks of their topic. A sink
    that raises is left out from then on, to be failed: the others still get theirs."""
    found: list[tuple[int, ChangeSink, int, bytes]] = []
    costs: dict[ChangeSink, float] = defaultdict(float)
    broken: dict[ChangeSink, str] = {}
    for number, applied, count, _, start in work:
        by_topic: dict[str, list[Change]] = defaultdict(list)
        for change in applied.changes[start : start + count] if count else ():
            if change.topic in sinks:
                by_topic[change.topic].append(change)
        for topic, changes in by_topic.items():
            for sink in sinks[topic]:
                if sink.closed or sink in broken:
                    continue
                started = time.perf_counter()
                try:
                    frames = sink.frames_for(changes)
                except Exception as exc:  # a bug: this subscription ends, the gateway goes on
                    log.exception("a subscription to %s failed on batch %d", topic, number)
                    broken[sink] = f"its changes could not be delivered: {exc!r}"
                    continue
                costs[sink] += time.perf_counter() - started
                found.append((number, sink, len(changes), frames))
    return found, costs, broken


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
