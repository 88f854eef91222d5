"""The adapter client: an AMPS-like API over either transport.

    with Client("pub-1") as client:
        client.connect("kafka://127.0.0.1:39092")
        client.logon()
        client.publish("orders", {"id": 1, "qty": 5})
        client.publish_flush()

`kafka://` publishes and replays straight against Kafka; `tcp://host:port/amps/json`
talks to a worker's gateway and adds what needs the worker's state: sow queries,
subscriptions to SOW changes, sow_and_subscribe and counted sow_delete acks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from amps_on_kafka.client.base import ClientBase
from amps_on_kafka.client.bookmark_store import BookmarkStore
from amps_on_kafka.client.kafka_transport import KafkaConfigSource, KafkaTransport, secured
from amps_on_kafka.client.message import DeleteAck
from amps_on_kafka.client.stream import MessageStream, wait_limit
from amps_on_kafka.client.subscriptions import BookmarkSubscription, BookmarkSubscriptions
from amps_on_kafka.client.tcp_transport import TcpTransport
from amps_on_kafka.client.uri import parse_uri, shown
from amps_on_kafka.errors import TransportError, WrongTransport
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.message import Message
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.log.sow_deletes import check_delete_target


class Client(ClientBase):
    """One named connection. The name is the publisher id carried by every record."""

    def __init__(self, name: str) -> None:
        if not name or "|" in name:
            raise ValueError(f"client name {name!r} must be non-empty and hold no '|'")
        super().__init__()
        self.name = name
        self._transport: KafkaTransport | TcpTransport | None = None
        self._failed_write_handler: Callable[[FailedWrite], None] | None = None
        self._bookmarks = BookmarkSubscriptions()

    # -- connection -------------------------------------------------------------
    def connect(self, uri: str, *, kafka_config: KafkaConfigSource = None) -> None:
        """Connect to `uri`: kafka://host:port[,host:port] or tcp://host:port/amps/json.

        `kafka_config` (kafka:// only): the Kafka client properties every producer and
        consumer of this connection uses (security.protocol, sasl.*, ssl.*...), as a
        mapping or the path of a properties file; ${env:NAME} and ${file:PATH} in values
        are resolved (docs/config.md, Connecting to a secured Kafka).
        """
        endpoint = parse_uri(uri)
        self.__dict__.pop("publish", None)  # bound to the previous transport's publisher
        if endpoint.scheme == "kafka":
            bootstrap = secured(endpoint.address, kafka_config)
            self._transport = KafkaTransport(bootstrap, self.name)
        elif kafka_config is not None:
            raise TransportError(f"{shown(uri)!r}: kafka_config is for kafka:// URIs")
        elif endpoint.message_type != "json":
            raise TransportError(f"{shown(uri)!r}: the gateway speaks /amps/json only")
        else:
            self._transport = TcpTransport(
                endpoint.address,
                self.name,
                tls=endpoint.tls,
                user=endpoint.user,
                password=endpoint.password,
            )
        self._transport.set_failed_write_handler(self._failed_write_handler)

    def logon(self, timeout: float | None = None) -> None:
        self.transport.logon(wait_limit(timeout))

    @property
    def transport(self) -> KafkaTransport | TcpTransport:
        """The connection's transport; TransportError before connect()."""
        if self._transport is None:
            raise TransportError("not connected: call connect(uri) first")
        return self._transport

    def _gateway(self, what: str) -> TcpTransport:
        transport = self.transport
        if not isinstance(transport, TcpTransport):
            raise WrongTransport(
                f"{what} needs a worker: connect with tcp://host:port/amps/json "
                "(kafka:// only publishes and replays the log)"
            )
        return transport

    def close(self) -> None:
        self._handlers.stop()
        self.__dict__.pop("publish", None)  # publishing again says: not connected
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()

    def __enter__(self) -> Client:
        return self

    # -- publishing ----------------------------------------------------------------
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """The first call binds the transport's publish_document over this method on the
        instance, so that every later one goes straight to it (on kafka://, a single
        Python frame before Kafka's produce: docs/performance.md); connect() and close()
        unbind it."""
        transport = self._transport or self.transport  # the property: an error unconnected
        publish = self.__dict__["publish"] = transport.publish_document
        return publish(topic, data, expiration, **kw)

    def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        return self.transport.publish(topic, data, expiration, Command.DELTA_PUBLISH, **kw)

    def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> DeleteAck:
        check_delete_target(filter, keys, data)  # refused here alike on both transports
        if filter is not None:
            compile_filter(filter)  # a bad filter is refused before it reaches the log
        return self.transport.sow_delete(topic, filter=filter, keys=keys, data=data, **kw)

    def publish_flush(self, timeout: float | None = None) -> None:
        self.transport.publish_flush(wait_limit(timeout))

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        self._failed_write_handler = handler
        if self._transport is not None:
            self._transport.set_failed_write_handler(handler)

    # -- subscribing ---------------------------------------------------------------
    def _open_bookmark_subscription(
        self,
        topic: str,
        bookmark: str,
        filter: str | None,
        *,
        until: str | None,
        timeout: float | None,
        sub_id: str | None,
        options: str | None,
    ) -> MessageStream:
        return self._bookmarks.subscribe(
            self.transport,
            topic,
            bookmark,
            filter,
            sub_id=sub_id,
            options=options,
            until=until,
            timeout=timeout,
        )

    def _open_subscription(
        self,
        topic: str,
        filter: str | None,
        options: str | None,
        *,
        sub_id: str | None,
        timeout: float | None,
    ) -> MessageStream:
        gateway = self._gateway("subscribe")
        return gateway.subscribe(topic, filter, options, sub_id=sub_id, timeout=timeout)

    def _open_sow_and_subscribe(
        self,
        topic: str,
        filter: str | None,
        options: str | None,
        *,
        order_by: str | None,
        top_n: int | None,
        batch_size: int,
        sub_id: str | None,
        timeout: float | None,
    ) -> MessageStream:
        return self._gateway("sow_and_subscribe").sow_and_subscribe(
            topic,
            filter,
            options,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            sub_id=sub_id,
            timeout=timeout,
        )

    def _open_sow(
        self,
        topic: str,
        filter: str | None,
        *,
        order_by: str | None,
        top_n: int | None,
        batch_size: int,
        timeout: float | None,
        groups: bool,
    ) -> MessageStream:
        gateway = self._gateway("sow")
        return gateway.sow(topic, filter, order_by, top_n, batch_size, timeout, groups=groups)

    def _unsubscribe(self, sub_id: str, ended: bool) -> None:
        """Bookmark subscriptions end here on both transports; closing a stream tells the
        gateway. A sub_id this client doesn't know (or "all") goes to the gateway."""
        ended = self._bookmarks.close(sub_id) or ended
        if isinstance(self._transport, TcpTransport) and (sub_id == "all" or not ended):
            self._transport.unsubscribe(sub_id)

    # -- bookmark stores, pause and resume (docs/subscribers.md) ------------------------
    def set_bookmark_store(self, store: BookmarkStore | None) -> None:
        self._bookmarks.store = store

    @property
    def bookmark_store(self) -> BookmarkStore | None:
        return self._bookmarks.store

    def discard(self, message: Message) -> None:
        self._bookmarks.discard(message)

    def pause(self, sub_ids: str | Iterable[str]) -> None:
        self._bookmarks.pause(sub_ids)

    def resume(self, sub_ids: str | Iterable[str]) -> None:
        self._bookmarks.resume(sub_ids)

    def bookmark_subscription(self, sub_id: str) -> BookmarkSubscription:
        return self._bookmarks.get(sub_id)

    # -- queues (docs/queues.md) --------------------------------------------------
    def ack(
        self,
        topic: str,
        bookmarks: str | Iterable[str],
        option: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Message:
        return self._gateway("ack").ack(topic, bookmarks, option, timeout)

    def set_ack_batch_size(self, size: int) -> None:
        self._gateway("ack batching").acks.configure(batch_size=size)

    def set_ack_timeout(self, seconds: float) -> None:
        self._gateway("ack batching").acks.configure(timeout=seconds)

    def flush_acks(self) -> None:
        self._gateway("ack batching").acks.flush()

    def heartbeat(self, timeout: float | None = None) -> None:
        self._gateway("heartbeat").heartbeat(wait_limit(timeout))
