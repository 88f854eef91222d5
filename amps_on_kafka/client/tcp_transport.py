"""The `tcp://host:port/amps/json` transport: everything, through a worker's gateway.

A blocking socket and one reader thread. The reader decodes frames and routes each to a
queue: deliveries by `sub_id`, replies by the command id `cid`. Callers block on their
queue. A publish is sent without a command id and returns at once; the gateway reports
only failures for it, which go to the failed-write handler (or are raised by
publish_flush, the persisted ack of everything before it). Publish sequence numbers are
the client's own and are echoed on every ack.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

import orjson

from amps_on_kafka.client.acks import AckBatcher, check_ack_option
from amps_on_kafka.client.message import DeleteAck, GatewayMessage, batch_messages
from amps_on_kafka.client.stream import TICK_INTERVAL, MessageStream
from amps_on_kafka.client.tls import TlsOptions, TlsSocket
from amps_on_kafka.errors import (
    AmpsError,
    MessageError,
    PublishError,
    TransportError,
    WrongTransport,
    server_error,
)
from amps_on_kafka.log.codecs import check_payload, check_topic
from amps_on_kafka.log.controls import TICK
from amps_on_kafka.log.envelope import Command, check_expiration
from amps_on_kafka.log.message import COMPLETED, Completed
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.protocol.frame_buffer import FrameBuffer, publish_frame
from amps_on_kafka.protocol.frames import READ_SIZE, Frame, FrameDecoder, encode_frame

log = logging.getLogger(__name__)

COMMAND_TIMEOUT = 30.0  # seconds to wait for the gateway to answer a command
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 10.0
DEFAULT_BATCH = 100
MAX_INBOUND_FRAME = 1 << 30  # the gateway bounds its frames; this only guards the decoder
MAX_OUTBOX = 16 * 1024 * 1024  # bytes queued for the socket before publishers wait
MAX_PARTITIONS = 10_000  # a delete by filter writes one record per partition, at most this

SOW = frozenset({"sow"})  # what a query's stream keeps for an iterator
QUERY_GROUPS = frozenset({"group_begin", "sow", "group_end"})  # and for a handler
_ENDED = object()  # the application closed the stream
_LOST = object()  # the connection is gone
Item = GatewayMessage | Completed


class Outbox:
    """Frames for the socket, in order, and the publish sequence numbers.

    A thread that finds the socket idle writes its frame itself: a lone command or batch
    of acks costs no thread switch. Frames put while a write is under way queue up and
    the writer thread sends them together, so busy publishers share system calls. A
    publish, which nobody waits for, is `deferred`: always left to the writer thread,
    which sends it with every publish queued behind it by the time it runs (a system
    call per publish was half of a tcp:// publisher's time; docs/performance.md). A
    plain publish is numbered and queued by `publish` without this class's lock: only
    the one that finds the buffer empty wakes the writer. A publisher that outruns the
    gateway blocks once more than MAX_OUTBOX bytes wait (each blocked publisher's own
    frame is queued already), instead of filling memory.
    """

    def __init__(self, sock: socket.socket, on_error: Callable[[str], None]) -> None:
        self._sock = sock
        self._on_error = on_error
        # publish sequence numbers: microseconds now, so they rise across restarts
        self.buffer = FrameBuffer(time.time_ns() // 1000 + 1, publish_frame)
        self._writing = False  # some thread is in sendall
        self._closing = False
        self._failed = False
        self._changed = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._write, name="amps-tcp-writer", daemon=True)
        self._thread.start()

    def publish(self, topic: str, payload: bytes) -> int | None:
        """Number and queue a plain publish for the writer thread: its sequence number,
        or None once the socket failed or the outbox closed."""
        sequence, before = self.buffer.publish(topic, payload)
        if (before > 0 and before + len(payload) <= MAX_OUTBOX) or self._queued(before):
            return sequence
        return None

    def put(self, frame: bytes, *, deferred: bool = False) -> bool:
        """Send or queue a frame; False once the socket failed or the outbox closed."""
        with self._changed:
            self._wait_for_room()
            before = self.buffer.append(frame)
            if before < 0:
                return False
            if self._writing or deferred:
                if before == 0:
                    self._changed.notify_all()  # the writer sends it (after the write under way)
                return True
            data = self._take()
        return self._send(data)

    def close(self, timeout: float) -> None:
        """Send what is queued, then stop the writer."""
        with self._changed:
            self._closing = True
            self.buffer.close()
            self._changed.notify_all()
        self._thread.join(timeout)

    def _queued(self, before: int) -> bool:
        """After a publish found the buffer empty (wake the writer), took it past
        MAX_OUTBOX (wait for room, as put() waits before its frame) or found it closed
        (-1: False, not queued). A queued frame is sent unless the socket fails (a
        closing outbox sends what it holds)."""
        if before < 0:
            return False
        with self._changed:
            if before == 0:
                self._changed.notify_all()
            else:
                self._wait_for_room()
            return not self._failed

    def _wait_for_room(self) -> None:
        """Under the lock: until at most MAX_OUTBOX bytes wait, or the outbox ended."""
        while len(self.buffer) > MAX_OUTBOX and not (self._failed or self._closing):
            self._changed.wait()

    def _write(self) -> None:
        while True:
            with self._changed:
                while not (self._closing or len(self.buffer)) or self._writing:
                    self._changed.wait()
                data = self._take()
            if not data or not self._send(data):
                return

    def _take(self) -> bytes:
        """Under the lock: the bytes to write now; the caller becomes the writer."""
        if len(self.buffer) > MAX_OUTBOX:
            self._changed.notify_all()  # room again for blocked publishers
        self._writing = True
        return self.buffer.take()

    def _send(self, data: bytes) -> bool:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            with self._changed:
                self._failed, self._writing = True, False
                self.buffer.close()
                self._changed.notify_all()
            self._on_error(f"sending to the gateway failed: {exc}")
            return False
        with self._changed:
            self._writing = False
            if len(self.buffer) or self._closing:
                self._changed.notify_all()  # the writer thread takes what queued meanwhile
        return True


class TcpTransport:
    def __init__(
        self,
        address: str,
        client_name: str,
        *,
        tls: TlsOptions | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        """`tls` for tcps://; `user` and `password` are sent at logon (docs/security.md)."""
        self.address = address
        self.client_name = client_name
        self.max_frame_bytes: int | None = None  # the gateway's limit, learnt at logon
        self._credentials = {"user_id": user, "pw": password}
        self._tls = tls
        self._sock = _connect(address, tls)
        self._outbox = Outbox(self._sock, self._lose)
        self.acks = AckBatcher(self._send)  # message.ack() batches here (docs/queues.md)
        self._ids = itertools.count(1)
        self._published = False
        self._commands: dict[str, queue.SimpleQueue] = {}
        self._subs: dict[str, queue.SimpleQueue] = {}
        self._failures: list[FailedWrite] = []
        self._failed_write_handler: Callable[[FailedWrite], None] | None = None
        self._lost: TransportError | None = None
        self._reader = threading.Thread(target=self._read, name=f"amps-tcp-{address}", daemon=True)
        self._reader.start()

    # -- session ---------------------------------------------------------------------
    def logon(self, timeout: float | None) -> None:
        header = {"c": "logon", "client_name": self.client_name}
        _set(header, **self._credentials)
        try:
            reply = self._command(header, timeout=timeout)
        except TransportError as exc:
            if self._lost is None:
                raise
            # A gateway that refuses a logon says why first (a failure ack): a close with
            # no answer is something else listening there, or, over TLS, a gateway that
            # refused the client's certificate (TLS 1.3 checks it after the handshake).
            raise TransportError(
                f"{self.address} closed the connection without answering the logon: "
                f"{_unanswered(self._tls)}"
            ) from exc
        self.max_frame_bytes = reply.header.get("max_frame_bytes")

    def heartbeat(self, timeout: float | None = None) -> None:
        self._command({"c": "heartbeat"}, timeout=timeout)

    def close(self) -> None:
        """Send waiting acks, flush what was published (PublishError if some failed), then
        disconnect."""
        try:
            if self._lost is None:
                self.acks.close()
            if self._published and self._lost is None:
                self.publish_flush(CLOSE_TIMEOUT)
        finally:
            self._disconnect()

    # -- publishing --------------------------------------------------------------------
    def publish(
        self,
        topic: str,
        data: Any,
        expiration: float | None,
        command: Command,
        *,
        sow_key: str | None = None,
        correlation_id: str | None = None,
        sequence: int | None = None,
    ) -> int:
        """`sequence` republishes under the original number (a publish store's replay)."""
        check_topic(topic)  # the gateway would refuse it at the flush, Python's repr in it
        if expiration is not None:
            check_expiration(expiration)  # refused here, before it uses a sequence number
        sequence = self._reserve(1) if sequence is None else sequence
        header = {"c": command.value, "t": topic, "s": sequence}
        if expiration is not None or sow_key is not None or correlation_id is not None:
            _set(header, e=expiration, k=sow_key, x=correlation_id)
        self._send(header, _payload(data), deferred=True)
        self._published = True
        return sequence

    def publish_document(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        """Client.publish, which binds it on the client instance. A plain publish (a str
        topic, no expiration, no options) is encoded here and numbered and queued by the
        outbox in one call (Outbox.publish), the frame publish() and _send would queue;
        anything else goes through them."""
        if expiration is not None or kw or type(topic) is not str:
            return self.publish(topic, data, expiration, Command.PUBLISH, **kw)
        payload = _payload(data)
        if self._lost is not None:
            raise self._lost
        sequence = self._outbox.publish(topic, payload)
        if sequence is None:
            raise self._lost or TransportError(f"{self.address}: the connection is closed")
        self._published = True
        return sequence

    def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        keys: Iterable[str] | None = None,
        data: Any = None,
        correlation_id: str | None = None,
        timeout: float | None = COMMAND_TIMEOUT,
        sequence: int | None = None,
    ) -> DeleteAck:
        """Waits for the worker: the processed ack's `matches` is the number deleted."""
        key_list = [str(k) for k in keys] if keys is not None else None
        records = len(key_list) if key_list is not None else MAX_PARTITIONS if data is None else 1
        header: dict[str, Any] = {"c": "sow_delete", "t": topic, "a": "processed"}
        # The gateway numbers each record it writes from this one.
        first = header["s"] = self._reserve(records) if sequence is None else sequence
        _set(header, f=filter, x=correlation_id, k=key_list)
        payload = _payload(data) if data is not None else b""
        reply = self._command(header, payload, timeout=timeout).header
        return DeleteAck(
            topic,
            first,
            matches=reply.get("matches"),
            ack_type=reply.get("a"),
            correlation_id=correlation_id,
        )

    def ack(
        self,
        topic: str,
        bookmarks: str | Iterable[str],
        option: str | None = None,
        timeout: float | None = COMMAND_TIMEOUT,
    ) -> GatewayMessage:
        """Acknowledge queue messages now; the processed ack comes once they are durable."""
        check_ack_option(option)
        listed = bookmarks if isinstance(bookmarks, str) else ",".join(bookmarks)
        header: dict[str, Any] = {"c": "sow_delete", "t": topic, "bm": listed, "a": "processed"}
        _set(header, o=option)
        return GatewayMessage("ack", topic, self._command(header, timeout=timeout).header)

    def _reserve(self, count: int) -> int:
        """The first of `count` consecutive sequence numbers, for this client alone."""
        return self._outbox.buffer.reserve(count)

    def publish_flush(self, timeout: float | None) -> None:
        """Wait until the gateway persisted every publish; PublishError names what failed."""
        self._command({"c": "flush"}, timeout=timeout)
        failures, self._failures = self._failures, []
        if failures:
            first = failures[0]
            raise PublishError(
                f"{len(failures)} publish(es) not persisted; first: topic {first.topic!r} "
                f"sequence {first.sequence}: {first.reason}"
            )

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        self._failed_write_handler = handler

    # -- queries and subscriptions -------------------------------------------------------
    def sow(
        self,
        topic: str,
        filter: str | None = None,
        order_by: str | None = None,
        top_n: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout: float | None = None,
        *,
        groups: bool = False,
    ) -> MessageStream:
        """The matching records (command "sow"); the stream ends after the last one.
        `groups`: group_begin and group_end around them as well (a handler's stream)."""
        header: dict[str, Any] = {
            "c": "sow",
            "t": topic,
            "a": "processed,completed",
            "bs": batch_size,
        }
        _set(header, f=filter, orderby=order_by, top_n=top_n)
        cid, replies, _ = self._open(header, self._commands, None)
        records = self._items(
            replies, self._commands, cid, keep=QUERY_GROUPS if groups else SOW, until_done=True
        )
        return MessageStream(records, lambda: self._end(self._commands, cid), idle_timeout=timeout)

    def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        bookmark: str | None = None,
        sub_id: str | None = None,
        timeout: float | None = None,
    ) -> MessageStream:
        """Live messages; with a bookmark, the log from there, COMPLETED, then live."""
        header: dict[str, Any] = {"c": "subscribe", "t": topic}
        header["a"] = "processed,completed" if bookmark is not None else "processed"
        _set(header, f=filter, o=options, bm=bookmark)
        return self._subscription(header, sub_id, timeout)

    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        sub_id: str | None = None,
        timeout: float | None = None,
    ) -> MessageStream:
        """group_begin, the snapshot ("sow"), group_end, then live "publish" and "oof"."""
        header: dict[str, Any] = {
            "c": "sow_and_subscribe",
            "t": topic,
            "a": "processed",
            "bs": batch_size,
        }
        _set(header, f=filter, o=options, orderby=order_by, top_n=top_n)
        return self._subscription(header, sub_id, timeout)

    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None,
        until: str | None,
        timeout: float | None,
    ) -> MessageStream:
        if until is not None:
            raise WrongTransport(
                "`until` needs the kafka:// transport; the gateway follows the log live"
            )
        return self.subscribe(topic, filter, bookmark=bookmark, timeout=timeout)

    def unsubscribe(self, sub_id: str = "all") -> None:
        """A sub_id with no live subscription here (ended by its idle timeout, closed,
        finished or never made) is nothing to do, as on kafka://: every subscription of
        this connection has a route, and its end already told the gateway."""
        if sub_id != "all" and sub_id not in self._subs:
            return
        self._command(
            {"c": "unsubscribe", "sub_id": sub_id, "a": "processed"}, timeout=COMMAND_TIMEOUT
        )
        for known in list(self._subs) if sub_id == "all" else [sub_id]:
            self._end(self._subs, known)

    def _subscription(
        self, header: dict[str, Any], sub_id: str | None, timeout: float | None
    ) -> MessageStream:
        sub_id, deliveries, _ = self._open(header, self._subs, sub_id)
        items = self._items(deliveries, self._subs, sub_id)
        return MessageStream(
            items,
            lambda: self._stop_subscription(sub_id, deliveries),
            sub_id,
            idle_timeout=timeout,
        )

    def _stop_subscription(self, sub_id: str, deliveries: queue.SimpleQueue) -> None:
        if self._end(self._subs, sub_id, deliveries) and self._lost is None:
            self._send({"c": "unsubscribe", "sub_id": sub_id})

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
            frame = replies.get(timeout=timeout)
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
        clock); ends when closed, or at the completed ack when `until_done`."""
        try:
            while True:
                try:
                    frame = replies.get(timeout=TICK_INTERVAL)
                except queue.Empty:
                    yield TICK
                    continue
                if frame is _ENDED:
                    return
                if frame is _LOST:
                    raise self._lost  # type: ignore[misc]
                if frame.header.get("c") == "sow":  # a batch of records: no checks each
                    if keep is None or "sow" in keep:
                        yield from _records("sow", frame)
                    continue
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

    def _read(self) -> None:
        decoder = FrameDecoder(MAX_INBOUND_FRAME)
        reason = "the gateway closed the connection"
        try:
            while data := self._sock.recv(READ_SIZE):
                for event in decoder.feed(data):
                    if isinstance(event, Frame):
                        self._route(event)
                    else:
                        log.warning("bad frame from the gateway: %s", event.reason)
        except OSError as exc:
            reason = f"connection to the gateway lost: {exc}"
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        """The connection is gone: fail whoever waits, and every later call."""
        if self._lost is None:
            self._lost = TransportError(f"{self.address}: {reason}")
        for routes in (self._commands, self._subs):
            for replies in list(routes.values()):
                replies.put(_LOST)

    def _route(self, frame: Frame) -> None:
        header = frame.header
        replies = self._subs.get(header.get("sub_id"))  # type: ignore[arg-type]
        if replies is None:
            replies = self._commands.get(header.get("cid"))  # type: ignore[arg-type]
        if replies is not None:
            replies.put(frame)
        elif header.get("status") == "failure":
            self._unrouted_failure(header)

    def _unrouted_failure(self, header: dict[str, Any]) -> None:
        """A publish the gateway refused or Kafka did not persist: a failed write."""
        if "s" not in header:
            log.warning("gateway: %s", header.get("reason"))
            return
        failure = FailedWrite(header.get("t", ""), header["s"], header.get("reason", "unknown"))
        if self._failed_write_handler is not None:
            self._failed_write_handler(failure)
        else:
            self._failures.append(failure)

    def _disconnect(self) -> None:
        self._outbox.close(CLOSE_TIMEOUT)
        with suppress(OSError):  # already gone
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(CLOSE_TIMEOUT)


def _connect(address: str, tls: TlsOptions | None) -> socket.socket | TlsSocket:
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise TransportError(f"can't connect to the gateway at {address}: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        sock.settimeout(None)
        return sock
    try:
        secured = TlsSocket(sock, tls.context(), host)  # the handshake, within the timeout
    except (AmpsError, OSError) as exc:
        sock.close()
        reason = exc.reason if isinstance(exc, AmpsError) else str(exc)
        raise TransportError(f"gateway at {address}: {reason}") from exc
    sock.settimeout(None)
    return secured


def _unanswered(tls: TlsOptions | None) -> str:
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


def _set(header: dict[str, Any], **fields: Any) -> None:
    header.update((k, v) for k, v in fields.items() if v is not None)


def _payload(data: Any) -> bytes:
    """The frame's payload; a dict, the common case, is tested first (one type check)."""
    if type(data) is not dict:
        if isinstance(data, bytes):
            return data
        if isinstance(data, bytearray | memoryview):
            return bytes(data)
        if isinstance(data, str):
            return data.encode()
        check_payload(data)
    try:
        return orjson.dumps(data)
    except TypeError as exc:
        raise MessageError(f"can't encode payload as JSON: {exc}") from exc


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


def _records(command: str, frame: Frame) -> Iterator[GatewayMessage]:
    """A batch frame's messages: `recs` describes each record, payloads follow in order.
    The compiled builder (message.batch_messages) makes them where it is sure of the
    entries; from the first it is not, this loop (its twin) goes on."""
    header, payload = frame.header, frame.payload
    topic, sub_id = header.get("t"), header.get("sub_id")
    recs, offset = header.get("recs", ()), 0
    if batch_messages is not None and type(recs) is list and type(payload) is bytes:
        built = batch_messages(recs, payload, (command, topic, sub_id))
        yield from built
        recs, offset = itertools.islice(recs, built.read, None), built.offset
    for meta in recs:
        end = offset + meta["n"]
        yield GatewayMessage(command, topic, meta, payload[offset:end], sub_id)
        offset = end


def _forget(routes: dict[str, queue.SimpleQueue], key: str, replies: queue.SimpleQueue) -> None:
    """Drop a route if it is still this one: a stream closed late (its generator collected
    after its sub_id was subscribed again) must not take the new stream's route with it."""
    if routes.get(key) is replies:
        del routes[key]
