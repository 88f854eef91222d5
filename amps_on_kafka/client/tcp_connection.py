"""The tcp:// client's connection to a gateway (client/tcp_transport.py holds the AMPS
commands sent over it): the socket and the routes from replies to their waiters. A
command registers a route before it sends; whoever reads the socket (the caller itself
when no other thread reads, else the reader thread: client/tcp_reader.py) decodes frames
and routes each to a queue, deliveries by `sub_id`, replies by the command id `cid`. A
failure frame with no route is a publish the gateway refused or Kafka did not persist: a
failed write. A lost connection fails every waiter and every later call.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

from amps_on_kafka.client.acks import AckBatcher
from amps_on_kafka.client.message import Batch, GatewayMessage, batch_messages
from amps_on_kafka.client.stream import TICK_INTERVAL
from amps_on_kafka.client.tcp_outbox import Outbox
from amps_on_kafka.client.tcp_reader import SocketReader, read_in_slices
from amps_on_kafka.client.tls import TlsOptions, TlsSocket
from amps_on_kafka.errors import AmpsError, TransportError, server_error
from amps_on_kafka.log.controls import TICK
from amps_on_kafka.log.message import COMPLETED, Completed
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.protocol.frames import Event, Frame, encode_frame

# the transport's log lines keep its logger name (client/tcp_transport.py)
log = logging.getLogger("amps_on_kafka.client.tcp_transport")

COMMAND_TIMEOUT = 30.0  # seconds to wait for the gateway to answer a command
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 10.0

_ENDED = object()  # the application closed the stream
_LOST = object()  # the connection is gone
Item = GatewayMessage | Completed


class TcpConnection:
    """A connected socket to a gateway, who reads it and the reply routes: the part of
    TcpTransport that sends a command and waits for its replies."""

    def __init__(self, address: str, tls: TlsOptions | None) -> None:
        self.address = address
        self._tls = tls
        self._sock = _connect(address, tls)
        self._outbox = Outbox(self._sock, self._lose)
        self.acks = AckBatcher(self._send)  # message.ack() batches here (docs/queues.md)
        self._ids = itertools.count(1)
        self._commands: dict[str, queue.SimpleQueue] = {}
        self._subs: dict[str, queue.SimpleQueue] = {}
        self._failures: list[FailedWrite] = []
        self._failed_write_handler: Callable[[FailedWrite], None] | None = None
        self._lost: TransportError | None = None
        self._reader = SocketReader(
            self._sock, f"amps-tcp-{address}", self._route, self._lose, self._subs
        )
        self._reader.start()

    # -- requests and replies -----------------------------------------------------------
    def _command(
        self, header: dict[str, Any], payload: bytes = b"", *, timeout: float | None
    ) -> Frame:
        """Send a command and return its reply, raising ServerError on a failure."""
        cid, _, reply = self._open(header, self._commands, None, payload, timeout)
        self._commands.pop(cid, None)
        return reply

    def _open(
        self,
        header: dict[str, Any],
        routes: dict[str, queue.SimpleQueue],
        route: str | None,
        payload: bytes = b"",
        timeout: float | None = COMMAND_TIMEOUT,
    ) -> tuple[str, queue.SimpleQueue, Frame]:
        """Register a route, send, and wait for the first reply (the command's ack).

        Returns the route key (the sub_id for subscriptions, else the command id), the
        queue later replies arrive on, and the first reply.
        """
        cid = str(next(self._ids))
        header["cid"] = cid
        if routes is self._subs:
            route = header["sub_id"] = route or cid
        key = route or cid
        replies: queue.SimpleQueue = queue.SimpleQueue()
        routes[key] = replies
        try:
            self._send(header, payload)
            first = self._reply(replies, timeout)
        except BaseException:
            routes.pop(key, None)
            raise
        return key, replies, first

    def _reply(self, replies: queue.SimpleQueue, timeout: float | None) -> Frame:
        try:
            frame: Frame = self._reader.next(replies, timeout)
        except queue.Empty:
            raise TransportError(
                f"no reply from the gateway at {self.address} in {timeout}s"
            ) from None
        if frame is _LOST:
            raise self._lost  # type: ignore[misc]
        _raise_failure(frame.header)
        return frame

    def _items(
        self,
        replies: queue.SimpleQueue,
        routes: dict[str, queue.SimpleQueue],
        key: str,
        *,
        keep: frozenset[str] | None = None,
        until_done: bool = False,
    ) -> Iterator[Item | object]:
        """Messages as they arrive, TICK after each quiet TICK_INTERVAL (the stream's
        clock); ends when closed, or at the completed ack when `until_done`. A command's
        stream (a query) reads the socket for itself like its caller; a subscription's
        waits for the reader thread, which reads while one is open (tcp_reader.py)."""
        take = self._reader.next if routes is self._commands else _queued
        try:
            while True:
                try:
                    frame = take(replies, TICK_INTERVAL)
                except queue.Empty:
                    yield TICK
                    continue
                if frame is _ENDED:
                    return
                if frame is _LOST:
                    raise self._lost  # type: ignore[misc]
                command = frame.header.get("c")
                if command == "sow":  # a batch of records: no checks each
                    if keep is None or "sow" in keep:
                        yield from _records("sow", frame)
                    continue
                if command == "publish" and "recs" in frame.header:  # a queue's burst
                    if keep is None or "publish" in keep:  # made ackable: no checks each
                        yield from _records("publish", frame, self.acks)
                    continue
                if command != "ack" and keep is not None and command not in keep:
                    continue  # none of its messages is kept: none made (a query's groups)
                for item in _unpack(frame):
                    if item is COMPLETED and until_done:
                        return
                    if isinstance(item, GatewayMessage) and item.command == "publish":
                        item.acks = self.acks  # a queue message can be acked
                    if keep is None or item.command in keep:
                        yield item
        finally:
            _forget(routes, key, replies)

    def _end(
        self, routes: dict[str, queue.SimpleQueue], key: str, only: queue.SimpleQueue | None = None
    ) -> bool:
        """Stop routing to a stream and wake its reader; False if it had ended already.
        With `only`, just that stream: its sub_id may already name a newer one."""
        replies = routes.get(key)
        if replies is None or (only is not None and replies is not only):
            return False
        del routes[key]
        replies.put(_ENDED)
        return True

    # -- the socket ----------------------------------------------------------------------
    def _send(
        self, header: dict[str, Any], payload: bytes = b"", *, deferred: bool = False
    ) -> None:
        """Queue a frame (`deferred`: see Outbox). A caller's reply route is registered
        before this check and _lose sets _lost before waking routes, so a waiter can't
        miss a lost connection."""
        if self._lost is not None:
            raise self._lost
        if not self._outbox.put(encode_frame(header, payload), deferred=deferred):
            raise self._lost or TransportError(f"{self.address}: the connection is closed")

    def _lose(self, reason: str) -> None:
        """The connection is gone: fail whoever waits, and every later call."""
        if self._lost is None:
            self._lost = TransportError(f"{self.address}: {reason}")
        for routes in (self._commands, self._subs):
            for replies in list(routes.values()):
                replies.put(_LOST)
        self._reader.end()

    def _route(self, events: list[Event]) -> None:
        """A read's frames, in order, each to its waiter: deliveries by `sub_id`, replies
        by `cid`, a failure with neither to the failed-write handler; a bad frame logged.
        One call a read, not one a frame (a look-up's answer is five frames read at once:
        docs/performance.md, the look-up's tenth round)."""
        subs, commands = self._subs, self._commands
        for frame in events:
            if not isinstance(frame, Frame):
                log.warning("bad frame from the gateway: %s", frame.reason)  # type: ignore[union-attr]
                continue
            header = frame.header
            replies = subs.get(header.get("sub_id")) if subs else None  # type: ignore[arg-type]
            if replies is None:
                replies = commands.get(header.get("cid"))  # type: ignore[arg-type]
            if replies is not None:
                replies.put(frame)
            elif header.get("status") == "failure":
                self._unrouted_failure(header)

    def _unrouted_failure(self, header: dict[str, Any]) -> None:
        """A publish the gateway refused or Kafka did not persist: a failed write. A
        handler that raises is logged: the thread that read the frame (a caller, or the
        reader thread) goes on routing the frames read with it."""
        if "s" not in header:
            log.warning("gateway: %s", header.get("reason"))
            return
        failure = FailedWrite(header.get("t", ""), header["s"], header.get("reason", "unknown"))
        if self._failed_write_handler is None:
            self._failures.append(failure)
            return
        try:
            self._failed_write_handler(failure)
        except Exception:
            log.exception("the failed-write handler raised for %s", failure)

    def _disconnect(self) -> None:
        self._outbox.close(CLOSE_TIMEOUT)
        with suppress(OSError):  # already gone
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.close(CLOSE_TIMEOUT)  # reads the end: whoever waits fails
        self._sock.close()


def _connect(address: str, tls: TlsOptions | None) -> socket.socket | TlsSocket:
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise TransportError(f"can't connect to the gateway at {address}: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        sock.settimeout(None)
        read_in_slices(sock)
        return sock
    try:
        secured = TlsSocket(sock, tls.context(), host)  # the handshake, within the timeout
    except (AmpsError, OSError) as exc:
        sock.close()
        reason = exc.reason if isinstance(exc, AmpsError) else str(exc)
        raise TransportError(f"gateway at {address}: {reason}") from exc
    sock.settimeout(None)
    read_in_slices(sock)  # after the handshake, which reads within CONNECT_TIMEOUT
    return secured


def unanswered_logon(tls: TlsOptions | None) -> str:
    """Why a logon may see the connection closed unanswered."""
    if tls is None:
        return (
            "no worker's gateway listens there (a Kafka broker takes kafka://, a gateway "
            "with TLS tcps://)"
        )
    if tls.cert is not None:
        return (
            f"the gateway did not accept the client certificate {tls.cert} (is it signed "
            "by the CA in the gateway's Gateway.TLS.CA?), or no worker's gateway listens there"
        )
    return (
        "the gateway may require a client certificate (tcps://...?cert=FILE&key=FILE), "
        "or no worker's gateway listens there"
    )


def _raise_failure(header: dict[str, Any]) -> None:
    if header.get("c") == "ack" and header.get("status") == "failure":
        reason = header.get("reason") or "the gateway refused the command"
        raise server_error(reason, header.get("error"))


def _unpack(frame: Frame) -> Iterator[Item]:
    header, payload = frame.header, frame.payload
    command, topic, sub_id = header.get("c"), header.get("t"), header.get("sub_id")
    if command == "sow" or (command == "publish" and "recs" in header):  # a batch frame
        yield from _records(command, frame)
    elif command == "ack":
        _raise_failure(header)
        yield (
            COMPLETED
            if header.get("a") == "completed"
            else GatewayMessage("ack", topic, header, b"", sub_id)
        )
    else:
        yield GatewayMessage(command, topic, header, payload, sub_id)  # type: ignore[arg-type]


def _records(
    command: str, frame: Frame, acks: AckBatcher | None = None
) -> Iterator[GatewayMessage]:
    """A batch frame's messages: `recs` describes each record, payloads follow in order;
    `acks` where they can be acked (a queue's burst). The compiled builder
    (message.batch_messages) makes them where it is sure of the entries; from the first
    it is not, the twin's loop goes on. The two are chained in C, not yielded from a
    generator here: a generator frame less a message for whoever iterates them."""
    header, payload = frame.header, frame.payload
    topic, sub_id = header.get("t"), header.get("sub_id")
    recs = header.get("recs", ())
    if batch_messages is None or type(recs) is not list or type(payload) is not bytes:
        return _records_from(command, topic, sub_id, recs, payload, acks)
    built = batch_messages(recs, payload, (command, topic, sub_id, acks))
    return itertools.chain(built, _records_from(command, topic, sub_id, recs, payload, acks, built))


def _records_from(
    command: str,
    topic: str | None,
    sub_id: str | None,
    recs: Iterable[Any],
    payload: bytes,
    acks: AckBatcher | None,
    built: Batch | None = None,
) -> Iterator[GatewayMessage]:
    """The twin's loop over `recs`; after `built`, from where that stopped (read when the
    loop starts: `built` is exhausted by then)."""
    offset = 0
    if built is not None:
        recs, offset = itertools.islice(recs, built.read, None), built.offset
    for meta in recs:
        end = offset + meta["n"]
        message = GatewayMessage(command, topic, meta, payload[offset:end], sub_id)
        message.acks = acks
        yield message
        offset = end


def _queued(replies: queue.SimpleQueue, timeout: float) -> Any:
    """A subscription's next item, routed by whoever reads (queue.Empty after `timeout`)."""
    return replies.get(timeout=timeout)


def _forget(routes: dict[str, queue.SimpleQueue], key: str, replies: queue.SimpleQueue) -> None:
    """Drop a route if it is still this one: a stream closed late (its generator collected
    after its sub_id was subscribed again) must not take the new stream's route with it."""
    if routes.get(key) is replies:
        del routes[key]
