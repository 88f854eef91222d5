"""The queue engine: AMPS message queues served from Kafka, durable across crashes.

Each queue has a QueueRuntime: the pure state machine (state/queue.py), a RocksDB store
(state/queue_store.py), a consumer of its underlying topics, and a queue-events topic
`_amps_queue.<Name>` (one partition) in which every ack, cancel, expiry and delivery is
recorded, as AMPS records them in its transaction log. Queue state is therefore a
function of two logs, and the store is a checkpoint of it:

- A state change happens in memory at once (an acked message is never delivered
  again), its events are produced (acks=all, idempotent), and the change reaches the
  store only in a checkpoint written after those events are durable, together with the
  offsets read and the events offset it reflects. An ack is answered when its events are
  durable.
- At startup the store is loaded (or, without one, the queue starts at the recovery
  point committed to Kafka for the group `amps-queue.<Name>`, else at the start of the
  logs); the events after the store's events offset are replayed before any delivery;
  leases are not stored, so those held at a crash are back in the queue.
- The recovery point (earliest offset in each partition with everything before it
  removed, and the events offset that can still concern those messages) is committed
  to that group, so another worker can rebuild the queue from the logs without a store.

Threads: one per queue reads its topics and runs the clock; one per queue writes its
events in transactions (processor/queue_events.py: the fence between owners). All state
is changed under `lock`; deliver callbacks are called under it and must only hand work
off.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial, partialmethod
from pathlib import Path
from typing import Any

from amps_on_kafka.config import Config
from amps_on_kafka.errors import (
    AmpsError,
    InvalidBookmark,
    PartitionsMoving,
    TransportError,
    UnknownTopic,
)
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.bookmarks import Position, parse_bookmark
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.native import core
from amps_on_kafka.processor.queue_owner import QueueOwnership
from amps_on_kafka.processor.queue_recording import Done
from amps_on_kafka.processor.queue_runtime import QueueRuntime, now_ms
from amps_on_kafka.state.queue_types import (
    AckResult,
    Delivery,
    MessageId,
    QueueEntry,
    Subscription,
    effective_backlog,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class QueueMessage:
    """A message as a queue subscriber (or a sow on the queue) sees it."""

    queue: str
    sub_id: str | None
    id: MessageId  # the underlying topic, partition and offset
    bookmark: str
    payload: bytes
    timestamp: int
    lease_ms: int | None  # the lease left, in ms; None for a barrier message or a sow
    codec: Codec | None
    headers: list[tuple[str, bytes]] | None
    deliveries: int = 0

    @property
    def data(self) -> Any:
        return self.codec.decode(self.payload) if self.codec is not None else self.payload


@dataclass(eq=False)
class QueueSubscription:
    """What `subscribe` returns: pass it to `unsubscribe`."""

    subscription: Subscription
    queues: list[str]

    @property
    def max_backlog(self) -> int:
        return self.subscription.max_backlog


Deliver = Callable[[QueueMessage], None]
# subscribe(..., burst=True): (queue, the burst's deliveries, the clock's reading)
DeliverBurst = Callable[[str, list[Delivery], int], None]
# an ack nobody waits for: verb (ack, cancel, expire), queue, messages, session, done
AckCommand = tuple[str, str, list[MessageId], Hashable, Done]


class QueueEngine:
    """Every queue of a configuration: what the gateway calls for queue commands."""

    def __init__(
        self,
        config: Config,
        bootstrap: str,
        state_dir: str | Path,
        *,
        clock: Callable[[], int] = now_ms,
        registry: TopicRegistry | None = None,
    ) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.registry = registry or TopicRegistry(bootstrap)
        self.lock = threading.RLock()
        self.settled = threading.Condition(self.lock)  # notified at the end of every settle
        self.names = [q.name for q in config.queues]
        # the queues run here: every one, or those this worker owns (`share`)
        self.runtimes = {q.name: QueueRuntime(self, q) for q in config.queues}
        self.ownership: QueueOwnership | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._stop = threading.Event()
        self._started = False

    # -- lifecycle -----------------------------------------------------------------
    def share(self, session_timeout: float) -> None:
        """Before start: run only the queues this worker is elected to own among the
        workers sharing the config (processor/queue_owner.py), not every queue."""
        self.runtimes = {}
        self.ownership = QueueOwnership(
            self.bootstrap, self.names, session_timeout, self._acquire, self._release
        )

    def on_ownership(self, listener: Callable[[str], None]) -> None:
        """`listener(name)` (election thread) after this worker gains or loses a queue."""
        self._listeners.append(listener)

    def owned(self) -> list[str]:
        return list(self.runtimes)

    def start(self) -> None:
        self._started = True
        for runtime in self.runtimes.values():
            runtime.start()
        if self.ownership is not None:
            self.ownership.start()

    def _acquire(self, name: str) -> None:
        """Elected: a fresh runtime rebuilds the queue from the store and the logs."""
        runtime = QueueRuntime(self, self.config.queue(name))  # type: ignore[arg-type]
        with self.lock:
            self.runtimes[name] = runtime
        runtime.start()
        self._tell(name)

    def _release(self, name: str) -> None:
        """Ownership moves away: stop the runtime, store what it knows, end its
        subscriptions (their clients get retry: and subscribe again, at the new owner)."""
        with self.lock:
            runtime = self.runtimes.pop(name, None)
        if runtime is None:
            return
        self._tell(name)
        runtime.halt()
        with self.lock:
            runtime.checkpoint()
        runtime.drain(30.0)
        runtime.commit_ready()
        runtime.close()

    def fenced(self, runtime: QueueRuntime) -> None:
        """The runtime's events writer was fenced (another worker took the queue while
        this one did not hear of it) or failed for good: stop it at once, without a
        checkpoint (what it changed since its last commit was never durable), end its
        subscriptions with retry:, and leave the election so that it moves."""
        with self.lock:
            if self.runtimes.get(runtime.name) is runtime:
                del self.runtimes[runtime.name]
        self._tell(runtime.name)
        runtime.join(30.0)
        runtime.close()
        if self.ownership is not None:
            self.ownership.resign(runtime.name)

    def _tell(self, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(name)
            except Exception:  # a listener's bug must not stop the election
                log.exception("queue %s: an ownership listener failed", name)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every queue has recovered and reads its topics."""
        deadline = time.monotonic() + timeout
        if self.ownership is not None and not self.ownership.wait_settled(deadline):
            raise TransportError(f"the queues' owners not elected after {timeout}s")
        for runtime in list(self.runtimes.values()):
            while not runtime.ready.wait(0.05):
                if runtime.failure is not None:
                    raise TransportError(f"queue {runtime.name}: {runtime.failure}")
                if time.monotonic() > deadline:
                    raise TransportError(f"queue {runtime.name} not ready after {timeout}s")

    def stop(self, timeout: float = 30.0) -> None:
        if not self._started:
            return
        self._started = False
        if self.ownership is not None:
            self.ownership.stop(timeout)  # releases the queues owned here
        self._stop.set()
        with self.lock:
            runtimes = list(self.runtimes.values())  # one fenced meanwhile leaves the dict
        for runtime in runtimes:
            runtime.join(timeout)
        with self.lock:
            for runtime in runtimes:
                runtime.checkpoint()
        for runtime in runtimes:
            runtime.drain(timeout)
            runtime.commit_ready()
            runtime.close()

    # -- topics --------------------------------------------------------------------
    def is_queue(self, topic: str) -> bool:
        return topic in self.names

    def publish_target(self, topic: str) -> str:
        """Seed 001: a publish to a queue's name is written to its DefaultPublishTarget."""
        return self.config.publish_target(topic)

    def serves(self, topic: str) -> bool:
        """Whether `topic` names a queue, or is a regular expression matching some."""
        try:
            return bool(self._named(topic))
        except UnknownTopic:
            return False

    def _named(self, pattern: str) -> list[str]:
        if pattern in self.names:
            return [pattern]
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise UnknownTopic(f"{pattern!r} is not a queue name or a regular expression") from exc
        found = [name for name in self.names if regex.fullmatch(name)]
        if not found:
            raise UnknownTopic(f"no queue matches {pattern!r}")
        return found

    def queue_names(self, pattern: str) -> list[str]:
        """The queues `pattern` names: itself, or those it matches as a regex."""
        return self._named(pattern)

    def owns(self, pattern: str) -> bool:
        """Whether every queue `pattern` names runs here (always, unless `share`d). A
        queue's own name, as every ack names it, is answered without a list."""
        if pattern in self.runtimes:
            return True
        return all(name in self.runtimes for name in self._named(pattern))

    def _matching(self, pattern: str) -> list[QueueRuntime]:
        return [self._runtime(name) for name in self._named(pattern)]

    def _runtime(self, queue: str) -> QueueRuntime:
        runtime = self.runtimes.get(queue)
        if runtime is None:
            if queue in self.names:
                raise PartitionsMoving(f"retry: queue moving ({queue} is not served here now)")
            raise UnknownTopic(f"{queue!r} is not a queue of this worker")
        return _serving(runtime)

    # -- subscribers ---------------------------------------------------------------
    def subscribe(
        self,
        pattern: str,
        deliver: Deliver | DeliverBurst,
        *,
        session: Hashable,
        sub_id: str,
        filter: str | None = None,
        max_backlog: int | None = None,
        burst: bool = False,
    ) -> QueueSubscription:
        """Subscribe to every queue `pattern` names; messages are pushed to `deliver`,
        one at a time, or with `burst` a burst at a time: `deliver(queue, deliveries,
        now)`, each burst's deliveries from one queue in order, leased until
        `lease_until` (None: a barrier) as of the clock's reading `now`, for a caller
        that writes them into its frames itself (the gateway's batched frames: no
        QueueMessage a message). Called under the engine lock: read them there.

        The backlog is the smaller of `max_backlog` (default 1) and the smallest
        MaxPerSubscriptionBacklog of the matched queues, shared across them.
        """
        runtimes = self._matching(pattern)
        matches = compile_filter(filter).matches if filter else None
        backlog = effective_backlog(max_backlog, [r.state.policy for r in runtimes])
        subscription = Subscription(sub_id, session, matches, backlog, deliver=deliver, burst=burst)
        with self.lock:
            for runtime in runtimes:
                runtime.state.subscribe(subscription)
            self.settle()
        return QueueSubscription(subscription, [r.name for r in runtimes])

    def unsubscribe(self, handle: QueueSubscription) -> None:
        """The subscription's leases are broken: its messages go back to the queue."""
        with self.lock:
            for name in handle.queues:
                runtime = self.runtimes.get(name)  # None: the queue moved to another worker
                if runtime is not None:
                    runtime.state.unsubscribe(handle.subscription)
            self.settle()

    def disconnect(self, session: Hashable) -> None:
        """Seed 002: a disconnect breaks every lease the session holds, at once."""
        with self.lock:
            for runtime in self.runtimes.values():
                runtime.state.disconnect(session)
            self.settle()

    def _command(
        self,
        verb: str,
        queue: str,
        bookmarks: str | Iterable[str],
        session: Hashable,
        done: Done | None = None,
    ) -> Future | None:
        """sow_delete with bookmarks (a comma-separated list): ack, cancel or expire. Once
        the changes are durable in the queue-events topic, their AckResult (or the error)
        is set on the future returned, or passed to `done` when given (then nothing is
        returned: acks come by the thousand, and a future costs more than the ack)."""
        runtime = self._runtime(queue)
        messages = _message_ids(bookmarks)
        with self.lock:
            result = getattr(runtime.state, verb)(messages, session)
            self.settle()
            return runtime.finish(result, done)

    ack = partialmethod(_command, "ack")
    cancel = partialmethod(_command, "cancel")
    expire = partialmethod(_command, "expire")

    def ack_ids(self, queue: str, bookmarks: str) -> list[MessageId]:
        """The messages an ack names, checked as `ack` checks them (the queue served
        here, the bookmarks well formed), for `ack_many` to apply later."""
        self._runtime(queue)
        return _message_ids(bookmarks)

    def ack_many(self, commands: list[AckCommand]) -> None:
        """Acks nobody waits for (verb, queue, message ids, session, done), from any
        sessions, applied together: one lock, one settle (so one events record a queue),
        one wait for durability a queue. Each `done` gets its AckResult, or the error."""
        applied: dict[QueueRuntime, list[tuple[Done, AckResult]]] = {}
        with self.lock:
            for verb, queue, messages, session, done in commands:
                try:
                    runtime = self._runtime(queue)  # it may have moved since ack_ids
                except AmpsError as exc:
                    done(exc)
                    continue
                result = getattr(runtime.state, verb)(messages, session)
                applied.setdefault(runtime, []).append((done, result))
            self.settle()
            for runtime, results in applied.items():
                runtime.finish(results, partial(_settle_each, results))

    def ack_by_filter(
        self, queue: str, filter: str, session: Hashable, done: Done | None = None
    ) -> Future | None:
        """sow_delete with a filter on a queue: acks every active message that matches."""
        runtime = self._runtime(queue)
        matches = compile_filter(filter).matches
        with self.lock:
            count = runtime.state.ack_by_filter(matches, session)
            self.settle()
            return runtime.finish(AckResult(count), done)

    def browse(self, queue: str, filter: str | None = None) -> list[QueueMessage]:
        """sow on a queue: its active messages, in delivery order."""
        runtime = self._runtime(queue)
        matches = compile_filter(filter).matches if filter else None
        with self.lock:
            entries = runtime.state.browse(matches)
        return [_message(runtime.name, None, e, None) for e in entries]

    # -- under the lock --------------------------------------------------------------
    def settle(self) -> None:
        """Deliver what can be delivered in every queue, and record what changed."""
        for runtime in self.runtimes.values():
            runtime.state.dispatch()
            runtime.flush()
        self.settled.notify_all()

    def wait_until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Block until `condition` (checked under the lock) holds after some settle: every
        change of queue state ends in one. False after `timeout` seconds."""
        with self.settled:
            return self.settled.wait_for(condition, timeout)

    def send(self, queue: str, deliveries: list[Delivery]) -> None:
        """Hand `queue`'s deliveries to their subscribers, in order: a QueueMessage a
        call, or a subscription that takes bursts its deliveries of this call at once."""
        bursts: dict[Subscription, list[Delivery]] = {}
        singles: list[Delivery] = []
        for delivery in deliveries:
            subscription = delivery.subscription
            if subscription.burst:
                burst = bursts.get(subscription)
                if burst is None:
                    burst = bursts[subscription] = []
                burst.append(delivery)
            else:
                singles.append(delivery)
        now = self.clock()
        if singles:
            for delivery, message in zip(singles, messages_of(queue, singles, now), strict=True):
                _hand(queue, delivery.subscription, message)
        for subscription, burst in bursts.items():
            _hand(queue, subscription, queue, burst, now)


def _hand(queue: str, subscription: Subscription, *what: Any) -> None:
    """A subscriber's failure is its own: the others still get theirs."""
    try:
        subscription.deliver(*what)  # type: ignore[misc]
    except Exception:
        log.exception("queue %s: delivering to %s failed", queue, subscription.sub_id)


def _settle_each(results: list[tuple[Done, AckResult]], outcome: Any) -> None:
    """Once a batch of acks is durable: each its own result; or all the error."""
    for done, result in results:
        done(outcome if isinstance(outcome, BaseException) else result)


def _serving(runtime: QueueRuntime) -> QueueRuntime:
    """A queue serves commands once recovered: before, an acked message could still be
    waiting for its ack to be replayed."""
    if not runtime.ready.is_set():
        raise PartitionsMoving(f"retry: queue moving (queue {runtime.name} is recovering)")
    return runtime


def _message(queue: str, sub_id: str | None, entry: QueueEntry, lease: int | None) -> QueueMessage:
    return QueueMessage(
        queue,
        sub_id,
        entry.id,
        entry.bookmark,
        entry.payload,
        entry.timestamp,
        lease,
        entry.codec,
        entry.headers,
        entry.deliveries,
    )


def _messages_twin(queue: str, deliveries: list[Delivery], now: int) -> list[QueueMessage]:
    """messages_of in Python: what the compiled core leaves to it, or all without it."""
    return [
        _message(
            queue,
            delivery.subscription.sub_id,
            delivery.entry,
            None if delivery.lease_until is None else delivery.lease_until - now,
        )
        for delivery in deliveries
    ]


# The message of each delivery of a queue, in order, leased for what is left of its
# lease at `now` (ms) or None for a barrier. The compiled core writes each QueueMessage's
# slots directly (the twin: ~0.6 us a message, on the thread whose change freed room).
messages_of: Callable[[str, list[Delivery], int], list[QueueMessage]] = (
    core.MessageMaker(QueueMessage, Delivery, Subscription, QueueEntry, _messages_twin).make
    if core is not None
    else _messages_twin
)


def _message_ids(bookmarks: str | Iterable[str]) -> list[MessageId]:
    """Message bookmarks (`topic|partition|offset|`, comma-separated lists too).

    Acks carry them by the thousand, so the common form is split directly (by the
    compiled core when it is loaded: native/src/acks.rs, a list of them all or None);
    anything else goes through parse_bookmark for its error message.
    """
    if _compiled_ids is not None and type(bookmarks) is str:
        ids = _compiled_ids(bookmarks)
        if ids is not None:
            return ids
    return _message_ids_twin(bookmarks)


_compiled_ids = core.message_ids if core is not None else None


def _message_ids_twin(bookmarks: str | Iterable[str]) -> list[MessageId]:
    """_message_ids in Python: what the compiled split leaves, or all without it."""
    texts = [bookmarks] if isinstance(bookmarks, str) else list(bookmarks)
    ids: list[MessageId] = []
    for text in texts:
        for item in text.split(","):
            parts = item.split("|")
            if len(parts) == 4 and not parts[3] and parts[1].isdigit() and parts[2].isdigit():
                ids.append((parts[0], int(parts[1]), int(parts[2])))
            else:
                ids.append(_parsed_id(item))
    return ids


def _parsed_id(text: str) -> MessageId:
    position = parse_bookmark(text.strip())
    if not isinstance(position, Position):
        raise InvalidBookmark(f"{text!r}: a queue ack needs message bookmarks")
    return (position.topic, position.partition, position.offset)
