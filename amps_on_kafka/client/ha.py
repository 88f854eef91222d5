"""HAClient: a client that reconnects, resubscribes and republishes (AMPS's HAClient).

    with HAClient("orders-feed", ["kafka://k1:9092", "kafka://k2:9092"],
                  publish_store=FilePublishStore("feed.pub"),
                  bookmark_store=LoggedBookmarkStore("feed.bm")) as ha:
        ha.connect_and_logon()
        for message in ha.bookmark_subscribe("orders", MOST_RECENT, sub_id="audit"):
            ...
            message.discard()

An HAClient is a Client (both implement client/base.py's ClientBase, with the same
signatures), so `connect(uri)` and `logon()` work too. Built on the Client API only, so it
works with whichever transport a URI names. When an
operation fails with a TransportError, the HA client connects again: the chooser gives
the URI to try (round-robin by default), failures wait an exponential backoff, and on
success it republishes what the publish store holds, then each stream subscribes again
the next time it is read: bookmark subscriptions from the bookmark store's recovery
point (MOST_RECENT), so nothing is lost and, with the store's filtering, nothing is
delivered twice. With `kafka://` the Kafka client already rides over broker failures;
what fails over there is reaching the cluster (logon) and a restart of the application.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from amps_on_kafka import MOST_RECENT
from amps_on_kafka.client.base import ClientBase
from amps_on_kafka.client.bookmark_store import BookmarkStore, MemoryBookmarkStore
from amps_on_kafka.client.client import Client
from amps_on_kafka.client.kafka_transport import KafkaConfigSource
from amps_on_kafka.client.message import DeleteAck
from amps_on_kafka.client.publish_store import MemoryPublishStore, PublishStore, StoredPublish
from amps_on_kafka.client.stream import Item, MessageStream
from amps_on_kafka.client.subscriptions import BookmarkSubscription
from amps_on_kafka.client.uri import parse_uri, shown
from amps_on_kafka.errors import AmpsError, TransportError
from amps_on_kafka.log.codecs import check_payload, check_topic
from amps_on_kafka.log.message import Message
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.log.sow_deletes import check_delete_target

log = logging.getLogger(__name__)
SOW_DELETE_RESERVE = 10_000  # sequence numbers a sow_delete may use: one per record


class ServerChooser(Protocol):
    """Which server to try: the HA client asks `current()` before each attempt."""

    def current(self) -> str: ...

    def report_failure(self, uri: str, error: Exception | None) -> None: ...

    def report_success(self, uri: str) -> None: ...


class RoundRobinChooser:
    """The URIs in turn: a failure moves to the next one."""

    def __init__(self, uris: Sequence[str] = ()) -> None:
        self.uris = list(uris)
        self._index = 0
        self.failures: list[tuple[str, str]] = []  # (uri, reason), the latest last

    def current(self) -> str:
        """The URI to try next."""
        if not self.uris:
            raise TransportError("an HA client needs a server: pass URIs or call connect(uri)")
        return self.uris[self._index]

    def select(self, uri: str) -> None:
        """Make `uri` the next one tried, adding it to the list if it is new."""
        if uri not in self.uris:
            self.uris.append(uri)
        self._index = self.uris.index(uri)

    def report_failure(self, uri: str, error: Exception | None) -> None:
        """Note the failure and move on to the next URI."""
        self.failures.append((uri, str(error) if error else "failed over"))
        del self.failures[:-100]
        if self.uris[self._index] == uri:
            self._index = (self._index + 1) % len(self.uris)

    def report_success(self, uri: str) -> None:
        """Nothing to change: the chooser stays on a server that works."""


@dataclass(frozen=True)
class Backoff:
    """Waits between failed connection attempts: initial, then times factor, capped."""

    initial: float = 0.1
    maximum: float = 10.0
    factor: float = 2.0
    give_up_after: float | None = None  # seconds of failing; None: keep trying

    def delays(self) -> Iterator[float]:
        """The waits, one per failed attempt, without end."""
        delay = self.initial
        while True:
            yield delay
            delay = min(self.maximum, delay * self.factor)


class HAClient(ClientBase):
    """A Client that survives its connection: reconnect, resubscribe, republish."""

    def __init__(
        self,
        name: str,
        uris: Sequence[str] = (),
        *,
        chooser: ServerChooser | None = None,
        publish_store: PublishStore | None = None,
        bookmark_store: BookmarkStore | None = None,
        backoff: Backoff = Backoff(),
        logon_timeout: float = 5.0,
        flush_every: int | None = 1000,
    ) -> None:
        """`flush_every`: after so many publishes the HA client waits for Kafka's
        acknowledgement itself (publish_flush), so the publish store stays small."""
        super().__init__()
        for uri in uris:
            parse_uri(uri)  # a malformed URI fails here, not on every try of a retry loop
        self.name = name
        self.chooser = chooser or RoundRobinChooser(uris)
        self.publish_store = MemoryPublishStore() if publish_store is None else publish_store
        self.publish_store.claim(name)
        self._bookmark_store = MemoryBookmarkStore() if bookmark_store is None else bookmark_store
        self.backoff = backoff
        self.logon_timeout = logon_timeout
        self.flush_every = flush_every
        self.generation = 0  # one more at each new connection
        self._client: Client | None = None
        self._lock = threading.RLock()  # one lock: publishing and reconnecting both need it
        stored = self.publish_store.last_sequence() or 0
        self._sequences = itertools.count(max(time.time_ns() // 1000, stored + 1))
        self._last_sent: int | None = None
        self._unflushed = 0
        self._republished: dict[int, Any] = {}  # what the last reconnect's republish returned
        self._settings: dict[str, Callable[[Client], None]] = {}  # for every new connection
        self._kafka_configs: dict[str, KafkaConfigSource] = {}  # by URI, from connect()
        self._paused: set[str] = set()
        self._streams: list[HAStream] = []
        self._closed = False

    # -- connection -----------------------------------------------------------------------
    def connect(self, uri: str, *, kafka_config: KafkaConfigSource = None) -> None:
        """Add `uri` to the servers and make it the next one tried (with the default
        RoundRobinChooser; a custom chooser names its servers itself), with the Kafka
        client properties to use for it. As with Client, nothing connects until logon()."""
        if not isinstance(self.chooser, RoundRobinChooser):
            raise TypeError("connect(uri) needs the RoundRobinChooser; yours names the servers")
        parse_uri(uri)
        self.chooser.select(uri)
        self._kafka_configs[uri] = kafka_config

    def logon(self, timeout: float | None = None) -> None:
        """connect_and_logon; `timeout` (if given) bounds each attempt's logon."""
        if timeout is not None:
            self.logon_timeout = timeout
        self._connected()

    def connect_and_logon(self) -> None:
        """Connect to the chooser's server (trying the others as needed) and republish
        whatever the publish store holds from before."""
        self._connected()

    @property
    def client(self) -> Client:
        """The Client of the current connection."""
        return self._connected()

    def _connected(self) -> Client:
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                self._client = self._connect()
                self.generation += 1
            return self._client

    def _connect(self) -> Client:
        """A connection that logged on and took every stored publish again."""
        started = time.monotonic()
        for delay in self.backoff.delays():
            if self._closed:
                raise TransportError("the HA client is closed")
            uri = self.chooser.current()
            client = Client(self.name)
            try:
                client.connect(uri, kafka_config=self._kafka_configs.get(uri))
                client.logon(self.logon_timeout)
                for setting in self._settings.values():
                    setting(client)
                self._republish(client)
            except TransportError as exc:
                self.chooser.report_failure(uri, exc)
                with suppress(AmpsError):
                    client.close()
                limit = self.backoff.give_up_after
                if limit is not None and time.monotonic() - started + delay > limit:
                    raise TransportError(
                        f"no server answered in {limit}s; last: {shown(uri)}: {exc}"
                    ) from exc
                # By default it never gives up: without this, a wrong URI is a silent hang.
                log.warning(
                    "HA client %r: %s: %s; next try in %g s", self.name, shown(uri), exc, delay
                )
                time.sleep(delay)
                continue
            self.chooser.report_success(uri)
            client.set_bookmark_store(self._bookmark_store)
            return client
        raise AssertionError("unreachable: backoff delays never end")

    def reconnect(self, error: Exception | None = None, *, generation: int | None = None) -> None:
        """Drop the connection and fail over to the chooser's next server. What the HA
        client does itself on a TransportError; also useful to move off a server."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return  # another caller has reconnected already
            failed, self._client = self._client, None
            if failed is not None:
                self.chooser.report_failure(self.chooser.current(), error)
                with suppress(AmpsError):
                    failed.close()
            self._connected()

    def _with_client(self, operation: Callable[[Client], Any]) -> Any:
        """Run an operation; after a TransportError reconnect and run it again."""
        while True:
            client, generation = self._connected(), self.generation
            try:
                return operation(client)
            except TransportError as exc:
                self.reconnect(exc, generation=generation)

    def _setting(self, name: str, apply: Callable[[Client], None]) -> None:
        """Apply a setting now and to every connection made after this one (kept only once
        it applied, so a refused one, WrongTransport on kafka://, can't break reconnects)."""
        self._with_client(apply)
        self._settings[name] = apply

    # -- publishing -----------------------------------------------------------------------
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """Store, then publish; returns the sequence number the message carries."""
        return self._send("publish", topic, data, expiration, kw)[0]

    def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        """Store, then delta_publish; returns the sequence number the message carries."""
        return self._send("delta_publish", topic, data, expiration, kw)[0]

    def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> DeleteAck:
        """A sow_delete goes through the publish store like a publish; returns what
        Client.sow_delete returns (its records are numbered from the stored sequence)."""
        check_delete_target(filter, keys, data)  # before list() makes "123" three keys
        options = {"filter": filter, "keys": list(keys) if keys is not None else None, **kw}
        result: DeleteAck = self._send("sow_delete", topic, data, None, options)[1]
        return result

    def _send(
        self,
        command: str,
        topic: str,
        data: Any,
        expiration: float | None,
        options: dict[str, Any],
    ) -> tuple[int, Any]:
        """Store, then produce; the sequence and what the Client returned."""
        if command != "sow_delete":  # refused before the store keeps it, as by a Client
            check_topic(topic)
            check_payload(data)
        with self._lock:
            client, generation = self._connected(), self.generation  # before it is stored:
            sequence = next(self._sequences)  # connecting republishes the store
            if command == "sow_delete":  # its records are numbered from `sequence`
                self._sequences = itertools.count(sequence + SOW_DELETE_RESERVE)
            entry = StoredPublish(sequence, command, topic, data, expiration, options)
            self.publish_store.store(entry)  # before Kafka sees it: a crash can't lose it
            try:
                result = _produce(client, entry)
            except TransportError as exc:
                self.reconnect(exc, generation=generation)  # republishes it with the rest
                result = self._republished.get(sequence)
            except BaseException:  # refused, not sent: kept, it would fail every reconnect
                self.publish_store.remove(sequence)
                raise
            self._last_sent = sequence
            self._unflushed += 1
            due = self.flush_every is not None and self._unflushed >= self.flush_every
        if due:
            self.publish_flush()
        return sequence, result

    def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged every publish, then empty the publish store of
        them. A PublishError leaves them in the store, to be published again."""
        with self._lock:
            last, self._unflushed = self._last_sent, 0
        self._with_client(lambda client: client.publish_flush(timeout))
        if last is not None:
            self.publish_store.discard_up_to(last)

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        """Called for each publish Kafka refused (on this and every later connection)."""
        self._setting("failed_write_handler", lambda c: c.set_failed_write_handler(handler))

    def _republish(self, client: Client) -> None:
        """Publish again what was never acknowledged, with the original sequences."""
        self._republished = {}
        for entry in self.publish_store.unpersisted():
            self._republished[entry.sequence] = _produce(client, entry)
            self._last_sent = max(self._last_sent or 0, entry.sequence)

    # -- subscribing ----------------------------------------------------------------------
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
        """A bookmark subscription that resumes from the bookmark store's recovery point
        after every reconnect."""
        kwargs = {"sub_id": sub_id, "options": options, "until": until}
        args = (topic, bookmark, filter)
        return self._open(HAStream(self, "bookmark_subscribe", args, kwargs, timeout))

    def _open_subscription(
        self,
        topic: str,
        filter: str | None,
        options: str | None,
        *,
        sub_id: str | None,
        timeout: float | None,
    ) -> MessageStream:
        """Client.subscribe, placed again after every reconnect."""
        args = (topic, filter, options)
        return self._open(HAStream(self, "subscribe", args, {"sub_id": sub_id}, timeout))

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
        """Client.sow_and_subscribe, queried and placed again after every reconnect."""
        kwargs = {"order_by": order_by, "top_n": top_n, "batch_size": batch_size, "sub_id": sub_id}
        args = (topic, filter, options)
        return self._open(HAStream(self, "sow_and_subscribe", args, kwargs, timeout))

    def _open(self, stream: HAStream) -> HAStream:
        stream.current()  # subscribe now: a bad topic or bookmark is an error here
        self._streams.append(stream)
        return stream

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
        """Client.sow, asked again on a new connection if the request fails; a query
        interrupted while its records arrive fails with TransportError (asking again
        would deliver its first records twice)."""
        return self._with_client(  # type: ignore[no-any-return]
            lambda client: client._open_sow(
                topic,
                filter,
                order_by=order_by,
                top_n=top_n,
                batch_size=batch_size,
                timeout=timeout,
                groups=groups,
            )
        )

    def _unsubscribe(self, sub_id: str, ended: bool) -> None:
        for stream in list(self._streams):
            if sub_id == "all" or stream.sub_id == sub_id:
                stream.close()
                ended = True
        client = self._client
        if client is not None:
            with suppress(TransportError):  # a connection lost has no subscriptions
                client._unsubscribe(sub_id, ended)

    # -- bookmark stores, pause and resume -------------------------------------------------
    def set_bookmark_store(self, store: BookmarkStore | None) -> None:
        """The store for bookmark subscriptions from now on (None: a new memory store; an
        HA client always has one, to resubscribe from)."""
        self._bookmark_store = MemoryBookmarkStore() if store is None else store
        if self._client is not None:
            self._client.set_bookmark_store(self._bookmark_store)

    @property
    def bookmark_store(self) -> BookmarkStore:
        return self._bookmark_store

    def discard(self, message: Message) -> None:
        message.discard()

    def pause(self, sub_ids: str | Iterable[str]) -> None:
        names = _names(sub_ids)
        self._paused.update(names)
        self._with_client(lambda client: client.pause(names))

    def resume(self, sub_ids: str | Iterable[str]) -> None:
        names = _names(sub_ids)
        self._paused.difference_update(names)
        self._with_client(lambda client: client.resume(names))

    def bookmark_subscription(self, sub_id: str) -> BookmarkSubscription:
        return self.client.bookmark_subscription(sub_id)

    # -- queues ------------------------------------------------------------------------------
    def ack(
        self,
        topic: str,
        bookmarks: str | Iterable[str],
        option: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Message:
        """Client.ack, sent again on a new connection if the connection fails first."""
        listed = bookmarks if isinstance(bookmarks, str) else list(bookmarks)
        return self._with_client(  # type: ignore[no-any-return]
            lambda client: client.ack(topic, listed, option, timeout=timeout)
        )

    def set_ack_batch_size(self, size: int) -> None:
        self._setting("ack_batch_size", lambda client: client.set_ack_batch_size(size))

    def set_ack_timeout(self, seconds: float) -> None:
        self._setting("ack_timeout", lambda client: client.set_ack_timeout(seconds))

    def flush_acks(self) -> None:
        self._with_client(lambda client: client.flush_acks())

    def heartbeat(self, timeout: float | None = None) -> None:
        """Client.heartbeat; a server that doesn't answer is failed over from."""
        self._with_client(lambda client: client.heartbeat(timeout))

    # -- closing --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the streams and the connection; what Kafka acknowledged while closing
        leaves the publish store."""
        self._closed = True
        self._handlers.stop()
        for stream in list(self._streams):
            stream.close()
        client, self._client = self._client, None
        if client is not None:
            last = self._last_sent
            client.close()  # flushes: raises PublishError if some were not persisted
            if last is not None:
                self.publish_store.discard_up_to(last)

    def __enter__(self) -> HAClient:
        return self


class HAStream(MessageStream):
    """A subscription's messages across reconnects; iterate it like a MessageStream."""

    def __init__(
        self,
        ha: HAClient,
        kind: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> None:
        self._ha = ha
        self._kind = kind
        self._args = args
        self._kwargs = kwargs  # without the idle timeout: this stream keeps it
        self._stream: MessageStream | None = None
        self._generation = -1
        super().__init__(self._items(), self._release, kwargs.get("sub_id"), idle_timeout=timeout)

    def current(self) -> MessageStream:
        """The stream on the current connection, subscribing again after a reconnect."""
        client = self._ha._connected()
        if self._stream is not None and self._generation == self._ha.generation:
            return self._stream
        if self._stream is not None:
            with suppress(AmpsError):
                self._stream.close()
        resubscribing = self._generation >= 0
        self._generation = self._ha.generation
        self._stream = getattr(client, self._kind)(*self._place(resubscribing), **self._options())
        self.sub_id = self._stream.sub_id or self.sub_id
        return self._stream

    def _place(self, resubscribing: bool) -> tuple[Any, ...]:
        if self._kind == "bookmark_subscribe" and resubscribing:
            topic, _, filter = self._args
            return (topic, MOST_RECENT, filter)
        return self._args

    def _options(self) -> dict[str, Any]:
        kwargs = dict(self._kwargs)
        if self._kind == "bookmark_subscribe" and self.sub_id in self._ha._paused:
            kwargs["options"] = ",".join(filter(None, [kwargs.get("options"), "pause"]))
        return kwargs

    def _items(self) -> Iterator[Item]:
        """The current connection's items; after a TransportError, reconnect and go on
        from the new connection's stream."""
        while not self._closed:
            stream, generation = self.current(), self._generation
            try:
                yield from stream.source
                return
            except TransportError as exc:
                self._ha.reconnect(exc, generation=generation)

    def _release(self) -> None:
        if self._stream is not None:
            self._stream.close()
        with suppress(ValueError):
            self._ha._streams.remove(self)

    def __enter__(self) -> HAStream:
        return self


def _produce(client: Client, entry: StoredPublish) -> Any:
    options = dict(entry.options)
    if entry.command == "sow_delete":
        filter = options.pop("filter", None)
        return client.sow_delete(
            entry.topic, filter, data=entry.data, sequence=entry.sequence, **options
        )
    publish = client.publish if entry.command == "publish" else client.delta_publish
    return publish(entry.topic, entry.data, entry.expiration, sequence=entry.sequence, **options)


def _names(sub_ids: str | Iterable[str]) -> list[str]:
    names = sub_ids.split(",") if isinstance(sub_ids, str) else list(sub_ids)
    return [name.strip() for name in names if name.strip()]
