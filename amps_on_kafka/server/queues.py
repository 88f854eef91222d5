"""Queue commands at the gateway (docs/queues.md), served by the worker's QueueEngine.

The commands are AMPS's own, on a queue topic:
- `subscribe` to a queue name or a regular expression over queue names, with options
  `max_backlog=N`: messages are pushed as `publish` with `bm` (the bookmark to ack) and
  `lp` (the lease left, in ms; absent on a barrier message). A subscribe with a bookmark
  is a replay of the underlying topics, as in AMPS.
- `sow_delete` with `bm` (one bookmark or a comma-separated list) acknowledges; with
  option `cancel` or `expire` it returns or expires instead; with `f` it acknowledges
  every active message that matches. The processed ack (`matches`: how many) is sent
  once the acks are durable in the queue-events topic.
- `sow` returns the queue's active messages, in delivery order.
- `publish` to a queue's name is written to its DefaultPublishTarget (seed 001).

Deliveries come from the engine's threads; they are queued here and sent from the event
loop in bursts, in order. A subscription with option `batch` gets each burst of its
deliveries from one queue as one frame (`recs`, as a sow frame; docs/protocol.md): one
header to encode and decode for many messages, and one hand-off in the client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import replace
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import orjson

from amps_on_kafka.errors import AmpsError, UnknownTopic
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import QueryResult
from amps_on_kafka.processor.queues import (
    AckCommand,
    QueueEngine,
    QueueMessage,
    QueueSubscription,
    _message,
)
from amps_on_kafka.protocol.frames import encode_frame, frame_of
from amps_on_kafka.server.queries import DEFAULT_BATCH, Query, send_snapshot
from amps_on_kafka.server.queue_links import QueueLinks, moving
from amps_on_kafka.server.replies import ack, converted, wire_payload
from amps_on_kafka.server.requests import (
    MAX_BATCH,
    ProtocolError,
    Request,
    compiled_filter,
    count,
    text,
    words,
)
from amps_on_kafka.server.subscriptions import subscribe as log_subscribe
from amps_on_kafka.server.subscriptions import subscription_id
from amps_on_kafka.state.queue_types import AckResult, Delivery, QueueEntry
from amps_on_kafka.state.record import SowRecord

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

log = logging.getLogger(__name__)
Handler = Callable[["Session", Request], Awaitable[None]]
ACK_OPTIONS = ("cancel", "expire")
# A batched delivery frame closes once it holds this many messages or payload bytes (a
# later delivery of the burst opens the next one): at most that plus one message.
BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20


class DeliveryBatch:
    """Deliveries of one burst to one batched subscription from one queue: one frame.
    Each message's `recs` entry is held as its JSON (written from the delivery by
    `write_recs`), and the header is joined around them as orjson writes the dict
    {"c", "sub_id", "t", "recs"}."""

    __slots__ = ("head", "payloads", "recs", "size")

    def __init__(self, sub_id: str, queue: str) -> None:
        self.recs: list[bytes] = []
        self.head = orjson.dumps({"c": "publish", "sub_id": sub_id, "t": queue})[:-1] + b',"recs":['
        self.payloads: list[bytes] = []
        self.size = 0

    def add_run(self, recs: list[bytes], payloads: list[bytes], at: int, size: int) -> int:
        """Add `recs[at:]` (each entry with its `n`; `payloads[at:]`, `size` bytes in all)
        up to the message that makes the batch `full`, in two list extends: the index
        after the last one added. The batch is then full, or holds the whole run."""
        end = min(len(recs), at + BATCH_RECORDS - len(self.recs))
        if self.size + size >= BATCH_BYTES:  # the bytes may close it first: where?
            ends = list(accumulate(map(len, payloads[at:end]), initial=self.size))
            end = min(end, at + bisect_left(ends, BATCH_BYTES, 1))
            self.size = ends[end - at]
        else:
            self.size += size if end == len(recs) else sum(map(len, payloads[at:end]))
        self.recs.extend(recs[at:end])
        self.payloads.extend(payloads[at:end])
        return end

    @property
    def full(self) -> bool:
        """Whether the batch is closed: it holds BATCH_RECORDS messages or their
        payloads reach BATCH_BYTES (the next message opens another)."""
        return len(self.recs) >= BATCH_RECORDS or self.size >= BATCH_BYTES

    def encode(self) -> bytes:
        header = b"".join((self.head, b",".join(self.recs), b"]}"))
        return frame_of(header, b"".join(self.payloads))


class QueueService:
    """The gateway's view of the queue engine, and the outbox of its deliveries."""

    def __init__(self, engine: QueueEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self._outbox: deque[tuple[Session, bytes | DeliveryBatch]] = deque()
        self._open: dict[tuple[QueueSubscriber, str], DeliveryBatch] = {}  # batches not sent
        self._outbox_lock = threading.Lock()  # engine threads post, the event loop drains
        self._posted = False
        self._acks: list[AckCommand] = []  # acks nobody waits for, applied together
        self._served: dict[str, bool] = {}
        self.links: QueueLinks | None = None  # set by the gateway: to the other owners
        self._subscribers: set[QueueSubscriber] = set()
        engine.on_ownership(self._moved)

    def _moved(self, name: str) -> None:
        """Election thread: a queue came here or left; subscriptions to one that left end
        with retry: (their clients subscribe again, at its new owner)."""
        if name in self.engine.runtimes:
            return
        with suppress(RuntimeError):  # the loop is closed: the gateway is stopping
            self._loop.call_soon_threadsafe(self._end_subscriptions, name)

    def _end_subscriptions(self, name: str) -> None:
        for sub in [s for s in self._subscribers if s.handle and name in s.handle.queues]:
            sub.session.fail(
                {"sub_id": sub.sub_id, "t": name},
                f"retry: queue moving ({name} moved to another worker)",
            )
            sub.session.remove_subscription(sub.sub_id)

    def forget(self, session: Session) -> None:
        if self.links is not None:
            self.links.forget(session)

    def serves(self, topic: object) -> bool:
        """Whether `topic` names a queue (or, as a regular expression, some queues)."""
        if not isinstance(topic, str):
            return False
        served = self._served.get(topic)
        if served is None:
            served = self._served[topic] = self.engine.serves(topic)
        return served

    async def forward(self, session: Session, request: Request) -> None:
        """A command for a queue another worker owns (server/queue_links.py)."""
        names = self.names(request.header["t"])
        if self.links is None:
            raise moving(names, "not served here now")
        await self.links.forward(session, request, names)

    def names(self, topic: str) -> list[str]:
        """The queues a topic that `serves` names: itself, or those its regex matches."""
        return self.engine.queue_names(topic)

    def post(self, session: Session, header: dict[str, Any], payload: bytes) -> None:
        """Any thread: send a frame from the event loop, in order. Frames posted together
        go out together: one write per connection per burst."""
        frame = encode_frame(header, payload)
        with self._outbox_lock:
            self._outbox.append((session, frame))
        self._wake()

    def post_batched(
        self,
        sub: QueueSubscriber,
        queue: str,
        recs: list[bytes],
        payloads: list[bytes],
        size: int,
    ) -> None:
        """Any thread: a burst of deliveries (recs entries as JSON, payloads of
        `size` bytes in all) to a batched subscription joins its open batch from `queue`,
        sent in order with the other frames of the burst: one lock and one wake-up for
        the burst, and two list extends for each batch the burst joins (a full one
        closes on the way), not a call a message."""
        if not recs:  # every message of the burst failed: no frame
            return
        key, at, count = (sub, queue), 0, len(recs)
        with self._outbox_lock:
            while at < count:
                batch = self._open_batch(key)
                held = batch.size
                at = batch.add_run(recs, payloads, at, size)
                size -= batch.size - held  # the bytes of payloads[at:]
                if batch.full:
                    del self._open[key]  # the next message opens another
        self._wake()

    def _open_batch(self, key: tuple[QueueSubscriber, str]) -> DeliveryBatch:
        """Under the outbox lock: the open batch of (subscription, queue), or a new one
        queued behind the frames already in the outbox."""
        batch = self._open.get(key)
        if batch is None:
            sub, queue = key
            batch = self._open[key] = DeliveryBatch(sub.sub_id, queue)
            self._outbox.append((sub.session, batch))
        return batch

    def defer_ack(self, command: AckCommand) -> None:
        """Event loop: an ack nobody waits for is applied with the others that arrive in
        this turn of the loop, from any connection (QueueEngine.ack_many): under load
        they come several a turn, and share one state change, events record and wait."""
        self._acks.append(command)
        if len(self._acks) == 1:
            self._loop.call_soon(self._apply_and_send)

    def _apply_and_send(self) -> None:
        """Event loop, at the end of the turn: apply the deferred acks, then send the
        deliveries they freed room for now, not one more turn of the loop later (that
        turn's poll of the sockets cost more than the drain)."""
        self.apply_acks()
        if self._posted:
            self._drain()

    def apply_acks(self) -> None:
        """Event loop: apply the deferred acks now. Every other queue command calls this
        first, so it sees the acks its connection sent before it."""
        acks, self._acks = self._acks, []
        if acks:
            self.engine.ack_many(acks)

    def _wake(self) -> None:
        if self._posted:
            return
        self._posted = True
        if asyncio._get_running_loop() is self._loop:
            self._loop.call_soon(self._drain)  # at the end of this command: no thread hop
            return
        with suppress(RuntimeError):  # the loop is closed: the gateway is stopping
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._posted = False
        with self._outbox_lock:
            outbox, self._outbox = self._outbox, deque()
            self._open.clear()
        while outbox:
            session, frame = outbox.popleft()
            frames = [_encoded(frame)]
            while outbox and outbox[0][0] is session:
                frames.append(_encoded(outbox.popleft()[1]))
            session.send_encoded(b"".join(frames), len(frames))


def _encoded(frame: bytes | DeliveryBatch) -> bytes:
    return frame if isinstance(frame, bytes) else frame.encode()


def routed(regular: Handler, queued: Handler) -> Handler:
    """A command handler that serves queue topics with `queued`, the others as before."""

    async def handle(session: Session, request: Request) -> None:
        service = session.gateway.queues
        if service is not None and service.serves(request.header.get("t")):
            if not _deferred(request):  # in order: what this connection acked comes first
                service.apply_acks()
            if needs_owner(request) and not service.engine.owns(request.header["t"]):
                await service.forward(session, request)
            else:
                await queued(session, request)
        else:
            _refuse_queue_only(request)
            await regular(session, request)

    return handle


def _deferred(request: Request) -> bool:
    """An ack nobody waits for (sow_delete with bookmarks, no processed ack asked): the
    gateway applies it with the others of the loop's turn (QueueService.defer_ack)."""
    header = request.header
    return (
        header.get("c") == "sow_delete"
        and header.get("bm") is not None
        and not request.wants("processed")
    )


def needs_owner(request: Request) -> bool:
    """Whether the queue's owner must answer: a publish goes to the underlying topic, and
    a subscription with a bookmark replays it, from any worker."""
    header = request.header
    command = header.get("c")
    if command == "subscribe":
        return header.get("bm") is None
    return command in ("sow", "sow_delete")


def _refuse_queue_only(request: Request) -> None:
    """An ack (sow_delete with `bm`) is for a queue only: on any other topic, say that the
    queue does not exist, not that the name is not a SOW topic (defect 13)."""
    header = request.header
    if header.get("c") == "sow_delete" and header.get("bm") is not None:
        raise UnknownTopic(
            f"no queue {header.get('t')!r} on this worker: an ack (sow_delete with bm) "
            "needs a queue"
        )


class QueueSubscriber:
    """One queue subscription of a connection; closing it breaks its leases."""

    def __init__(self, session: Session, sub_id: str, batched: bool = False) -> None:
        self.session = session
        self.sub_id = sub_id
        self.batched = batched  # option `batch`: a burst of deliveries in one frame
        self.closed = False
        self.handle: QueueSubscription | None = None
        self._service: QueueService = session.gateway.queues  # type: ignore[assignment]

    def deliver_burst(self, queue: str, deliveries: list[Delivery], now: int) -> None:
        """Engine threads, under the engine lock: a batched subscription's burst of
        deliveries from one queue (QueueEngine.subscribe with `burst`), leased at `now`,
        to the event loop, as `recs` entries and payloads (`burst_records`)."""
        recs, payloads, size = burst_records(queue, self.sub_id, deliveries, now)
        self._service.post_batched(self, queue, recs, payloads, size)

    def deliver(self, message: QueueMessage) -> None:
        """Engine threads, under the engine lock: hand the message to the event loop."""
        payload = wire_payload(message.codec, message.payload, message)  # type: ignore[arg-type]
        header: dict[str, Any] = {
            "c": "publish",
            "sub_id": self.sub_id,
            "t": message.queue,
            "bm": message.bookmark,
            "ts": message.timestamp,
        }
        if message.lease_ms is not None:
            header["lp"] = message.lease_ms
        self._service.post(self.session, header, payload)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._service._subscribers.discard(self)
            self._service.apply_acks()  # its acks count before its leases break
            if self.handle is not None:
                self._service.engine.unsubscribe(self.handle)


def burst_records(
    queue: str, sub_id: str, deliveries: list[Delivery], now: int, write: WriteRecs | None = None
) -> tuple[list[bytes], list[bytes], int]:
    """A burst's `recs` entries (JSON), payloads and their bytes. The entries are written
    straight from the deliveries (`write`: `write_recs` unless given) while the codec is
    one whose payloads go out as stored; a message whose codec converts (Avro as JSON),
    or that `write` leaves, is made here, as one at a time, and one that can't be sent
    is its own failure (logged, left out)."""
    write = write or write_recs
    recs: list[bytes] = []
    payloads: list[bytes] = []
    at, size, count = 0, 0, len(deliveries)
    plain = None  # the last codec whose payloads go out as stored (None's do)
    while at < count:
        at, size = write(deliveries, at, now, plain, recs, payloads, size)
        if at == count:
            break
        delivery = deliveries[at]
        at += 1
        until = delivery.lease_until
        message = _message(queue, sub_id, delivery.entry, None if until is None else until - now)
        codec = message.codec
        try:
            payload = wire_payload(codec, message.payload, message)  # type: ignore[arg-type]
        except Exception:
            log.exception("queue %s: delivering to %s failed", queue, sub_id)
            continue
        if not converted(codec):
            plain = codec
        recs.append(_rec(message.bookmark, message.timestamp, message.lease_ms, len(payload)))
        payloads.append(payload)
        size += len(payload)
    return recs, payloads, size


def _rec(bookmark: str, timestamp: int, lease_ms: int | None, n: int) -> bytes:
    """A message's entry in a batched frame's `recs` (docs/protocol.md)."""
    if lease_ms is None:
        return orjson.dumps({"bm": bookmark, "ts": timestamp, "n": n})
    return orjson.dumps({"bm": bookmark, "ts": timestamp, "lp": lease_ms, "n": n})


def _write_recs_twin(
    deliveries: list[Delivery],
    at: int,
    now: int,
    plain: object,
    recs: list[bytes],
    payloads: list[bytes],
    size: int,
) -> tuple[int, int]:
    """write_recs in Python: from `deliveries[at]` on, while a delivery's codec is None or
    `plain` (payloads sent as stored), its `recs` entry and payload appended; (the index
    of the first other one, or the end; `size` plus the payloads' bytes)."""
    count = len(deliveries)
    while at < count:
        delivery = deliveries[at]
        entry = delivery.entry
        codec = entry.codec
        if codec is not None and codec is not plain:
            break
        until, payload = delivery.lease_until, entry.payload
        lease = None if until is None else until - now
        recs.append(_rec(entry.bookmark, entry.timestamp, lease, len(payload)))
        payloads.append(payload)
        size += len(payload)
        at += 1
    return at, size


# The compiled core writes each entry's JSON from the delivery's and entry's slots (no
# QueueMessage, no dict: native/src/queue_messages.rs); it also stops, for the caller to
# make that message itself, at a delivery of another shape.
WriteRecs = Callable[
    [list[Delivery], int, int, object, list[bytes], list[bytes], int], tuple[int, int]
]
write_recs: WriteRecs = (
    core.BurstWriter(Delivery, QueueEntry).write if core is not None else _write_recs_twin
)


def _engine(session: Session) -> QueueEngine:
    return session.gateway.queues.engine  # type: ignore[union-attr]


async def subscribe(session: Session, request: Request) -> None:
    header = request.header
    if text(header, "bm") is not None:  # a bookmark subscription replays the underlying log
        await _replay_underlying(session, request)
        return
    pattern = text(header, "t", required=True)
    await compiled_filter(session, header)  # a bad filter is refused with its position
    if session.closed:  # while the filter compiled: a subscription now would never be closed
        return
    max_backlog, batched = _queue_options(header)
    sub = QueueSubscriber(session, subscription_id(header), batched)
    session.add_subscription(sub)
    session.gateway.queues._subscribers.add(sub)  # type: ignore[union-attr]
    try:
        sub.handle = _engine(session).subscribe(
            pattern,  # type: ignore[arg-type]
            sub.deliver_burst if batched else sub.deliver,
            session=session,
            sub_id=sub.sub_id,
            filter=text(header, "f"),
            max_backlog=max_backlog,
            burst=batched,
        )
    except BaseException:
        session.remove_subscription(sub.sub_id)
        raise
    if request.wants("processed"):
        session.send(ack(header, "processed", max_backlog=sub.handle.max_backlog))


async def _replay_underlying(session: Session, request: Request) -> None:
    queue = _engine(session).config.queue(request.header["t"])
    topic = queue.topic_pattern if queue is not None else request.header["t"]
    await log_subscribe(session, replace(request, header={**request.header, "t": topic}))


def _queue_options(header: dict[str, Any]) -> tuple[int | None, bool]:
    """`o` holds AMPS's `max_backlog=N`, and `batch` (this gateway's own: deliveries in
    batched frames); no other option applies to a queue."""
    backlog, batched = None, False
    for word in words(header, "o"):
        name, _, value = word.partition("=")
        if word == "batch":
            batched = True
        elif name == "max_backlog" and value.isdigit():
            backlog = int(value)
        else:
            raise ProtocolError(
                f"option {word!r} is not supported on a queue (max_backlog=N, batch)"
            )
    return backlog, batched


async def sow_delete(session: Session, request: Request) -> None:
    """An acknowledgement: by bookmarks (`bm`), or by filter (`f`)."""
    header = request.header
    queue = text(header, "t", required=True)
    bookmarks, filter_text = text(header, "bm"), text(header, "f")
    option = _ack_option(header)
    if (bookmarks is None) == (filter_text is None):
        raise ProtocolError("sow_delete on a queue takes bookmarks (bm) or a filter (f)")
    engine = _engine(session)
    if bookmarks is not None and _deferred(request):  # a client's batched ack
        done = partial(_report_failure, session, request)  # only a failure is answered
        messages = engine.ack_ids(queue, bookmarks)
        session.gateway.queues.defer_ack((option or "ack", queue, messages, session, done))  # type: ignore[union-attr]
        return
    if bookmarks is not None:
        command = partial(getattr(engine, option or "ack"), queue, bookmarks, session)
    else:
        if option is not None:
            raise ProtocolError(f"option {option} needs bookmarks, not a filter")
        await compiled_filter(session, header)
        command = partial(engine.ack_by_filter, queue, filter_text, session)
    if request.wants("processed"):
        session.spawn(_answer(session, request, command()), request)
    else:
        command(partial(_report_failure, session, request))


def _ack_option(header: dict[str, Any]) -> str | None:
    given = words(header, "o")
    if not given:
        return None
    if len(given) > 1 or not given <= set(ACK_OPTIONS):
        raise ProtocolError(
            f"sow_delete on a queue takes option cancel or expire, not {','.join(sorted(given))}"
        )
    return next(iter(given))


async def _answer(session: Session, request: Request, future: Any) -> None:
    """The processed ack, once the acknowledgement is durable."""
    result = await asyncio.wrap_future(future)
    session.send(ack(request.header, "processed", _refusal(result), matches=result.acked))


def _report_failure(session: Session, request: Request, outcome: AckResult | Exception) -> None:
    """Any thread: a failure ack for an acknowledgement nobody waits for."""
    if isinstance(outcome, AckResult):
        reason = _refusal(outcome)
    else:
        reason = (outcome.reason if isinstance(outcome, AmpsError) else None) or str(outcome)
    if reason:
        failure = ack(request.header, "processed", reason)
        session.gateway.queues.post(session, failure, b"")  # type: ignore[union-attr]


def _refusal(result: AckResult) -> str | None:
    if not result.refused:
        return None
    return f"not leased to this client (Leasing strict): {','.join(result.refused)}"


async def sow(session: Session, request: Request) -> None:
    """The queue's active messages, as a sow result (`k` is the bookmark)."""
    header = request.header
    queue = text(header, "t", required=True)
    filter_text = text(header, "f")
    await compiled_filter(session, header)
    query = Query(
        topic=queue,  # type: ignore[arg-type]
        filter=None,
        order_by=None,
        top_n=count(header, "top_n"),
        batch_size=count(header, "bs", default=DEFAULT_BATCH, limit=MAX_BATCH) or 1,  # type: ignore[arg-type]
    )
    messages = _engine(session).browse(queue, filter_text)  # type: ignore[arg-type]
    records = [_as_record(m) for m in messages]
    shown = records if query.top_n is None else records[: query.top_n]
    session.spawn(send_snapshot(session, request, query, QueryResult(shown, len(records))), request)


def _as_record(message: QueueMessage) -> SowRecord:
    topic, partition, offset = message.id
    return SowRecord(
        topic,
        partition,
        message.bookmark,
        message.payload,
        offset,
        message.timestamp,
        0,
        message.codec,
    )


async def sow_and_subscribe(session: Session, request: Request) -> None:
    raise ProtocolError("sow_and_subscribe is not supported on a queue: sow, then subscribe")


async def publish_target(session: Session, request: Request, regular: Handler) -> None:
    """A publish to a queue's name goes to its DefaultPublishTarget (seed 001)."""
    topic = request.header["t"]
    target = _engine(session).publish_target(topic)
    if target != topic:
        request = replace(request, header={**request.header, "t": target})
    await regular(session, request)


def routed_publish(regular: Handler) -> Handler:
    return routed(regular, lambda session, request: publish_target(session, request, regular))
