"""publish, delta_publish, sow_delete and flush: commands that go to the log.

Every command is written by LogPublisher, the same code path as the `kafka://` client,
so validation (bad JSON, a missing key field) happens there, before Kafka, and becomes a
failure ack. Each session has its own LogPublisher, because the publisher id stamped on
every record is the client's logon name.

Sequence numbers are the client's (`s`, as AMPS clients number their publishes), so the
log carries them and a republished message keeps its number; without `s` the session's
publisher numbers the command.

Acks:
- `persisted` only from Kafka's delivery report (acks=all). librdkafka runs delivery
  callbacks inside poll/flush only, so one DeliveryPump thread serves every session's
  publisher and hands the outcomes to the event loop in batches.
- a sow_delete's `processed` ack waits for the worker to apply every record it wrote
  (one per partition for a filter, one per key) and sums what they deleted.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import AmpsError, PublishError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.publisher import LogPublisher, Persisted
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import Request, count, number, sow_keys, text
from amps_on_kafka.state.events import CommandResult

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

Outcome = Callable[[PublishError | None], None]  # runs on the loop with Kafka's verdict

IDLE_WAIT = 0.1  # seconds the pump sleeps when no publisher has anything in flight
SERVE_SLICE = 0.02  # seconds spent serving one publisher's reports before the next


class DeliveryPump:
    """Runs Kafka delivery callbacks for the sessions' publishers, off the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._publishers: list[LogPublisher] = []
        self._outcomes: deque[tuple[Outcome, PublishError | None]] = deque()
        self._posted = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="amps-gateway-deliveries", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def add(self, publisher: LogPublisher) -> None:
        self._publishers = [*self._publishers, publisher]

    def remove(self, publisher: LogPublisher) -> None:
        self._publishers = [p for p in self._publishers if p is not publisher]

    def produced(self) -> None:
        """A publisher has something in flight: wake the pump if it sleeps."""
        if not self._wake.is_set():  # Event.set costs a lock and a notify: once per wake-up
            self._wake.set()

    def callback(self, handler: Outcome) -> Persisted:
        """An on_persisted callback that runs `handler` on the event loop."""

        def persisted(error: PublishError | None, _message: object) -> None:
            self._outcomes.append((handler, error))
            if not self._posted:  # one loop wake-up per burst of reports
                self._posted = True
                with suppress(RuntimeError):  # the loop is closed: the gateway stopped
                    self._loop.call_soon_threadsafe(self._drain)

        return persisted

    def _drain(self) -> None:
        self._posted = False
        outcomes = self._outcomes
        while outcomes:
            handler, error = outcomes.popleft()
            handler(error)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            busy = [p for p in self._publishers if p.pending()]
            if not busy:
                self._wake.wait(IDLE_WAIT)
            for publisher in busy:
                publisher.poll(SERVE_SLICE)  # failures reach sessions through on_persisted


@dataclass(eq=False)
class PendingWrite:
    """One command on its way to the log: it is persisted when all its records are."""

    writes: Writes
    request: Request
    ticket: int
    remaining: int = 0
    error: PublishError | None = None

    def persisted(self, error: PublishError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.remaining -= 1
        if self.remaining == 0:
            self.writes.finish(self)


class Writes:
    """One session's LogPublisher, its commands in flight, and the flushes waiting on them."""

    def __init__(self, session: Session, publisher: LogPublisher) -> None:
        self.session = session
        self.publisher = publisher
        self.pump = session.gateway.pump
        self._issued = itertools.count()
        self._last_ticket = -1
        self._inflight: dict[int, PendingWrite] = {}  # in ticket order
        self._flushes: list[tuple[int, asyncio.Future[None]]] = []
        self._known: set[str] = set()

    async def spec(self, topic: str) -> TopicSpec:
        """The topic's spec; the first lookup reads Kafka, so it runs off the loop."""
        if topic not in self._known:
            await self.session.gateway.blocking(self.publisher.spec, topic)
            self._known.add(topic)
        return self.publisher.spec(topic)

    def begin(self, request: Request) -> PendingWrite:
        self._last_ticket = next(self._issued)
        pending = PendingWrite(self, request, self._last_ticket)
        self._inflight[pending.ticket] = pending
        return pending

    def written(self, pending: PendingWrite, records: int) -> None:
        """The publisher produced `records` records for this command."""
        pending.remaining += records
        if records:
            self.pump.produced()
        else:
            self.finish(pending)

    def abandon(self, pending: PendingWrite) -> None:
        """The publisher refused the command: nothing will be reported for it."""
        self._inflight.pop(pending.ticket, None)
        self._release_flushes()

    def finish(self, pending: PendingWrite) -> None:
        self._inflight.pop(pending.ticket, None)
        header = pending.request.header
        if pending.error is not None:
            self.session.send(ack(header, "persisted", pending.error.reason))
        elif pending.request.wants("persisted"):
            self.session.send(ack(header, "persisted"))
        self._release_flushes()

    async def flushed(self) -> None:
        """Wait until every command issued so far is persisted (or failed)."""
        future = asyncio.get_running_loop().create_future()
        self._flushes.append((self._last_ticket, future))
        self._release_flushes()
        await future

    def _release_flushes(self) -> None:
        if not self._flushes:
            return
        oldest = next(iter(self._inflight), None)
        waiting = []
        for target, future in self._flushes:
            if oldest is None or oldest > target:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((target, future))
        self._flushes = waiting


def publish_data(spec: TopicSpec, payload: bytes) -> Any:
    """The wire carries JSON: an Avro topic's publisher encodes the decoded document."""
    return JSON.decode(payload) if spec.message_type == "avro" else payload


async def publish(session: Session, request: Request) -> None:
    """publish and delta_publish."""
    header = request.header
    topic = text(header, "t", required=True)
    writes = session.writes
    data = publish_data(await writes.spec(topic), request.payload)
    pending = writes.begin(request)
    try:
        writes.publisher.publish(
            topic,
            data,
            expiration=number(header, "e"),
            command=Command(header["c"]),
            sow_key=text(header, "k"),
            correlation_id=text(header, "x"),
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except AmpsError:
        writes.abandon(pending)
        raise
    writes.written(pending, 1)
    if request.wants("processed"):
        session.send(ack(header, "processed"))


async def sow_delete(session: Session, request: Request) -> None:
    """By filter `f`, by SOW keys `k`, or by the data in the payload.

    With `s`, the records written are numbered s, s+1, ... (one per partition for a
    filter, one per key): the client reserves that many sequence numbers.
    """
    header = request.header
    topic = text(header, "t", required=True)
    session.gateway.engine.sow_config(topic)  # only this worker's SOW topics can be counted
    filter_text = text(header, "f")
    if filter_text is not None:
        compile_filter(filter_text)  # a bad filter is refused with its position
    writes = session.writes
    spec = await writes.spec(topic)
    data = publish_data(spec, request.payload) if request.payload else None
    pending = writes.begin(request)
    try:
        sequences = writes.publisher.sow_delete(
            topic,
            filter=filter_text,
            keys=sow_keys(header),
            data=data,
            correlation_id=text(header, "x"),
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except AmpsError:
        writes.abandon(pending)
        raise
    writes.written(pending, len(sequences))
    session.gateway.deletes.expect(session, request, writes.publisher.publisher_id, sequences)


async def flush(session: Session, request: Request) -> None:
    """Answered with a processed ack once everything published before it is persisted."""
    session.spawn(_flush(session, request), request)


async def _flush(session: Session, request: Request) -> None:
    await session.writes.flushed()
    session.send(ack(request.header, "processed"))


@dataclass(eq=False)
class _Delete:
    session: Session
    request: Request
    remaining: int
    deleted: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, result: CommandResult) -> None:
        self.deleted += result.deleted
        if result.error is not None:
            self.errors.append(result.error)
        self.remaining -= 1
        if self.remaining == 0:
            self.done()

    def done(self) -> None:
        reason = "; ".join(self.errors) or None
        if reason or self.request.wants("processed"):
            self.session.send(ack(self.request.header, "processed", reason, matches=self.deleted))


class DeleteTracker:
    """Matches the worker's results of sow_delete records to the commands that wrote them.

    Keyed by (publisher id, sequence), which LogPublisher stamps on every record. Lives on
    the event loop; the engine's results reach it through the gateway's listener.
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], _Delete] = {}

    def expect(
        self, session: Session, request: Request, publisher_id: str, sequences: list[int]
    ) -> None:
        entry = _Delete(session, request, len(sequences))
        if not sequences:
            entry.done()
        for sequence in sequences:
            self._waiting[(publisher_id, sequence)] = entry

    def apply(self, results: list[CommandResult]) -> None:
        for result in results:
            if result.publisher_id is None or result.sequence is None:
                continue
            entry = self._waiting.pop((result.publisher_id, result.sequence), None)
            if entry is not None:
                entry.add(result)

    def forget(self, session: Session) -> None:
        self._waiting = {k: e for k, e in self._waiting.items() if e.session is not session}
