"""The `tcp://host:port/amps/json` transport: everything, through a worker's gateway.

A blocking socket and one reader thread (client/tcp_connection.py). The reader decodes
frames and routes each to a queue: deliveries by `sub_id`, replies by the command id
`cid`. Callers block on their queue. A publish is sent without a command id and returns
at once (client/tcp_outbox.py queues it for the socket); the gateway reports only
failures for it, which go to the failed-write handler (or are raised by publish_flush,
the persisted ack of everything before it). Publish sequence numbers are the client's
own and are echoed on every ack.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from amps_on_kafka.client.acks import check_ack_option
from amps_on_kafka.client.message import DeleteAck, GatewayMessage
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.client.tcp_connection import (
    CLOSE_TIMEOUT,
    COMMAND_TIMEOUT,
    Item,
    TcpConnection,
    _raise_failure,
    _records,
    _unpack,
    unanswered_logon,
)
from amps_on_kafka.client.tls import TlsOptions
from amps_on_kafka.errors import AmpsError, MessageError, TransportError, WrongTransport
from amps_on_kafka.log.codecs import check_payload, check_topic
from amps_on_kafka.log.envelope import Command, check_expiration
from amps_on_kafka.log.message import COMPLETED, Completed
from amps_on_kafka.log.publisher import FailedWrite, not_persisted
from amps_on_kafka.protocol.frames import Frame

DEFAULT_BATCH = 100
MAX_PARTITIONS = 10_000  # a delete by filter writes one record per partition, at most this

SMALL_ANSWER = 2  # frames of records a query's caller reads before its stream is iterated

SOW = frozenset({"sow"})  # what a query's stream keeps for an iterator
QUERY_GROUPS = frozenset({"group_begin", "sow", "group_end"})  # and for a handler


class TcpTransport(TcpConnection):
    """The AMPS commands over a gateway connection (client/tcp_connection.py: the socket,
    the reader thread and the routes from replies to their waiters)."""

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
        self.client_name = client_name
        self.max_frame_bytes: int | None = None  # the gateway's limit, learnt at logon
        self._credentials = {"user_id": user, "pw": password}
        self._published = False
        super().__init__(address, tls)  # connects, and starts the reader thread

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
                f"{unanswered_logon(self._tls)}"
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
            raise not_persisted(failures)

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
        `groups`: group_begin and group_end around them as well (a handler's stream).

        A small answer (a look-up by key) comes in the read that brought the command's
        ack: its messages are made here, in one go, and the stream is a list's
        (`_answered`); a larger one streams, the route read as its stream is iterated."""
        header: dict[str, Any] = {
            "c": "sow",
            "t": topic,
            "a": "processed,completed",
            "bs": batch_size,
        }
        if filter is not None:  # not _set: its generator and keywords, a look-up at a time
            header["f"] = filter
        if order_by is not None or top_n is not None:
            _set(header, orderby=order_by, top_n=top_n)
        cid, replies, _ = self._open(header, self._commands, None)
        keep = QUERY_GROUPS if groups else SOW
        messages, end = self._answered(replies, keep)
        if end is None:  # more to come: the stream reads it, after what was taken
            items = self._items(replies, self._commands, cid, keep=keep, until_done=True)
            source = itertools.chain(messages, items) if messages else items
            return MessageStream(
                source, lambda: self._end(self._commands, cid), idle_timeout=timeout
            )
        self._commands.pop(cid, None)  # nothing more comes for this cid
        if isinstance(end, BaseException):  # raised after the messages before it, as _items
            return MessageStream(itertools.chain(messages, _raise(end)), _nothing)
        return MessageStream(iter(messages), _nothing, idle_timeout=timeout)

    def _answered(
        self, replies: queue.SimpleQueue[Any], keep: frozenset[str]
    ) -> tuple[list[Item], BaseException | Completed | None]:
        """The messages of the frames already routed to a query's `replies`, and how
        they end: COMPLETED (the answer is whole), the error to raise after them (a
        failure ack, a lost connection), or None (more to come). It takes at most
        SMALL_ANSWER frames of records, so a large answer still streams with bounded
        memory. Each frame is read by _items' rule (its twin for frames already routed:
        tests/client_tcp/test_small_answers.py holds the two to the same messages)."""
        messages: list[Item] = []
        batches = 0
        while batches < SMALL_ANSWER and not replies.empty():
            frame = replies.get_nowait()
            if type(frame) is not Frame:  # _LOST: the connection is gone
                return messages, self._lost
            header = frame.header
            command = header.get("c")
            if command == "sow":  # a batch of records
                messages += _records("sow", frame)
                batches += 1
            elif command == "ack":
                try:
                    _raise_failure(header)
                except AmpsError as exc:
                    return messages, exc
                if header.get("a") == "completed":
                    return messages, COMPLETED
            elif command in keep:  # a group frame a handler keeps
                messages += _unpack(frame)
        return messages, None

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


def _nothing() -> None:
    """A whole answer's stream has no route to end when it is closed."""


def _raise(error: BaseException) -> Iterator[Item]:
    """The end of a stream whose answer failed: the error, raised as it is iterated."""
    raise error
    yield  # a generator: nothing is raised until the stream gets this far


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
