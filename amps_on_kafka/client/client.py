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

from amps_on_kafka.client.bookmark_store import BookmarkStore
from amps_on_kafka.client.command import Command as ClientCommand
from amps_on_kafka.client.kafka_transport import KafkaConfigSource, KafkaTransport, secured
from amps_on_kafka.client.message import Message
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.client.subscriptions import BookmarkSubscription, BookmarkSubscriptions
from amps_on_kafka.client.tcp_transport import DEFAULT_BATCH, TcpTransport
from amps_on_kafka.client.uri import parse_uri
from amps_on_kafka.errors import TransportError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.publisher import FailedWrite


class Client:
    """One named connection. The name is the publisher id carried by every record."""

    def __init__(self, name: str) -> None:
        if not name or "|" in name:
            raise ValueError(f"client name {name!r} must be non-empty and hold no '|'")
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
        if endpoint.scheme == "kafka":
            bootstrap = secured(endpoint.address, kafka_config)
            self._transport = KafkaTransport(bootstrap, self.name)
        elif kafka_config is not None:
            raise TransportError(f"{uri!r}: kafka_config is for kafka:// URIs")
        elif endpoint.message_type != "json":
            raise TransportError(f"{uri!r}: the gateway speaks /amps/json only")
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
        self.transport.logon(timeout)

    @property
    def transport(self) -> KafkaTransport | TcpTransport:
        if self._transport is None:
            raise TransportError("not connected: call connect(uri) first")
        return self._transport

    def _gateway(self, what: str) -> TcpTransport:
        transport = self.transport
        if not isinstance(transport, TcpTransport):
            raise TransportError(
                f"{what} needs a worker: connect with tcp://host:port/amps/json "
                "(kafka:// only publishes and replays the log)"
            )
        return transport

    def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ----------------------------------------------------------------
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """Publish; returns the sequence number. Persisted once publish_flush returns."""
        return self.transport.publish(topic, data, expiration, Command.PUBLISH, **kw)

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
    ) -> list[int] | Message:
        """Delete SOW records by filter, by keys or by data.

        On kafka:// returns the sequence numbers of the records written (there is no
        worker to count); on tcp:// waits for the worker and returns the processed ack,
        whose `matches` is the number of records deleted.
        """
        if filter is not None:
            compile_filter(filter)  # a bad filter is refused before it reaches the log
        return self.transport.sow_delete(topic, filter=filter, keys=keys, data=data, **kw)

    def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka persisted every publish; PublishError names what failed."""
        self.transport.publish_flush(timeout)

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        """Called for each publish Kafka refused, instead of raising at publish_flush."""
        self._failed_write_handler = handler
        if self._transport is not None:
            self._transport.set_failed_write_handler(handler)

    # -- subscribing ---------------------------------------------------------------
    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = None,
        *,
        until: str | None = None,
        timeout: float | None = None,
        sub_id: str | None = None,
        options: str | None = None,
    ) -> MessageStream:
        """Replay the log from a bookmark, then follow it live.

        The stream yields messages in log order per partition, one `completed` marker
        when the replay has reached the end offsets taken at the start, then live
        messages. `until` ends the stream at a bookmark or time; `timeout` ends it after
        that many idle seconds. `bookmark` may be MOST_RECENT: the bookmark store's
        recovery point for `sub_id` (default: the topic, or `topic?filter`). `options`
        are AMPS's: "rate=1000", "rate=500KB", "rate=2x", "pause",
        "conflation=1s,conflation_key=/id", "live", "fully_durable" (docs/subscribers.md).
        """
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

    # -- bookmark stores, pause and resume (docs/subscribers.md) ------------------------
    def set_bookmark_store(self, store: BookmarkStore | None) -> None:
        """The store for bookmark subscriptions made from now on: it logs each delivered
        message, refuses duplicates and what was discarded before, resolves MOST_RECENT."""
        self._bookmarks.store = store

    @property
    def bookmark_store(self) -> BookmarkStore | None:
        return self._bookmarks.store

    def discard(self, message: Any) -> None:
        """The application has finished with this message (same as message.discard())."""
        self._bookmarks.discard(message)

    def pause(self, sub_ids: str | Iterable[str]) -> None:
        """Pause bookmark subscriptions (a sub_id, a comma-separated list, or an iterable)."""
        self._bookmarks.pause(sub_ids)

    def resume(self, sub_ids: str | Iterable[str]) -> None:
        """Resume them; those paused at the same place are delivered from one replay."""
        self._bookmarks.resume(sub_ids)

    def bookmark_subscription(self, sub_id: str) -> BookmarkSubscription:
        """An open bookmark subscription: its options, whether it is paused, and with
        which others it shares a replay."""
        return self._bookmarks.get(sub_id)

    def sow(
        self,
        topic: str,
        filter: str | None = None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout: float | None = None,
    ) -> MessageStream:
        """The SOW records that match, as of one moment; the stream ends after the last.

        `order_by` is AMPS's `/field [ASC|DESC], ...`; `top_n` keeps the first n records.
        """
        return self._gateway("sow").sow(topic, filter, order_by, top_n, batch_size, timeout)

    def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        sub_id: str | None = None,
        timeout: float | None = None,
    ) -> MessageStream:
        """Follow a topic live. On a SOW topic, `options="oof"` adds out-of-focus messages
        (reason deleted, expired or match) for records that leave the subscription.
        `timeout` ends the stream after that many idle seconds."""
        gateway = self._gateway("subscribe")
        return gateway.subscribe(topic, filter, options, sub_id=sub_id, timeout=timeout)

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
        """The snapshot (group_begin, "sow" records, group_end), then live changes, with
        no gap and no duplicate between them."""
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

    # -- queues (docs/queues.md) --------------------------------------------------
    def ack(
        self,
        topic: str,
        bookmarks: str | Iterable[str],
        option: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Message:
        """Acknowledge queue messages now, unbatched: processed (no option), "cancel" or
        "expire". Returns once the gateway made the acks durable; `matches` counts them."""
        return self._gateway("ack").ack(topic, bookmarks, option, timeout)

    def set_ack_batch_size(self, size: int) -> None:
        """message.ack() sends one sow_delete per `size` bookmarks (default 1: at once)."""
        self._gateway("ack batching").acks.configure(batch_size=size)

    def set_ack_timeout(self, seconds: float) -> None:
        """A partial batch of acks is sent this long after its first ack."""
        self._gateway("ack batching").acks.configure(timeout=seconds)

    def flush_acks(self) -> None:
        """Send the batched acks now."""
        self._gateway("ack batching").acks.flush()

    def unsubscribe(self, sub_id: str = "all") -> None:
        self._gateway("unsubscribe").unsubscribe(sub_id)

    def heartbeat(self, timeout: float | None = None) -> None:
        """Round trip to the gateway; TransportError when it doesn't answer."""
        self._gateway("heartbeat").heartbeat(timeout)

    # -- commands ------------------------------------------------------------------
    def execute(self, command: ClientCommand) -> Any:
        """Run a Command with the method of the same name; returns what that returns."""
        return _EXECUTORS[command.command](self, command)


def _publish_kw(command: ClientCommand) -> dict[str, Any]:
    kw = {"sow_key": command.sow_key, "correlation_id": command.correlation_id}
    return {k: v for k, v in kw.items() if v is not None}


def _subscribe(client: Client, c: ClientCommand) -> MessageStream:
    if c.bookmark is not None:
        return client.bookmark_subscribe(  # type: ignore[arg-type]
            c.topic, c.bookmark, c.filter, timeout=c.timeout, sub_id=c.sub_id, options=c.options
        )
    return client.subscribe(c.topic, c.filter, c.options, sub_id=c.sub_id, timeout=c.timeout)  # type: ignore[arg-type]


_EXECUTORS: dict[str, Callable[[Client, ClientCommand], Any]] = {
    "publish": lambda client, c: client.publish(c.topic, c.data, c.expiration, **_publish_kw(c)),
    "delta_publish": lambda client, c: client.delta_publish(
        c.topic, c.data, c.expiration, **_publish_kw(c)
    ),
    "sow_delete": lambda client, c: client.sow_delete(
        c.topic, c.filter, keys=c.sow_keys, data=c.data
    ),
    "sow": lambda client, c: client.sow(
        c.topic,
        c.filter,
        order_by=c.order_by,
        top_n=c.top_n,
        batch_size=c.batch_size or DEFAULT_BATCH,
        timeout=c.timeout,
    ),
    "subscribe": _subscribe,
    "sow_and_subscribe": lambda client, c: client.sow_and_subscribe(
        c.topic,
        c.filter,
        c.options,
        order_by=c.order_by,
        top_n=c.top_n,
        batch_size=c.batch_size or DEFAULT_BATCH,
        sub_id=c.sub_id,
        timeout=c.timeout,
    ),
    "unsubscribe": lambda client, c: client.unsubscribe(c.sub_id or "all"),
    "flush": lambda client, c: client.publish_flush(c.timeout),
    "heartbeat": lambda client, c: client.heartbeat(c.timeout),
}
