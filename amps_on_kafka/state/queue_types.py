"""The values a queue is made of: messages (QueueEntry) and their Status, the events that
record every durable change, per-queue policy from the config, and what an operation returns.

Kept apart from the state machine (state/queue.py) so the store, the engine and the gateway
can share the vocabulary without the machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

from amps_on_kafka.config import QueueConfig
from amps_on_kafka.errors import MessageError
from amps_on_kafka.expr import compile_expression, compile_filter
from amps_on_kafka.log.bookmarks import format_bookmark
from amps_on_kafka.log.codecs import Codec

MessageId = tuple[str, int, int]  # Kafka topic, partition, offset: the message's bookmark
TP = tuple[str, int]
NAN_RANK = -1  # a Priority that is NULL or not an unsigned 64-bit number sorts lowest
MAX_PRIORITY = 2**64 - 1


class Status(IntEnum):
    WAITING = 0  # in the queue beyond TargetQueueDepth: not deliverable, not visible
    HELD = 1  # behind a barrier message (or the barrier itself), waiting for it
    AVAILABLE = 2
    LEASED = 3
    TAKEN = 4  # at-most-once: delivered and out of the queue, still in the backlog
    REMOVED = 5


IN_QUEUE = (Status.HELD, Status.AVAILABLE, Status.LEASED)  # the active, visible part


class Reason(StrEnum):
    """Why a message left the queue, as recorded in the events log."""

    ACK = "ack"
    EXPIRE = "expire"
    TAKEN = "taken"  # at-most-once delivery
    BARRIER = "barrier"  # a barrier message, removed once delivered


class EventKind(StrEnum):
    DELIVER = "deliver"
    CANCEL = "cancel"
    REMOVE = "remove"


# The members an ack and a delivery read, as module names: reading Status.LEASED goes
# through the enum's descriptor (~0.13 us), and each message read several.
WAITING, AVAILABLE, LEASED = Status.WAITING, Status.AVAILABLE, Status.LEASED
REMOVED = Status.REMOVED
REMOVE, ACK = EventKind.REMOVE, Reason.ACK


class QueueEvent(NamedTuple):
    """One change of durable queue state. Counts are absolute, so replay is idempotent.

    A named tuple, not a frozen dataclass: one is made for every message acked, and a
    tuple made positionally costs a third of a frozen dataclass's __init__."""

    kind: EventKind
    id: MessageId
    deliveries: int = 0
    cancels: int = 0
    reason: Reason | None = None


@dataclass(frozen=True)
class QueuePolicy:
    """A queue's configuration, in the units the state machine works in."""

    name: str
    at_most_once: bool = False
    lease_ms: int = 60_000
    expiration_ms: int | None = None
    max_backlog: int = 1000
    fairness: str = "proportional"
    max_cancels: int | None = None
    max_deliveries: int | None = None
    permissive: bool = False
    priority: Callable[[Any], Any] | None = None
    barrier: Callable[[Any], bool] | None = None
    target_depth: int | None = None

    @classmethod
    def from_config(cls, queue: QueueConfig) -> QueuePolicy:
        return cls(
            name=queue.name,
            at_most_once=queue.semantics == "at-most-once",
            lease_ms=round(queue.lease_period * 1000),
            expiration_ms=None if queue.expiration is None else round(queue.expiration * 1000),
            max_backlog=queue.max_per_subscription_backlog,
            fairness=queue.fairness,
            max_cancels=queue.max_cancels,
            max_deliveries=queue.max_deliveries,
            permissive=queue.leasing == "permissive",
            priority=compile_expression(queue.priority).evaluate if queue.priority else None,
            barrier=compile_filter(queue.barrier_expression).matches
            if queue.barrier_expression
            else None,
            target_depth=queue.target_queue_depth,
        )

    @property
    def records_deliveries(self) -> bool:
        """Whether each delivery is an event a restart must know: at-most-once (the
        message leaves the queue) or MaxDeliveries (the count)."""
        return self.at_most_once or self.max_deliveries is not None

    def rank(self, data: Any) -> int:
        """Priority as AMPS reads it: an unsigned 64-bit integer; anything else is lowest."""
        if self.priority is None:
            return 0
        value = evaluate(self.priority, data)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return NAN_RANK
        if value != value or not 0 <= value <= MAX_PRIORITY:  # NaN or out of range
            return NAN_RANK
        return int(value)

    def is_barrier(self, data: Any) -> bool:
        return self.barrier is not None and bool(evaluate(self.barrier, data))

    def deadline(self, timestamp: int, expiration: float | None) -> int | None:
        """When a message leaves the queue unread: its own expiration, else the queue's.

        A message expiration of 0 means never, as on SOW topics.
        """
        if expiration is not None:
            return None if expiration == 0 else timestamp + round(expiration * 1000)
        return None if self.expiration_ms is None else timestamp + self.expiration_ms


def evaluate(function: Callable[[Any], Any], data: Any) -> Any:
    try:
        return function(data)
    except MessageError:  # a payload that doesn't decode has no fields
        return None


def effective_backlog(requested: int | None, policies: Iterable[QueuePolicy]) -> int:
    """Seed 002: the minimum of the subscription's max_backlog (default 1) and the smallest
    MaxPerSubscriptionBacklog of the queues it matches."""
    limits = [p.max_backlog for p in policies]
    wanted = 1 if requested is None else requested
    return min([wanted, *limits])


@dataclass(eq=False, slots=True)
class Subscription:
    """A queue subscriber. One object is shared by every queue its topic pattern matches,
    so its backlog is counted across all of them. `deliver` (and `burst`: it takes a
    list of messages) is for the caller; the state machine never calls it."""

    sub_id: str
    session: Hashable
    filter: Callable[[Any], bool] | None = None
    max_backlog: int = 1
    outstanding: int = 0
    deliver: Callable[..., None] | None = None
    burst: bool = False

    def wants(self, entry: QueueEntry) -> bool:
        return self.filter is None or bool(evaluate(self.filter, entry.data))

    @property
    def has_room(self) -> bool:
        return self.outstanding < self.max_backlog


@dataclass(eq=False, slots=True)
class QueueEntry:
    """A message in a queue: where it is in the log, its state, and its payload."""

    id: MessageId
    timestamp: int  # ms, the record's LogAppendTime: when it entered the queue
    payload: bytes
    codec: Codec | None = None
    headers: list[tuple[str, bytes]] | None = None
    expiration: float | None = None  # the message's own expiration header, seconds
    seq: int = -1  # arrival order in this queue
    deadline: int | None = None
    rank: int = 0
    barrier: bool = False
    deliveries: int = 0
    cancels: int = 0
    ev_pos: int = 0  # no event about this message can be earlier in the events log
    stored: bool = False  # written to the state store (a message never stored needs no delete)
    status: Status = Status.WAITING
    holder: Subscription | None = None
    lease_until: int = 0
    _data: Any = None

    @property
    def bookmark(self) -> str:
        return format_bookmark(*self.id)

    @property
    def data(self) -> Any:
        if self._data is None and self.codec is not None:
            self._data = self.codec.decode(self.payload)
        return self._data


def expanded(events: Iterable[Any]) -> list[QueueEvent]:
    """An outbox's events one by one: a run of acks the compiled applier recorded (an
    EventRun: native/src/queue_acks.rs) as the QueueEvents the twin makes for them."""
    out: list[QueueEvent] = []
    for event in events:
        if type(event) is QueueEvent:
            out.append(event)
        else:
            out.extend([QueueEvent(REMOVE, id, 0, 0, ACK) for id in event.ids])
    return out


@dataclass(slots=True)
class Delivery:
    """A message to send: leased until `lease_until` (ms), or a barrier (no lease)."""

    subscription: Subscription
    entry: QueueEntry
    lease_until: int | None


@dataclass(slots=True)
class Early:
    """What the events log says about a message the queue has not read (or activated) yet."""

    ev_pos: int
    removed: bool = False
    deliveries: int = 0
    cancels: int = 0


@dataclass
class Outbox:
    """What the caller must do after a state change. With the compiled core, `events`
    holds runs of acks beside QueueEvents (`expanded` gives them one by one)."""

    deliveries: list[Delivery] = field(default_factory=list)
    events: list[QueueEvent] = field(default_factory=list)
    dead_letters: list[QueueEntry] = field(default_factory=list)

    def take(self) -> Outbox:
        taken = Outbox(self.deliveries, self.events, self.dead_letters)
        self.deliveries, self.events, self.dead_letters = [], [], []
        return taken

    def __bool__(self) -> bool:
        return bool(self.deliveries or self.events or self.dead_letters)


@dataclass(frozen=True)
class AckResult:
    """How many bookmarks an ack removed, and which it refused (Leasing strict)."""

    acked: int = 0
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecoveryPoint:
    """Seed 002's recovery point: in each partition, the earliest offset not yet removed
    (everything before it is acknowledged or expired), and the earliest events-log
    offset that can still say anything about those messages."""

    offsets: dict[TP, int]
    events: int
