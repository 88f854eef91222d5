"""HAClient: a client that reconnects, resubscribes and republishes (AMPS's HAClient).

    with HAClient("orders-feed", ["kafka://k1:9092", "kafka://k2:9092"],
                  publish_store=FilePublishStore("feed.pub"),
                  bookmark_store=LoggedBookmarkStore("feed.bm")) as ha:
        ha.connect_and_logon()
        for message in ha.bookmark_subscribe("orders", MOST_RECENT, sub_id="audit"):
            ...
            message.discard()

Built on the Client API only, so it works with whichever transport a URI names. When an
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
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from amps_on_kafka import MOST_RECENT
from amps_on_kafka.client.bookmark_store import BookmarkStore, MemoryBookmarkStore
from amps_on_kafka.client.client import Client
from amps_on_kafka.client.publish_store import MemoryPublishStore, PublishStore, StoredPublish
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.errors import AmpsError, TransportError

SOW_DELETE_RESERVE = 10_000  # sequence numbers a sow_delete may use: one per record


class ServerChooser(Protocol):
    def current(self) -> str: ...

    def report_failure(self, uri: str, error: Exception | None) -> None: ...

    def report_success(self, uri: str) -> None: ...


class RoundRobinChooser:
    """The URIs in turn: a failure moves to the next one."""

    def __init__(self, uris: Sequence[str]) -> None:
        if not uris:
            raise ValueError("an HA client needs at least one URI")
        self.uris = list(uris)
        self._index = 0
        self.failures: list[tuple[str, str]] = []  # (uri, reason), the latest last

    def current(self) -> str:
        return self.uris[self._index]

    def report_failure(self, uri: str, error: Exception | None) -> None:
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
        delay = self.initial
        while True:
            yield delay
            delay = min(self.maximum, delay * self.factor)


class HAClient:
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
        self.name = name
        self.chooser = chooser or RoundRobinChooser(uris)
        self.publish_store = MemoryPublishStore() if publish_store is None else publish_store
        self.publish_store.claim(name)
        self.bookmark_store = MemoryBookmarkStore() if bookmark_store is None else bookmark_store
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
        self._paused: set[str] = set()
        self._streams: list[HAStream] = []
        self._closed = False

    # -- connection -----------------------------------------------------------------------
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
                client.connect(uri)
                client.logon(self.logon_timeout)
                self._republish(client)
            except TransportError as exc:
                self.chooser.report_failure(uri, exc)
                with suppress(AmpsError):
                    client.close()
                limit = self.backoff.give_up_after
                if limit is not None and time.monotonic() - started + delay > limit:
                    raise TransportError(
                        f"no server answered in {limit}s; last: {uri}: {exc}"
                    ) from exc
                time.sleep(delay)
                continue
            self.chooser.report_success(uri)
            client.set_bookmark_store(self.bookmark_store)
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

    # -- publishing -----------------------------------------------------------------------
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """Store, then publish; returns the sequence number the message carries."""
        return self._send("publish", topic, data, expiration, kw)

    def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        return self._send("delta_publish", topic, data, expiration, kw)

    def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> int:
        """A sow_delete goes through the publish store like a publish; returns the first
        sequence number its records carry."""
        options = {"filter": filter, "keys": list(keys) if keys is not None else None, **kw}
        return self._send("sow_delete", topic, data, None, options)

    def _send(
        self,
        command: str,
        topic: str,
        data: Any,
        expiration: float | None,
        options: dict[str, Any],
    ) -> int:
        with self._lock:
            client, generation = self._connected(), self.generation  # before it is stored:
            sequence = next(self._sequences)  # connecting republishes the store
            if command == "sow_delete":  # its records are numbered from `sequence`
                self._sequences = itertools.count(sequence + SOW_DELETE_RESERVE)
            entry = StoredPublish(sequence, command, topic, data, expiration, options)
            self.publish_store.store(entry)  # before Kafka sees it: a crash can't lose it
            try:
                _produce(client, entry)
            except TransportError as exc:
                self.reconnect(exc, generation=generation)  # republishes it with the rest
            self._last_sent = sequence
            self._unflushed += 1
            due = self.flush_every is not None and self._unflushed >= self.flush_every
        if due:
            self.publish_flush()
        return sequence

    def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged every publish, then empty the publish store of
        them. A PublishError leaves them in the store, to be published again."""
        with self._lock:
            last, self._unflushed = self._last_sent, 0
        self._with_client(lambda client: client.publish_flush(timeout))
        if last is not None:
            self.publish_store.discard_up_to(last)

    def _republish(self, client: Client) -> None:
        """Publish again what was never acknowledged, with the original sequences."""
        for entry in self.publish_store.unpersisted():
            _produce(client, entry)
            self._last_sent = max(self._last_sent or 0, entry.sequence)

    # -- subscribing ----------------------------------------------------------------------
    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = None,
        *,
        sub_id: str | None = None,
        options: str | None = None,
        until: str | None = None,
        timeout: float | None = None,
    ) -> HAStream:
        """A bookmark subscription that resumes from the bookmark store's recovery point
        after every reconnect."""
        kwargs = {"sub_id": sub_id, "options": options, "until": until, "timeout": timeout}
        return self._open(HAStream(self, "bookmark_subscribe", (topic, bookmark, filter), kwargs))

    def subscribe(self, *args: Any, **kwargs: Any) -> HAStream:
        """Client.subscribe, placed again after every reconnect (where the Client has it)."""
        return self._open(HAStream(self, "subscribe", args, kwargs))

    def sow_and_subscribe(self, *args: Any, **kwargs: Any) -> HAStream:
        """Client.sow_and_subscribe, queried and placed again after every reconnect."""
        return self._open(HAStream(self, "sow_and_subscribe", args, kwargs))

    def _open(self, stream: HAStream) -> HAStream:
        stream.current()  # subscribe now: a bad topic or bookmark is an error here
        self._streams.append(stream)
        return stream

    def discard(self, message: Any) -> None:
        message.discard()

    def pause(self, sub_ids: str | Iterable[str]) -> None:
        names = _names(sub_ids)
        self._paused.update(names)
        self._with_client(lambda client: client.pause(names))

    def resume(self, sub_ids: str | Iterable[str]) -> None:
        names = _names(sub_ids)
        self._paused.difference_update(names)
        self._with_client(lambda client: client.resume(names))

    # -- closing --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the streams and the connection; what Kafka acknowledged while closing
        leaves the publish store."""
        self._closed = True
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

    def __exit__(self, *exc: object) -> None:
        self.close()


class HAStream:
    """A subscription's messages across reconnects; iterate it like a MessageStream."""

    def __init__(
        self, ha: HAClient, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._ha = ha
        self._kind = kind
        self._args = args
        self._kwargs = kwargs
        self._stream: MessageStream | None = None
        self._generation = -1
        self._closed = False
        self.sub_id: str | None = kwargs.get("sub_id")

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

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        while not self._closed:
            stream, generation = self.current(), self._generation
            try:
                return next(stream)
            except TransportError as exc:
                self._ha.reconnect(exc, generation=generation)
        raise StopIteration

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._stream is not None:
                self._stream.close()
            with suppress(ValueError):
                self._ha._streams.remove(self)

    def __enter__(self) -> HAStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _produce(client: Client, entry: StoredPublish) -> None:
    options = dict(entry.options)
    if entry.command == "sow_delete":
        filter = options.pop("filter", None)
        client.sow_delete(entry.topic, filter, data=entry.data, sequence=entry.sequence, **options)
        return
    publish = client.publish if entry.command == "publish" else client.delta_publish
    publish(entry.topic, entry.data, entry.expiration, sequence=entry.sequence, **options)


def _names(sub_ids: str | Iterable[str]) -> list[str]:
    names = sub_ids.split(",") if isinstance(sub_ids, str) else list(sub_ids)
    return [name.strip() for name in names if name.strip()]
