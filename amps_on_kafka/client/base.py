"""`ClientBase`: the client API, once, for `Client` and `HAClient` (and `AsyncClient`'s
engine).

Every public method is declared here with its signature and docstring; `Client` and
`HAClient` implement them, so the two can't drift apart (tests/client_api compares their
signatures, and mypy checks each override). What all clients do the same way is written
here once: the three styles of receiving (an iterator, or `on_message=` handlers run on
a client thread), `execute` and `execute_async` of a `Command`, and `unsubscribe`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from amps_on_kafka.client.bookmark_store import BookmarkStore
from amps_on_kafka.client.command import Command
from amps_on_kafka.client.handlers import Dispatcher, Handler
from amps_on_kafka.client.kafka_transport import KafkaConfigSource
from amps_on_kafka.client.message import DeleteAck
from amps_on_kafka.client.stream import MessageStream, check_timeout
from amps_on_kafka.client.subscriptions import BookmarkSubscription
from amps_on_kafka.client.tcp_transport import DEFAULT_BATCH
from amps_on_kafka.errors import OptionError
from amps_on_kafka.log.message import Message
from amps_on_kafka.log.publisher import FailedWrite

R = TypeVar("R")
STREAM_COMMANDS = frozenset({"sow", "subscribe", "sow_and_subscribe"})
QUERY_OPTIONS = frozenset({"oof"})  # what a gateway's sow_and_subscribe takes


class ClientBase(ABC):
    """One named connection. The name is the publisher id carried by every record."""

    name: str

    def __init__(self) -> None:
        self._handlers = Dispatcher()

    # -- connection -------------------------------------------------------------------
    @abstractmethod
    def connect(self, uri: str, *, kafka_config: KafkaConfigSource = None) -> None:
        """Where to connect: `kafka://host:port[,host:port]` (the log, no worker needed)
        or `tcp://host:port/amps/json` (a worker's gateway). `kafka_config` (kafka://
        only): Kafka client properties, a mapping or a properties file's path."""

    @abstractmethod
    def logon(self, timeout: float | None = None) -> None:
        """Reach the server; TransportError if it doesn't answer within `timeout` s."""

    @abstractmethod
    def close(self) -> None:
        """Stop handlers, close streams, flush what was published, disconnect."""

    def __enter__(self) -> ClientBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ---------------------------------------------------------------------
    @abstractmethod
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """Publish; returns the sequence number. Persisted once publish_flush returns.
        `data` is a dict, str or bytes (another type, or a topic that is not a str, is a
        TypeError on every client); `expiration` in seconds. For an Avro topic, str
        and bytes are JSON text (as on the gateway's wire), encoded with the topic's
        schema: Avro bytes already encoded are refused, alike on both transports."""

    @abstractmethod
    def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        """Publish a change: the worker merges it into the SOW record of the same key."""

    @abstractmethod
    def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> DeleteAck:
        """Delete SOW records by filter, by keys or by data (exactly one of them).

        Returns a `DeleteAck`, a Message with the same attributes on both transports:
        `topic`, `sequence` (of the first record written), `correlation_id`, `matches`
        and `ack_type`. On tcp:// it waits (up to `timeout=` s) for the worker, whose
        processed ack counts the records deleted in `matches`; on kafka:// there is no
        worker to count, so `matches` and `ack_type` are None.
        """

    @abstractmethod
    def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka persisted every publish; PublishError names what failed."""

    @abstractmethod
    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        """Called for each publish Kafka refused, instead of raising at publish_flush."""

    # -- receiving: iterator or handler -----------------------------------------------------
    @overload
    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = ...,
        *,
        until: str | None = ...,
        timeout: float | None = ...,
        sub_id: str | None = ...,
        options: str | None = ...,
        on_message: None = ...,
    ) -> MessageStream: ...

    @overload
    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = ...,
        *,
        until: str | None = ...,
        timeout: float | None = ...,
        sub_id: str | None = ...,
        options: str | None = ...,
        on_message: Handler,
    ) -> str: ...

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
        on_message: Handler | None = None,
    ) -> MessageStream | str:
        """Replay the log from a bookmark, then follow it live.

        The stream yields messages in log order per partition, one `COMPLETED` marker
        when the replay has reached the end offsets taken at the start, then live
        messages. `until` ends the stream at a bookmark or time; `timeout` ends it after
        that many idle seconds. `bookmark` may be MOST_RECENT: the bookmark store's
        recovery point for `sub_id` (default: the topic, or `topic?filter`). `options`
        are AMPS's: "rate=1000", "rate=500KB", "rate=2x", "pause",
        "conflation=1s,conflation_key=/id", "live", "fully_durable" (docs/subscribers.md).
        With `on_message`, the messages go to that handler on a client thread and the
        sub_id is returned instead of a stream.
        """
        check_timeout(timeout)  # before anything is opened
        stream = self._open_bookmark_subscription(
            topic, bookmark, filter, until=until, timeout=timeout, sub_id=sub_id, options=options
        )
        return self._deliver(stream, on_message)

    @overload
    def subscribe(
        self,
        topic: str,
        filter: str | None = ...,
        options: str | None = ...,
        *,
        sub_id: str | None = ...,
        timeout: float | None = ...,
        on_message: None = ...,
    ) -> MessageStream: ...

    @overload
    def subscribe(
        self,
        topic: str,
        filter: str | None = ...,
        options: str | None = ...,
        *,
        sub_id: str | None = ...,
        timeout: float | None = ...,
        on_message: Handler,
    ) -> str: ...

    def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        sub_id: str | None = None,
        timeout: float | None = None,
        on_message: Handler | None = None,
    ) -> MessageStream | str:
        """Follow a topic live (tcp:// only). On a SOW topic, `options="oof"` adds
        out-of-focus messages (reason deleted, expired or match) for records that leave
        the subscription. `timeout` ends the stream after that many idle seconds. With
        `on_message`, the messages go to that handler on a client thread and the sub_id
        is returned instead of a stream."""
        check_timeout(timeout)  # before anything is opened
        stream = self._open_subscription(topic, filter, options, sub_id=sub_id, timeout=timeout)
        return self._deliver(stream, on_message)

    @overload
    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = ...,
        options: str | None = ...,
        *,
        order_by: str | None = ...,
        top_n: int | None = ...,
        batch_size: int = ...,
        sub_id: str | None = ...,
        timeout: float | None = ...,
        on_message: None = ...,
    ) -> MessageStream: ...

    @overload
    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = ...,
        options: str | None = ...,
        *,
        order_by: str | None = ...,
        top_n: int | None = ...,
        batch_size: int = ...,
        sub_id: str | None = ...,
        timeout: float | None = ...,
        on_message: Handler,
    ) -> str: ...

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
        on_message: Handler | None = None,
    ) -> MessageStream | str:
        """The snapshot (group_begin, "sow" records, group_end), then live changes, with
        no gap and no duplicate between them (tcp:// only). With `on_message`, the
        messages go to that handler on a client thread and the sub_id is returned."""
        check_timeout(timeout)  # before anything is opened
        check_query(top_n, batch_size, options)
        stream = self._open_sow_and_subscribe(
            topic,
            filter,
            options,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            sub_id=sub_id,
            timeout=timeout,
        )
        return self._deliver(stream, on_message)

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
        """The SOW records that match, as of one moment; the stream ends after the last
        (tcp:// only). `order_by` is AMPS's `/field [ASC|DESC], ...`; `top_n` keeps the
        first n records. For a handler, use execute_async(Command("sow")...), which
        delivers group_begin before the records and group_end after them."""
        return self._query(
            topic,
            filter,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            timeout=timeout,
            groups=False,
        )

    def _query(
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
        check_timeout(timeout)  # before anything is opened
        check_query(top_n, batch_size)
        return self._open_sow(
            topic,
            filter,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            timeout=timeout,
            groups=groups,
        )

    @abstractmethod
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
        """`groups`: the stream keeps the query's group_begin and group_end (a handler's
        end-of-query signal, as in AMPS); an iterator gets the records only."""

    def _deliver(self, stream: MessageStream, on_message: Handler | None) -> MessageStream | str:
        if on_message is None:
            return stream
        return self._handlers.start(stream, on_message)

    @abstractmethod
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
    ) -> MessageStream: ...

    @abstractmethod
    def _open_subscription(
        self,
        topic: str,
        filter: str | None,
        options: str | None,
        *,
        sub_id: str | None,
        timeout: float | None,
    ) -> MessageStream: ...

    @abstractmethod
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
    ) -> MessageStream: ...

    def unsubscribe(self, sub_id: str = "all") -> None:
        """End a subscription by its sub_id ("all": every one): its handler thread stops,
        its stream ends, and the gateway (tcp://) stops sending it."""
        ended = self._handlers.stop(sub_id)
        self._unsubscribe(sub_id, ended)

    @abstractmethod
    def _unsubscribe(self, sub_id: str, ended: bool) -> None:
        """`ended`: a handler's stream of that sub_id was closed already, which told the
        gateway; nothing more to send for it."""

    # -- bookmark stores, pause and resume (docs/subscribers.md) ---------------------------
    @abstractmethod
    def set_bookmark_store(self, store: BookmarkStore | None) -> None:
        """The store for bookmark subscriptions made from now on: it logs each delivered
        message, refuses duplicates and what was discarded before, resolves MOST_RECENT."""

    @property
    @abstractmethod
    def bookmark_store(self) -> BookmarkStore | None:
        """The store set_bookmark_store gave (an HAClient always has one)."""

    @abstractmethod
    def discard(self, message: Message) -> None:
        """The application has finished with this message (same as message.discard())."""

    @abstractmethod
    def pause(self, sub_ids: str | Iterable[str]) -> None:
        """Pause bookmark subscriptions (a sub_id, a comma-separated list, or an iterable)."""

    @abstractmethod
    def resume(self, sub_ids: str | Iterable[str]) -> None:
        """Resume them; those paused at the same place are delivered from one replay."""

    @abstractmethod
    def bookmark_subscription(self, sub_id: str) -> BookmarkSubscription:
        """An open bookmark subscription: its options, whether it is paused, and with
        which others it shares a replay."""

    # -- queues (docs/queues.md) -----------------------------------------------------------
    @abstractmethod
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

    @abstractmethod
    def set_ack_batch_size(self, size: int) -> None:
        """message.ack() sends one sow_delete per `size` bookmarks (default 1: at once)."""

    @abstractmethod
    def set_ack_timeout(self, seconds: float) -> None:
        """A partial batch of acks is sent this long after its first ack."""

    @abstractmethod
    def flush_acks(self) -> None:
        """Send the batched acks now."""

    @abstractmethod
    def heartbeat(self, timeout: float | None = None) -> None:
        """Round trip to the gateway; TransportError when it doesn't answer."""

    # -- commands ---------------------------------------------------------------------------
    def execute(self, command: Command[R]) -> R:
        """Run a Command with the method of the same name; returns what that returns (a
        MessageStream for sow, subscribe and sow_and_subscribe; a type checker reads it
        from the command's name)."""
        return _EXECUTORS[command.command](self, command)  # type: ignore[no-any-return]

    def _execute(self, command: Command[Any], *, handled: bool) -> Any:
        """execute; for a handler (`handled`), a query's stream keeps its group_begin and
        group_end: a handler has no end of iteration to learn the query ended from."""
        if handled and command.command == "sow":
            return _query(self, command, groups=True)
        return self.execute(command)

    def execute_async(self, command: Command[Any], handler: Handler) -> str:
        """Run a Command and give its messages to `handler` on a client thread; returns the
        command id (the sub_id of a subscription). A query (sow) delivers group_begin,
        the records, then group_end, its last message, as AMPS does. A command without a
        stream (publish, flush, ...) runs now, on the calling thread, and `handler` gets
        its ack message if it has one (a sow_delete's DeleteAck)."""
        if command.command in STREAM_COMMANDS:
            return self._handlers.start(self._execute(command, handled=True), handler)
        result = self.execute(command)
        if isinstance(result, Message):
            handler(result)
        return command.sub_id or self._handlers.new_id()


def _publish_kw(command: Command[Any]) -> dict[str, Any]:
    kw = {"sow_key": command.sow_key, "correlation_id": command.correlation_id}
    return {k: v for k, v in kw.items() if v is not None}


def _topic(command: Command[Any]) -> str:
    if command.topic is None:
        raise ValueError(f"{command!r} needs a topic: call set_topic(...)")
    return command.topic


def _subscribe(client: ClientBase, c: Command[Any]) -> MessageStream:
    if c.bookmark is not None:
        return client.bookmark_subscribe(
            _topic(c), c.bookmark, c.filter, timeout=c.timeout, sub_id=c.sub_id, options=c.options
        )
    return client.subscribe(_topic(c), c.filter, c.options, sub_id=c.sub_id, timeout=c.timeout)


def _query(client: ClientBase, c: Command[Any], *, groups: bool = False) -> MessageStream:
    return client._query(
        _topic(c),
        c.filter,
        order_by=c.order_by,
        top_n=c.top_n,
        batch_size=c.batch_size or DEFAULT_BATCH,
        timeout=c.timeout,
        groups=groups,
    )


MAX_COUNT = 2**63 - 1  # the largest count a frame's header can carry (a signed 64-bit int)


def check_query(top_n: object, batch_size: object, options: str | None = None) -> None:
    """A query's arguments, checked before sending as the gateway would check them, so a
    bad one is the same error on every client: ValueError (OptionError for options)."""
    for name, value in (("top_n", top_n), ("batch_size", batch_size)):
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"{name} must be a whole number >= 0 or None, not {value!r}")
        if value is not None and value > MAX_COUNT:  # was orjson's TypeError, sending it
            raise ValueError(f"{name} must be at most {MAX_COUNT} (64 bits), not {value!r}")
    if not options:
        return
    given = {word.strip() for word in options.split(",")} - {""}
    if given - QUERY_OPTIONS:
        unknown = ", ".join(sorted(given - QUERY_OPTIONS))
        raise OptionError(f"sow_and_subscribe takes option oof only, not {unknown!r}")


_EXECUTORS: dict[str, Callable[[ClientBase, Command[Any]], Any]] = {
    "publish": lambda client, c: client.publish(_topic(c), c.data, c.expiration, **_publish_kw(c)),
    "delta_publish": lambda client, c: client.delta_publish(
        _topic(c), c.data, c.expiration, **_publish_kw(c)
    ),
    "sow_delete": lambda client, c: client.sow_delete(
        _topic(c), c.filter, keys=c.sow_keys, data=c.data
    ),
    "sow": _query,
    "subscribe": _subscribe,
    "sow_and_subscribe": lambda client, c: client.sow_and_subscribe(
        _topic(c),
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
