"""A client's bookmark subscriptions: sub_ids, the bookmark store, pause/resume, controls.

Each bookmark subscription is known by its sub_id (`sub_id=`, else `default_sub_id`):
the bookmark store keeps its place under that name, and `pause`/`resume` find it by it.
A subscription's stream is built as a pipeline:

    replay (kafka://) or gateway stream (tcp://)
      -> rate limiter -> conflator          (options, kafka:// only: log/controls.py)
      -> bookmark store: log() every message, refuse what it refuses
      -> pause gate                          (checked before each read of the source)

On `kafka://` the replay runs here, so the options are applied here. On `tcp://` the
gateway runs the replay: the options except `pause` go to it in the subscribe command,
as AMPS sends them, and it applies them with the same log/controls.py; pausing holds
the stream in the client on both transports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from amps_on_kafka import MOST_RECENT
from amps_on_kafka.client.bookmark_store import BookmarkStore, SubscriptionBookmarks
from amps_on_kafka.client.kafka_transport import KafkaTransport
from amps_on_kafka.client.message import GatewayMessage
from amps_on_kafka.client.stream import TICK_INTERVAL, MessageStream
from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.bookmarks import TP, parse_bookmark
from amps_on_kafka.log.controls import (
    TICK,
    FanOut,
    PauseGate,
    RateLimiter,
    ReplayOptions,
    controlled,
    parse_options,
    resume_bookmark,
)
from amps_on_kafka.log.message import BATCH, COMPLETED, READ_BATCH, LogMessage, RecordMessage
from amps_on_kafka.log.replay import Replay


def default_sub_id(topic: str, filter: str | None) -> str:
    """`topic`, or `topic?filter`: one subscription per topic and filter unless named."""
    return topic if not filter else f"{topic}?{filter}"


class StoredMessage:
    """Mixed into the messages of a subscription that has a bookmark store.

    LogMessage has __slots__ and Replay builds one per record; rather than wrap or copy
    each, the client re-classes it to a slot-less subclass made once per subscription,
    whose class attributes say which subscription and store it belongs to.
    """

    __slots__ = ()
    bookmarks: SubscriptionBookmarks
    sub_id: str

    def discard(self) -> None:
        """Tell the bookmark store the application has finished with this message."""
        self.bookmarks.discard(self)


def bound_class(base: type, bookmarks: SubscriptionBookmarks) -> type:
    """The class a subscription's messages are re-classed to: `discard()` bound to it."""
    namespace = {"__slots__": (), "bookmarks": bookmarks}
    return type(base.__name__, (StoredMessage, base), namespace)


class _Feed:
    """Where a subscription's items come from, and how to tell where it stands."""

    def __init__(
        self,
        items: Iterator[Any],
        close: Callable[[], None],
        *,
        positions: Callable[[], dict[TP, int]] | None = None,
        topics: tuple[str, ...] = (),
        starts: dict[TP, int] | None = None,
        shareable: bool = False,
    ) -> None:
        self.items = items
        self.close = close
        self.positions = positions
        self.topics = topics
        self.starts = starts
        self.shareable = shareable  # can join other subscriptions in one replay on resume


class BookmarkSubscription:
    """One bookmark subscription: its identity, options, feed, store and pause gate."""

    def __init__(
        self,
        owner: BookmarkSubscriptions,
        transport: Any,
        sub_id: str,
        topic: str,
        filter: str | None,
        options: ReplayOptions,
        feed: _Feed,
        store: BookmarkStore | None,
        *,
        predicate: Callable[[Any], bool] | None,
        until: str | None,
        timeout: float | None,
    ) -> None:
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.options = options
        self.until = until
        self.timeout = timeout
        self.feed = feed
        self.gate = PauseGate(options.paused)
        self.shared_with: tuple[str, ...] = ()  # sub_ids fed by the same replay as this one
        self._owner = owner
        self._transport = transport
        self._predicate = predicate  # for a replay shared on resume, which has no filter
        self._closed = False
        self._completed = False
        self._fresh = True  # nothing read yet: it stands where it started
        self._reader: int | None = None  # the thread iterating the stream, once one has
        self._released = threading.Event()  # the reader has closed the feed and stopped
        self._feed_lock = threading.Lock()
        self._feed_closed = False
        kafka = isinstance(transport, KafkaTransport)
        self._stamp = kafka  # a log record learns its sub_id here (a gateway's has it)
        # a replay's records, and the LogMessages conflation or a shared replay builds
        bases = (RecordMessage, LogMessage) if kafka else (GatewayMessage,)
        self._bookmarks = store.subscription(sub_id) if store is not None else None
        bookmarks = self._bookmarks
        self._bound = {b: bound_class(b, bookmarks) for b in bases} if bookmarks else None
        self.stream = MessageStream(self._deliver(), self.close, sub_id, idle_timeout=timeout)

    @property
    def paused(self) -> bool:
        return self.gate.paused

    def positions(self) -> dict[TP, int] | None:
        """The next offset to read per partition, where it is known without counting every
        message: before the first read (the start), and for a replay shared on resume."""
        if self.feed.positions is not None:
            return self.feed.positions()
        return dict(self.feed.starts) if self._fresh and self.feed.starts is not None else None

    def _deliver(self) -> Iterator[Any]:
        """The stream. It records its reader's thread and, closed from another thread,
        closes the feed on its own (close()). The gate is checked before each read, so a
        paused subscription reads nothing more and keeps its exact place (ticking while it
        waits). One generator: each message passes through one frame here. A replay's
        batch (a BATCH: the feed of a subscription without a store) is read here message
        by message; what a pause or close leaves of it, the replay yields next."""
        self._reader = threading.get_ident()
        gate = self.gate
        log = self._bookmarks.log if self._bookmarks is not None else None
        bound, sub_id, stamp = self._bound, self.sub_id, self._stamp
        try:
            while True:
                while gate.paused and not self._closed:
                    if not gate.wait(TICK_INTERVAL):
                        yield TICK
                if self._closed:
                    return
                self._fresh = False
                for item in self.feed.items:
                    if item.__class__ is BATCH or item.__class__ is READ_BATCH:
                        for message in item:
                            message.sub_id = sub_id
                            yield message
                            if gate.paused or self._closed:
                                break
                        else:
                            continue
                        break
                    if item is TICK:
                        pass
                    elif item is COMPLETED:
                        if self._completed:
                            continue  # a replay shared on resume ends its own replay too
                        self._completed = True
                    else:
                        if stamp:
                            item.sub_id = sub_id
                        if bound is not None:
                            cls = bound.get(type(item))
                            if cls is not None:
                                item.__class__ = cls
                            if not log(item):  # type: ignore[misc]  # set when bound is
                                continue
                    yield item
                    if gate.paused or self._closed:
                        break
                else:
                    return
        finally:
            if self._closed:
                self._close_feed()  # here, on the reader's thread: never under its own poll
            self._released.set()

    def close(self) -> None:
        """End the subscription. Closed from a thread other than its reader's (an
        unsubscribe while a thread iterates), the reader closes the feed itself at its
        next message or tick (a kafka:// consumer closed under a poll in progress hangs);
        one that doesn't come back within CLOSE_WAIT is not polling, so it is closed here."""
        if self._closed:
            return
        self._closed = True
        self.gate.resume()  # a reader waiting on the gate wakes, sees closed, and ends
        reader = self._reader
        own = reader is None or reader == threading.get_ident()
        if own or not self._released.wait(CLOSE_WAIT):
            self._close_feed()
        self._owner.forget(self.sub_id)

    def _close_feed(self) -> None:
        with self._feed_lock:
            if self._feed_closed:
                return
            self._feed_closed = True
        self.feed.close()


CLOSE_WAIT = 2.0  # seconds close() waits for another thread reading the stream to stop


class BookmarkSubscriptions:
    """The bookmark subscriptions of one client, by sub_id."""

    def __init__(self) -> None:
        self.store: BookmarkStore | None = None
        self._subs: dict[str, BookmarkSubscription | None] = {}
        self._lock = threading.Lock()

    def subscribe(
        self,
        transport: Any,
        topic: str,
        bookmark: str,
        filter: str | None,
        *,
        sub_id: str | None,
        options: str | None,
        until: str | None,
        timeout: float | None,
    ) -> MessageStream:
        parsed = parse_options(options)
        sub_id = sub_id or default_sub_id(topic, filter)
        self._reserve(sub_id)
        try:
            bookmark = self._resolve(bookmark, sub_id)
            parse_bookmark(bookmark)  # InvalidBookmark here, alike on both transports
            predicate = compile_filter(filter).matches if filter else None
            if isinstance(transport, KafkaTransport):
                feed = _kafka_feed(
                    transport, topic, bookmark, predicate, parsed, until, timeout, self.store
                )
            else:
                feed = _gateway_feed(
                    transport, topic, bookmark, filter, parsed, sub_id, until, timeout
                )
            if self.store is not None and feed.starts is not None:
                self.store.note_start(sub_id, feed.starts)
            sub = BookmarkSubscription(
                self,
                transport,
                sub_id,
                topic,
                filter,
                parsed,
                feed,
                self.store,
                predicate=predicate,
                until=until,
                timeout=timeout,
            )
        except BaseException:
            self.forget(sub_id)
            raise
        with self._lock:
            self._subs[sub_id] = sub
        return sub.stream

    def _reserve(self, sub_id: str) -> None:
        with self._lock:
            if sub_id in self._subs:
                raise ValueError(
                    f"a bookmark subscription {sub_id!r} is open already; pass another sub_id="
                )
            self._subs[sub_id] = None

    def _resolve(self, bookmark: str, sub_id: str) -> str:
        """MOST_RECENT is the store's recovery point (EPOCH when it knows nothing); the
        log never sees MOST_RECENT itself."""
        if not isinstance(bookmark, str) or bookmark.strip().lower() != MOST_RECENT:
            return bookmark  # parse_bookmark names what is wrong with it
        if self.store is None:
            raise InvalidBookmark(
                "MOST_RECENT needs a bookmark store: call set_bookmark_store(...) first"
            )
        return self.store.get_most_recent(sub_id)

    def get(self, sub_id: str) -> BookmarkSubscription:
        sub = self._subs.get(sub_id)
        if sub is None:
            raise KeyError(f"no open bookmark subscription {sub_id!r}")
        return sub

    def close(self, sub_id: str = "all") -> bool:
        """Close one open subscription, or all ("all"); False if there was none (a gateway
        subscription of that name may be what is meant)."""
        with self._lock:
            found = self._subs.values() if sub_id == "all" else [self._subs.get(sub_id)]
            subs = [sub for sub in found if sub is not None]
        for sub in subs:
            sub.close()
        return bool(subs)

    def forget(self, sub_id: str) -> None:
        with self._lock:
            self._subs.pop(sub_id, None)

    def discard(self, message: Any) -> None:
        if isinstance(message, StoredMessage):
            message.discard()
        elif self.store is not None:
            self.store.discard(message)
        else:
            raise ValueError("discard needs a bookmark store: call set_bookmark_store(...)")

    def pause(self, sub_ids: str | Iterable[str]) -> None:
        for sub in self._lookup(sub_ids):
            sub.gate.pause()

    def resume(self, sub_ids: str | Iterable[str]) -> None:
        """Resume; paused subscriptions that stand at the same place, with the same rate,
        are resumed from one replay, delivered to each in one order (seed 004)."""
        subs = [sub for sub in self._lookup(sub_ids) if sub.paused]
        groups: dict[tuple, list[BookmarkSubscription]] = {}
        for sub in subs:
            key = _share_key(sub)
            if key is not None:
                groups.setdefault(key, []).append(sub)
        for group in groups.values():
            if len(group) > 1:
                _share_replay(group)
        for sub in subs:
            sub.gate.resume()

    def _lookup(self, sub_ids: str | Iterable[str]) -> list[BookmarkSubscription]:
        names = sub_ids.split(",") if isinstance(sub_ids, str) else list(sub_ids)
        return [self.get(name.strip()) for name in names if name.strip()]


def _kafka_feed(
    transport: KafkaTransport,
    topic: str,
    bookmark: str,
    predicate: Callable[[Any], bool] | None,
    options: ReplayOptions,
    until: str | None,
    timeout: float | None,
    store: BookmarkStore | None,
) -> _Feed:
    def open_replay(start: str, max_idle: float | None) -> Replay:
        return transport.bookmark_subscribe(topic, start, predicate, until, max_idle)

    # The replay ticks after each quiet poll (the stream's clock), and one bounded by
    # `until` ends where it stops (Replay.ticking). Without a store to log each message
    # in, its batches come whole (BookmarkSubscription._deliver).
    run = controlled(
        open_replay,
        bookmark,
        options,
        bounded=until is not None,
        idle_limit=timeout,
        heartbeat=TICK_INTERVAL,
        batches=store is None,
    )
    return _Feed(
        run.items,
        run.source.close,
        topics=tuple(run.replay.topics),
        starts=dict(run.replay.starts),
        shareable=options.conflation is None,
    )


def _gateway_feed(
    transport: Any,
    topic: str,
    bookmark: str,
    filter: str | None,
    options: ReplayOptions,
    sub_id: str,
    until: str | None,
    timeout: float | None,
) -> _Feed:
    if until is not None:  # the gateway decides whether it can stop at `until`
        stream = transport.bookmark_subscribe(topic, bookmark, filter, until, timeout)
    else:
        stream = transport.subscribe(
            topic, filter, options.server_options(), bookmark=bookmark, sub_id=sub_id
        )  # the subscription's own stream keeps the idle timeout
    return _Feed(stream.source, stream.close)


def _share_key(sub: BookmarkSubscription) -> tuple | None:
    positions = sub.positions() if sub.feed.shareable else None
    if positions is None:
        return None
    return (
        sub.feed.topics,
        tuple(sorted(positions.items())),
        sub.options.rate,
        sub.until,
        sub.timeout,
    )


def _share_replay(group: list[BookmarkSubscription]) -> None:
    """Close each subscription's replay and feed them all from one, opened where they
    stand, without a filter: each branch applies its subscription's own."""
    first = group[0]
    replay = first._transport.bookmark_subscribe(
        first.topic,
        resume_bookmark(first.positions() or {}),
        None,
        first.until,
        TICK_INTERVAL,
    )
    items: Iterator[Any] = replay.ticking()  # ticks, as _kafka_feed's replay does
    if first.options.rate is not None:
        items = RateLimiter(first.options.rate).paced(items)
    fan = FanOut(replay, items, [sub._predicate for sub in group])
    names = tuple(sub.sub_id for sub in group)
    for index, sub in enumerate(group):
        previous = sub.feed
        sub.feed = _Feed(
            fan.branch(index),
            partial(fan.detach, index),
            positions=partial(fan.positions, index),
            topics=previous.topics,
            shareable=True,
        )
        sub.shared_with = names
        previous.close()
