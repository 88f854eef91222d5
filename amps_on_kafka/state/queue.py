"""AMPS message-queue semantics (seeds 001 and 002) as a pure state machine.

No I/O and no threads: the caller feeds messages read from the log (`enqueue`),
subscriber commands (`ack`, `cancel`, `expire`, `ack_by_filter`, `disconnect`) and the
passage of time (`tick`, with an injected clock), and collects what must happen in
`outbox`: deliveries to send, events to record in the queue-events log, messages to
dead-letter. Because every change of the durable state produces an event, and
`apply_event` applies a recorded event idempotently, the queue is a function of the log
of messages and the log of events; leases are the only state that is never recorded
(a restart returns them to the queue, as a disconnect does).

Vocabulary: a message is *in the queue* while it is WAITING (beyond TargetQueueDepth),
HELD (behind a barrier), AVAILABLE or LEASED. An at-most-once delivery takes it out of
the queue (TAKEN) but it stays in its subscriber's backlog until acknowledged.

QueueState keeps the state, admits messages read from the log, applies recorded events
and answers views; subscriptions and delivery are state/queue_delivery.py, and how
messages leave the queue (acks, cancels, time, barriers, depth) state/queue_removal.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from amps_on_kafka.native import core
from amps_on_kafka.state.queue_delivery import Delivering
from amps_on_kafka.state.queue_removal import Removal
from amps_on_kafka.state.queue_types import (
    AVAILABLE,
    IN_QUEUE,
    TP,
    Early,
    EventKind,
    MessageId,
    Outbox,
    QueueEntry,
    QueueEvent,
    QueuePolicy,
    Reason,
    RecoveryPoint,
    Status,
    Subscription,
    evaluate,
)
from amps_on_kafka.state.ready_queue import ReadyQueue

Clock = Callable[[], int]  # milliseconds


class QueueState(Delivering, Removal):
    """One queue's messages, leases and subscriptions."""

    # The compiled core's common case of `enqueue` (native/src/queue_enqueue.rs), when
    # `_plain_enqueue`: it stops at an item it leaves to `enqueue_read`'s loop; None
    # without the core.
    _enqueue_compiled: Callable[[Any, list[Any], int], int] | None = (
        core.Enqueuer(QueueEntry, ReadyQueue, AVAILABLE, deque, heapq.heappush).run
        if core is not None
        else None
    )
    # The recovery point's walk of a partition's arrivals (native/src/queue_enqueue.rs
    # `first_queued`; the twin `_first_queued`); None without the core.
    _first_queued_compiled: Callable[..., QueueEntry | None] | None = (
        core.first_queued if core is not None else None
    )

    def __init__(
        self,
        policy: QueuePolicy,
        clock: Clock,
        in_log: Callable[[MessageId], bool] | None = None,
    ) -> None:
        self.policy = policy
        self.clock = clock
        # whether the log holds a message the queue has not read; None: assume it does
        self.in_log = in_log
        self.entries: dict[MessageId, QueueEntry] = {}  # every message in the queue
        self.positions: dict[TP, int] = {}  # next offset to read in each partition
        self.subscriptions: list[Subscription] = []
        self.outbox = Outbox()
        self.dirty: dict[MessageId, QueueEntry] = {}  # changed since take_dirty()
        self.dirty_early: dict[MessageId, Early | None] = {}
        self.ev_next = 0  # the lowest offset a future event can get in the events log
        self.next_seq = 0
        self._taken: dict[MessageId, QueueEntry] = {}
        self._ready = ReadyQueue()
        # available messages no subscription with room wanted at the last dispatch, by
        # the set of subscriptions that do want them: looked at again only when one of
        # those has room (or a new subscription comes), not on every dispatch
        self._parked: dict[frozenset[Subscription], ReadyQueue] = {}
        self._expiry: list[tuple[int, int, QueueEntry]] = []  # (deadline, seq, entry)
        # leases in the order granted: all last LeasePeriod, so the first ends first (if
        # the clock steps back, later leases end late by at most the step)
        self._leases: OrderedDict[MessageId, QueueEntry] = OrderedDict()
        self._leased: dict[Subscription, dict[MessageId, QueueEntry]] = {}
        self._held: deque[QueueEntry] = deque()
        self._barrier: QueueEntry | None = None
        self._before_barrier = 0
        self._waiting: deque[QueueEntry] = deque()
        self._active = 0  # entries HELD, AVAILABLE or LEASED
        self._early: dict[MessageId, Early] = {}
        self._early_floor: int | None = None  # min ev_pos of _early, None when unknown
        # each partition's offsets in arrival order (the front is read by recovery_point:
        # its message's ev_pos too, so no tuple a message is kept here beside it)
        self._partitions: dict[TP, deque[int]] = {}
        self._rr = 0

    # -- reading the log ------------------------------------------------------------
    def start_at(self, tp: TP, offset: int) -> None:
        """The queue reads partition `tp` from `offset`: messages before it are not its own."""
        self.positions[tp] = offset
        self._partitions.setdefault(tp, deque())

    def enqueue(self, entry: QueueEntry, seq: int | None = None, ev_pos: int | None = None) -> bool:
        """A message read from an underlying topic; False when it does not join the queue
        (read before, or acknowledged before it arrived). A restart reading again a
        message its checkpoint left in the topic gives its arrival number `seq` back, and
        an events offset `ev_pos` no later than its first (processor/queue_recovery.py)."""
        topic, partition, offset = entry.id
        tp = (topic, partition)
        if offset < self.positions.get(tp, 0):
            return False
        self.positions[tp] = offset + 1
        floor, early = self.ev_next, None  # no acks came early: no call for either
        if self._early:
            floor = self._floor()
            early = self._pop_early(entry.id)
        if early is not None:
            if early.removed:
                return False
            entry.deliveries, entry.cancels = early.deliveries, early.cancels
        if seq is None:
            seq = self.next_seq
            self.next_seq += 1
        entry.seq = seq
        entry.ev_pos = floor if ev_pos is None else min(floor, ev_pos)
        policy = self.policy
        if entry.expiration is None and policy.expiration_ms is None:
            entry.deadline = None  # what deadline() says then, without the call
        else:
            entry.deadline = policy.deadline(entry.timestamp, entry.expiration)
        if policy.priority is not None:
            entry.rank = policy.rank(entry.data)
        if policy.barrier is not None:
            entry.barrier = policy.is_barrier(entry.data)
        self._admit(entry)
        self.dirty[entry.id] = entry
        return True

    def enqueue_read(self, read: Sequence[QueueEntry | tuple[TP, int]]) -> None:
        """What the queue's thread read, in order: each message enqueued, and each
        (partition, offset) that held no message (a transaction marker, a record skipped)
        read past."""
        read = read if type(read) is list else list(read)
        at, count = 0, len(read)
        while at < count:
            compiled = self._enqueue_compiled
            if compiled is not None and self._plain_enqueue():
                at = compiled(self, read, at)
                if at == count:
                    break
            item = read[at]
            at += 1
            if isinstance(item, QueueEntry):
                self.enqueue(item)
            else:
                self.start_at(item[0], item[1] + 1)

    def _plain_enqueue(self) -> bool:
        """Whether the compiled enqueue may act: no rule that reads the message or its
        time, no barrier waiting and no ack that came early."""
        policy = self.policy
        return (
            not self._early
            and self._barrier is None
            and policy.expiration_ms is None
            and policy.priority is None
            and policy.barrier is None
            and policy.target_depth is None
        )

    def restore(self, entry: QueueEntry) -> None:
        """Put back a message from the state store (seq, counts, rank already set).

        Entries must come in seq order; leases are not stored, so it is unleased.
        """
        tp = entry.id[:2]
        self.positions[tp] = max(self.positions.get(tp, 0), entry.id[2] + 1)  # type: ignore[index]
        self.next_seq = max(self.next_seq, entry.seq + 1)
        self._admit(entry)

    def order_arrivals(self) -> None:
        """Each partition's arrivals in offset order again, which the recovery point reads
        from the front: a restart admits the stored messages before those it reads again
        from the topics."""
        for tp, order in self._partitions.items():
            self._partitions[tp] = deque(sorted(order))

    def restore_early(self, message: MessageId, early: Early) -> None:
        self._early[message] = early
        self._early_floor = None

    def _admit(self, entry: QueueEntry) -> None:
        self.entries[entry.id] = entry
        tp = entry.id[:2]
        order = self._partitions.get(tp)  # type: ignore[call-overload]
        if order is None:  # not setdefault: it would make a deque for every message
            order = self._partitions[tp] = deque()  # type: ignore[index]
        order.append(entry.id[2])
        depth = self.policy.target_depth
        if depth is not None and (self._active >= depth or self._waiting):
            entry.status = Status.WAITING
            self._waiting.append(entry)
        else:
            self._activate(entry)

    def _activate(self, entry: QueueEntry) -> None:
        self._active += 1
        if entry.deadline is not None:
            heapq.heappush(self._expiry, (entry.deadline, entry.seq, entry))
        self._place(entry)
        if entry is self._barrier and self._before_barrier == 0:
            self._send_barrier(entry)

    def _place(self, entry: QueueEntry) -> None:
        """Make an active message deliverable, unless a barrier holds it back."""
        if self._barrier is not None:
            entry.status = Status.HELD
            self._held.append(entry)
        elif entry.barrier:
            entry.status = Status.HELD
            self._barrier = entry
            self._before_barrier = sum(
                1
                for other in itertools.chain(self.entries.values(), self._taken.values())
                if other.seq < entry.seq
            )
        else:
            self._make_available(entry)

    def _make_available(self, entry: QueueEntry) -> None:
        entry.status = AVAILABLE
        self._ready.push(entry)

    # -- the events log -------------------------------------------------------------
    def apply_event(self, event: QueueEvent) -> None:
        """Apply a recorded event (replay after a restart); records nothing new."""
        entry = self.entries.get(event.id)
        if entry is not None:
            if event.kind is EventKind.REMOVE:
                self._remove(entry, event.reason or Reason.ACK, record=False)
            else:
                self._count(entry, event.deliveries, event.cancels)
            return
        if not self._unread(event.id):
            return
        early = self._early_for(event.id)
        early.removed = early.removed or event.kind is EventKind.REMOVE
        early.deliveries = max(early.deliveries, event.deliveries)
        early.cancels = max(early.cancels, event.cancels)

    def _count(self, entry: QueueEntry, deliveries: int, cancels: int) -> None:
        if deliveries > entry.deliveries or cancels > entry.cancels:
            entry.deliveries = max(entry.deliveries, deliveries)
            entry.cancels = max(entry.cancels, cancels)
            self.dirty[entry.id] = entry

    def _unread(self, message: MessageId) -> bool:
        """A message of one of the queue's partitions that the queue has not read yet."""
        position = self.positions.get(message[:2])  # type: ignore[arg-type]
        return position is not None and message[2] >= position

    def _early_for(self, message: MessageId) -> Early:
        early = self._early.get(message)
        if early is None:
            early = self._early[message] = Early(self._floor())
            if self._early_floor is not None:
                self._early_floor = min(self._early_floor, early.ev_pos)
        self.dirty_early[message] = early
        return early

    def _pop_early(self, message: MessageId) -> Early | None:
        if not self._early:
            return None
        early = self._early.pop(message, None)
        if early is not None:
            self._early_floor = None
            self.dirty_early[message] = None
        return early

    def _floor(self) -> int:
        """ev_next, or lower while acks for unread messages are remembered: any event about
        a message read from now on is at or after this offset of the events log."""
        if not self._early:
            return self.ev_next
        if self._early_floor is None:
            self._early_floor = min(e.ev_pos for e in self._early.values())
        return min(self.ev_next, self._early_floor)

    # -- views ---------------------------------------------------------------------------
    def browse(self, matches: Callable[[Any], bool] | None = None) -> list[QueueEntry]:
        """sow on the queue: the active messages (not those beyond TargetQueueDepth), in
        delivery order."""
        found = [
            e
            for e in self.entries.values()
            if e.status in IN_QUEUE and (matches is None or evaluate(matches, e.data))
        ]
        found.sort(key=lambda e: (-e.rank, e.seq))
        return found

    @property
    def depth(self) -> int:
        """Messages in the queue, active or not."""
        return len(self.entries)

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self.entries) - self._active

    def leased(self) -> Iterator[QueueEntry]:
        for leases in self._leased.values():
            yield from leases.values()

    def take_dirty(self) -> tuple[dict[MessageId, QueueEntry], dict[MessageId, Early | None]]:
        dirty, early = self.dirty, self.dirty_early
        self.dirty, self.dirty_early = {}, {}
        return dirty, early

    def recovery_point(self) -> RecoveryPoint:
        """Where a rebuild of this queue from the logs can start (see RecoveryPoint)."""
        offsets, floors = {}, [self._floor()]
        first_queued = self._first_queued_compiled or _first_queued
        for tp, order in self._partitions.items():
            front = first_queued(order, self.entries, *tp)
            if front is not None:
                offsets[tp] = order[0]
                floors.append(front.ev_pos)
            else:
                offsets[tp] = self.positions[tp]
        self._forget_passed_early()
        return RecoveryPoint(offsets, min(floors))

    def _forget_passed_early(self) -> None:
        """Acks for offsets the queue read past without finding a message (a transaction
        marker, a compacted record) can never be used."""
        passed = [m for m in self._early if not self._unread(m)]
        for message in passed:
            self._pop_early(message)


def _first_queued(
    order: deque[int], entries: dict[MessageId, QueueEntry], topic: str, partition: int
) -> QueueEntry | None:
    """The message at the first of a partition's arrivals still in the queue, the
    offsets before it (messages removed) dropped from `order`; None once it is empty."""
    while order:
        entry = entries.get((topic, partition, order[0]))
        if entry is not None:
            return entry
        order.popleft()
    return None
