"""One client connection: read frames, dispatch commands, send replies.

A client must log on before anything else, and every command after is checked against
the user's entitlements (docs/security.md): a denial is a failure ack naming command,
topic and user, and an audit event; a read on a topic with an entitlement filter gets
that filter ANDed with its own. A command that fails for a reason the client
can act on (an AmpsError: unknown command or topic, bad filter, bad payload, missing key
field) gets a failure ack naming the reason, and the connection goes on. So does a bad
frame, unless its length field makes the stream impossible to follow.

Commands are handled in the order they arrive; the long ones (queries, replays, flush)
continue as tasks so the connection keeps serving meanwhile.

Bounds (docs/operations.md, The gateway's bounds), so no client can grow the worker:
- at most MaxCommandsInFlight long commands run at once per connection; beyond that the
  session stops reading its socket until one ends (10k pipelined `sow` frames whose
  replies were never read took the worker to 760 MiB);
- after each chunk of frames read, the session waits for its replies to drain before
  reading more, so a client that sends without reading is paced by its own replies;
- publishes wait for the worker's PublishBudget (server/delivery.py);
- a frame must arrive whole, and a new connection log on, within ReadTimeout.

Slow consumers: replies go straight into the connection's write buffer. Queries and
replays wait for it to drain; live deliveries can't wait (they would hold up every other
subscriber), so a connection with more than `max_queued_bytes` unsent is disconnected,
and so is the one holding the most when all connections together hold more than
MaxBufferedBytes (server/buffers.py).

A connection closed for a reason is first sent a failure ack without `cid` naming it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from amps_on_kafka.errors import AmpsError, FilterError, wire_kind
from amps_on_kafka.expr import Filter
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.log.replay import select_topics
from amps_on_kafka.protocol.frames import (
    READ_SIZE,
    BadFrame,
    Event,
    Frame,
    FrameDecoder,
    count_frames,
    encode_frame,
    publish_header,
)
from amps_on_kafka.security.auth import Credentials, Identity, audit
from amps_on_kafka.security.entitlements import (
    Denied,
    ReadAccess,
    UserEntitlements,
    is_pattern,
)
from amps_on_kafka.security.tls import certificate_subject
from amps_on_kafka.server import publishing, queries, queues, subscriptions
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import ProtocolError, Request, acks, compiled_filter, text
from amps_on_kafka.server.stats import Traffic
from amps_on_kafka.server.writes import Writes

if TYPE_CHECKING:
    from amps_on_kafka.server.gateway import Gateway

log = logging.getLogger(__name__)

Handler = Callable[["Session", Request], Awaitable[None]]
# A closing connection's unsent replies are delivered up to this size (the kernel's socket
# buffer takes them at once); more is dropped with the connection rather than held for a
# client that may never read it.
CLOSE_FLUSH_BYTES = 64 * 1024
WRITES = frozenset({"publish", "delta_publish", "sow_delete"})
_LIMIT = re.compile(r"at position \d+: (.*?) in \"")  # expr/lexer.py's error format
READS = frozenset({"sow", "subscribe", "sow_and_subscribe"})


class Subscription(Protocol):
    sub_id: str
    closed: bool

    def close(self) -> None: ...


class Session:
    def __init__(
        self, gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.gateway = gateway
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.decoder = FrameDecoder(gateway.max_frame_bytes, publishes=True)
        self.client_name: str | None = None
        self.identity: Identity | None = None  # who logged on
        self.entitlements: UserEntitlements | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self.closed = False
        self.traffic = Traffic()  # frames and bytes, read by the admin port
        self.queued = 0  # unsent bytes after the last write, counted by gateway.buffers
        self._writes: Writes | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Seconds left to wait for the client to finish the frame it began (or to log on).
        # Only time spent waiting for its bytes counts: not the time this session held
        # its own reading back (budget, commands in flight, draining).
        self._patience = gateway.settings.read_timeout

    def __repr__(self) -> str:
        user = f"{self.identity.user}/" if self.identity is not None else ""
        return f"Session({user}{self.client_name or '?'}@{self.peer})"

    # -- reading -------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while not self.closed:
                data = await self._read()
                if not data:
                    break
                events = self.decoder.feed(data)
                traffic = self.traffic
                traffic.bytes_in += len(data)
                traffic.frames_in += len(events)
                if events and self.client_name is not None:
                    self._patience = self.gateway.settings.read_timeout  # a new frame's turn
                await self._dispatch(events)
                if self.writer.transport.get_write_buffer_size():  # else nothing to wait for
                    await self.drain()  # replies before more requests: the client's pace
        except ConnectionError:
            pass
        except Exception:  # a bug: drop this connection, keep the gateway serving
            log.exception("%r failed; closing the connection", self)
        finally:
            self.close()

    async def _read(self) -> bytes:
        """The next bytes; b"" at the end, or once the client has been waited for
        ReadTimeout in all on a frame it began, or on a connection not logged on."""
        if not (self.decoder.partial or self.client_name is None):
            return await self.reader.read(READ_SIZE)
        started = time.monotonic()
        try:  # no task per read, as wait_for makes (a busy publisher's reads end mid-frame)
            async with asyncio.timeout(self._patience):
                return await self.reader.read(READ_SIZE)
        except TimeoutError:
            self.close_for(self._timeout_reason())
            return b""
        finally:
            self._patience -= time.monotonic() - started

    def _timeout_reason(self) -> str:
        limit = self.gateway.settings.read_timeout
        if self.decoder.partial:
            return f"a frame begun was not completed within {limit:g}s (ReadTimeout)"
        return f"no logon within {limit:g}s of connecting (ReadTimeout)"

    async def _dispatch(self, events: list[Event]) -> None:
        """Each frame in order: a run of plain publishes as one batch
        (publishing.publish_run), anything else one by one."""
        position = 0
        while position < len(events) and not self.closed:
            if (  # a run starts at a plain publish (a Publish tuple): an ack frame skips it
                type(events[position]) is tuple
                and self.client_name is not None
                and self._unchecked()
            ):
                position = publishing.publish_run(self, events, position)
                if position == len(events):
                    return
            taken = events[position]
            position += 1
            # a plain publish the batch did not take goes as any frame
            event = Frame(publish_header(taken), taken[2]) if isinstance(taken, tuple) else taken
            if not self._answered_at_once(event):
                await self._handle(event)

    def _answered_at_once(self, event: Frame | BadFrame) -> bool:
        """Write a plain publish, or answer a look-up by key (queries.look_up_at_once),
        without the layers of _handle: a publish that asks for no ack, from a user with
        nothing to check, to a topic no queue serves (the rest of what _handle does for
        it is nothing). False when _handle must take it."""
        if type(event) is not Frame or self.client_name is None:
            return False
        header = event.header
        command = header.get("c")
        if command == "sow":
            return self._unchecked() and queries.look_up_at_once(self, header)
        if command != "publish" or "a" in header:
            return False
        if not self._unchecked():
            return False
        queues = self.gateway.queues
        if queues is not None and queues.serves(header.get("t")):
            return False
        return publishing.publish_at_once(self, header, event.payload)

    def _unchecked(self) -> bool:
        """Whether this session's user has nothing to check: no entitlements, or all."""
        entitlements = self.entitlements
        return entitlements is None or entitlements.unrestricted

    async def _handle(self, event: Frame | BadFrame) -> None:
        if isinstance(event, BadFrame):
            self.fail(event.header or {}, event.reason)
            if event.fatal:
                self.close()
            return
        header = event.header
        own_filter = header.get("f")
        try:
            request = Request(header, event.payload, acks(header))
            handler = self._handler(header)
            if not self._unchecked():  # a coroutine less per command for most users
                await self._authorize(request)
            if request.wants("received"):
                self.send(ack(header, "received"))
            await handler(self, request)
        except Denied as exc:
            audit.warning("denied: %r: %s", self, exc.reason)
            self.fail(header, exc.reason)
        except FilterError as exc:
            self.fail(header, _own_terms(exc, own_filter, header.get("f")), exc)
        except AmpsError as exc:
            self.fail(header, exc.reason, exc)
        if len(self._tasks) >= self.gateway.settings.max_commands_in_flight:
            await self._pace()

    async def _pace(self) -> None:
        """Read no further while MaxCommandsInFlight long commands are running."""
        limit = self.gateway.settings.max_commands_in_flight
        while len(self._tasks) >= limit and not self.closed:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)

    def _handler(self, header: dict[str, Any]) -> Handler:
        command = header.get("c")
        handler = HANDLERS.get(command) if isinstance(command, str) else None
        if handler is None:
            raise ProtocolError(f"unknown command {command!r}")
        if self.client_name is None and command != "logon":
            raise ProtocolError(f"{command}: log on first")
        return handler

    # -- entitlements --------------------------------------------------------------
    async def _authorize(self, request: Request) -> None:
        """Refuse what the user is not entitled to (Denied); narrow what it reads to its
        entitlement filter, by ANDing that into the command's `f`."""
        command, entitlements = request.command, self.entitlements
        if self._unchecked() or command not in WRITES | READS:
            return
        header = request.header
        topic: str = text(header, "t", required=True)  # type: ignore[assignment]
        queues = self.gateway.queues
        queue = queues is not None and queues.serves(topic)
        if command in WRITES and not (command == "sow_delete" and queue):
            entitlements.check_write(command, topic)
            if command == "sow_delete":
                await self._narrow_delete(header, topic)
            return
        # reads, and acks (sow_delete) on a queue, which are its consumers' right
        access = await self._read_access(command, topic, queue)
        if access.text is not None and not (command == "sow_delete" and "bm" in header):
            await self._restrict(header, access.text)

    async def _read_access(self, command: str, topic: str, queue: bool) -> ReadAccess:
        """A regular expression over queue or topic names (AMPS's topic regex, which a
        log subscription reads every matching topic of) needs read on every name it
        matches, with one entitlement filter for them all: the grant is checked against
        what will be read, never against the pattern's text (`prices..*|orders` matches
        a grant `prices\\..*` as a string, and would read all of `orders`)."""
        entitlements: UserEntitlements = self.entitlements  # type: ignore[assignment]
        if queue:
            names = self.gateway.queues.names(topic)  # type: ignore[union-attr]
        elif is_pattern(topic):
            names = await self.gateway.blocking(select_topics, self.gateway.producer, topic)
        else:
            names = [topic]
        try:
            accesses = {name: entitlements.check_read(command, name) for name in names}
        except Denied:
            if names == [topic]:
                raise
            raise Denied(  # the pattern, not the name: names the user may not read stay unsaid
                f"not entitled: user {entitlements.user!r} may not {command} {topic!r}: it "
                "matches a topic or queue this user may not read"
            ) from None
        filters = {access.text for access in accesses.values()}
        if len(filters) > 1:
            kind = "queues" if queue else "topics"
            raise Denied(
                f"{command} {topic!r}: the {kind} it matches have different entitlement "
                "filters for this user; subscribe to each by name"
            )
        return next(iter(accesses.values()))

    async def _narrow_delete(self, header: dict[str, Any], topic: str) -> None:
        """A user who sees only part of a topic deletes only within that part: its
        entitlement filter is ANDed into a delete by filter, and a delete by keys or by
        data is refused (the gateway cannot see those records before the worker deletes
        them, and the count in the ack would tell what the user may not read)."""
        entitlements: UserEntitlements = self.entitlements  # type: ignore[assignment]
        access = entitlements.read(topic)
        if access is None or access.text is None:
            return
        if text(header, "f") is None:
            raise Denied(
                f"not entitled: user {entitlements.user!r} may sow_delete from {topic!r} "
                "by filter only (an entitlement filter limits what this user sees of it)"
            )
        await self._restrict(header, access.text)

    async def _restrict(self, header: dict[str, Any], entitlement: str) -> None:
        own = text(header, "f")
        if own is None:
            header["f"] = entitlement
            return
        await compiled_filter(self, header)  # the user's own errors, with its positions
        header["f"] = f"({entitlement}) AND ({own})"

    def entitlement_filter(self, topic: str) -> Filter | None:
        """The filter limiting what this session's user sees of `topic`, if any."""
        access = self.entitlements.read(topic) if self.entitlements is not None else None
        return access.filter if access is not None else None

    # -- writing -------------------------------------------------------------------
    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.send_encoded(encode_frame(header, payload), 1)

    def send_encoded(self, frames: bytes, count: int | None = None) -> None:
        """Frames already encoded (several at once: one write for a burst of deliveries);
        `count` of them, when the caller knows (else they are counted)."""
        if self.closed:
            return
        transport, limit = self.writer.transport, self.gateway.max_queued_bytes
        queued = transport.get_write_buffer_size()
        # A buffer not empty means the kernel's is full: all of `frames` would be held.
        # Cut before copying them, so that the buffer never holds more than the limit.
        if queued and queued + len(frames) > limit:
            self.cut_slow_consumer(f"more than MaxQueuedBytes ({limit:,}) queued unsent")
            return
        try:
            self.writer.write(frames)
        except RuntimeError:
            # uvloop's transport was closed under the session (the client reset the
            # connection) before the read loop saw it: a write then raises. Raised, it
            # ended the fan-out's job, and the other subscribers lost that job's frames.
            self.close()
            return
        traffic = self.traffic
        traffic.frames_out += count_frames(frames) if count is None else count
        traffic.bytes_out += len(frames)
        queued = transport.get_write_buffer_size()
        if queued > limit:
            self.cut_slow_consumer(f"more than MaxQueuedBytes ({limit:,}) queued unsent")
            return
        self.gateway.buffers.note(self, queued)

    def cut_slow_consumer(self, reason: str) -> None:
        """Disconnect a client that does not take its deliveries fast enough: live
        deliveries can't wait for it. The failure ack naming `reason` is sent only if
        little is queued before it (CLOSE_FLUSH_BYTES): the rest is dropped, not kept
        for a client that may never read it, and the ack would come after it."""
        log.warning(
            "%r: disconnecting a slow consumer: %s",
            self,
            reason,
            extra={
                "event": "slow_consumer",
                "client": self.client_name,
                "peer": self.peer,
                "subscriptions": len(self.subscriptions),
                "reason": reason,
            },
        )
        self.gateway.stats.slow_consumers += 1
        if self.writer.transport.get_write_buffer_size() <= CLOSE_FLUSH_BYTES:
            self.writer.write(encode_frame(ack({}, "processed", f"slow consumer: {reason}")))
        self.close()

    def fail(self, request: dict[str, Any], reason: str, error: AmpsError | None = None) -> None:
        """A failure ack for a command (or a frame) the session could not carry out; its
        `error` key names the kind of `error` a client raises alike on both transports."""
        kind = wire_kind(error) if error is not None else None
        self.send(ack(request, "processed", reason, **({"error": kind} if kind else {})))

    def close_for(self, reason: str) -> None:
        """Close the connection, telling the client why (a failure ack without cid)."""
        log.warning("%r: closing: %s", self, reason)
        self.fail({}, reason)
        self.close()

    async def drain(self) -> None:
        """Wait until the client has taken most of what was sent (flow control)."""
        if self.closed:
            return
        try:
            await self.writer.drain()
        except ConnectionError:
            self.close()

    # -- state ---------------------------------------------------------------------
    @property
    def writes(self) -> Writes:
        if self._writes is None:
            publisher = LogPublisher(
                self.gateway.bootstrap,
                self.identity.publisher_id(self.client_name),  # type: ignore[union-attr,arg-type]
                registry=self.gateway.registry,
                on_failed_write=_reported_per_command,
                producer=self.gateway.producer,
            )
            self._writes = Writes(self, publisher)
        return self._writes

    def use_producer(self, producer: Any) -> None:
        """The gateway's shared producer was replaced (Gateway._adopt_producer)."""
        if self._writes is not None:
            self._writes.publisher.use_producer(producer)

    def add_subscription(self, sub: Subscription) -> None:
        """Registers `sub`; at most MaxSubscriptions per connection, because each one
        holds buffers, and a log subscription a Kafka consumer and a thread of its own."""
        if sub.sub_id in self.subscriptions:
            raise ProtocolError(f"sub_id {sub.sub_id!r} is already in use on this connection")
        limit = self.gateway.settings.max_subscriptions
        if len(self.subscriptions) >= limit:
            raise ProtocolError(
                f"too many subscriptions on this connection: at most {limit} "
                "(MaxSubscriptions); unsubscribe one first"
            )
        self.subscriptions[sub.sub_id] = sub

    def remove_subscription(self, sub_id: str) -> bool:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is not None:
            sub.close()
        return sub is not None

    def spawn(
        self,
        work: Coroutine[Any, Any, None],
        request: Request,
        *,
        on_failure: Subscription | None = None,
    ) -> None:
        """Run a long command as a task; its AmpsError becomes a failure ack. The read
        loop counts these tasks against MaxCommandsInFlight (`_pace`)."""
        task = asyncio.get_running_loop().create_task(self._guarded(work, request, on_failure))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(
        self, work: Coroutine[Any, Any, None], request: Request, on_failure: Subscription | None
    ) -> None:
        try:
            await work
        except AmpsError as exc:
            if on_failure is not None and self.subscriptions.get(on_failure.sub_id) is on_failure:
                self.remove_subscription(on_failure.sub_id)
            self.fail(request.header, exc.reason, exc)
        except Exception:  # a bug: drop this connection, keep the gateway serving
            log.exception("%r: %s failed; closing the connection", self, request.command)
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for sub in self.subscriptions.values():
            sub.close()
        self.subscriptions.clear()
        self.gateway.forget(self)
        if self.writer.transport.get_write_buffer_size() > CLOSE_FLUSH_BYTES:
            self.writer.transport.abort()  # a client that doesn't read would hold it forever
        else:
            self.writer.close()


def _own_terms(exc: FilterError, own: object, used: object) -> str:
    """A filter's error in the user's terms. The user's own filter was compiled alone
    first (`_restrict`), so an error here with an entitlement filter ANDed in is a limit
    (length, depth, operations) the two reach together: its position and excerpt would
    show the entitlement filter, which is the gateway's, so they are left out."""
    if used == own:
        return exc.reason
    limit = _LIMIT.match(exc.reason)
    what = limit.group(1) if limit else exc.reason.split(" in ", 1)[0]
    return f"filter: {what}, counting the entitlement filter ANDed with it"


def _reported_per_command(_failure: object) -> None:
    """Failures reach the session through each command's on_persisted callback."""


async def logon(session: Session, request: Request) -> None:
    """Authenticates (security/auth.py), then binds the client name to the user: its
    publisher id is `user:client_name`, and another user can't take the name over."""
    header = request.header
    name: str = text(header, "client_name", required=True)  # type: ignore[assignment]
    if session.client_name is not None:
        raise ProtocolError(f"already logged on as {session.client_name!r}")
    for reserved in "|:":
        if reserved in name:
            raise ProtocolError(f"client name {name!r} must not contain {reserved!r}")
    if not name.isprintable():  # it is logged (audit lines) and shown (/admin, stats)
        raise ProtocolError(f"client name {name!r} must be printable: no line breaks")
    credentials = Credentials(
        text(header, "user_id"),
        text(header, "pw"),
        certificate_subject(session.writer.get_extra_info("peercert")),
        str(session.peer[0]) if isinstance(session.peer, tuple) else str(session.peer),
    )
    gateway = session.gateway
    identity = await gateway.authenticate(credentials)
    if session.closed:
        return
    session.identity = identity
    gateway.claim(session, name)
    session.entitlements = gateway.security.entitlements_of(identity)
    session.client_name = name
    user = {} if identity.anonymous else {"user_id": identity.user}
    session.send(
        ack(header, "processed", client_name=name, max_frame_bytes=gateway.max_frame_bytes, **user)
    )


async def heartbeat(session: Session, request: Request) -> None:
    session.send(ack(request.header, "heartbeat"))


async def unsubscribe(session: Session, request: Request) -> None:
    sub_id = text(request.header, "sub_id", required=True)
    if sub_id == "all":
        for known in list(session.subscriptions):
            session.remove_subscription(known)
    elif not session.remove_subscription(sub_id):  # type: ignore[arg-type]
        raise ProtocolError(f"no subscription {sub_id!r} on this connection")
    if request.wants("processed"):
        session.send(ack(request.header, "processed"))


HANDLERS: dict[str, Handler] = {
    "logon": logon,
    "heartbeat": heartbeat,
    "publish": queues.routed_publish(publishing.publish),
    "delta_publish": queues.routed_publish(publishing.publish),
    "sow_delete": queues.routed(publishing.sow_delete, queues.sow_delete),
    "flush": publishing.flush,
    "sow": queues.routed(queries.sow, queues.sow),
    "subscribe": queues.routed(subscriptions.subscribe, queues.subscribe),
    "sow_and_subscribe": queues.routed(queries.sow_and_subscribe, queues.sow_and_subscribe),
    "unsubscribe": unsubscribe,
}
