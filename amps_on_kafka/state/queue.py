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
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from amps_on_kafka.state.queue_types import (
    IN_QUEUE,
    TP,
    AckResult,
    Delivery,
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
from amps_on_kafka.state.ready_queue import ReadyQueue, pop_first

Clock = Callable[[], int]  # milliseconds
COMPACT_SLACK = 1024  # removed messages left in the delivery structures before a sweep


class QueueState:
    """One queue's messages, leases and subscriptions."""

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
        self._partitions: dict[TP, deque[tuple[int, int]]] = {}  # (offset, ev_pos) in order
        self._rr = 0

    # -- reading the log ------------------------------------------------------------
    def start_at(self, tp: TP, offset: int) -> None:
        """The queue reads partition `tp` from `offset`: messages before it are not its own."""
        self.positions[tp] = offset
        self._partitions.setdefault(tp, deque())

    def enqueue(self, entry: QueueEntry) -> bool:
        """A message read from an underlying topic; False when it does not join the queue
        (read before, or acknowledged before it arrived)."""
        topic, partition, offset = entry.id
        tp = (topic, partition)
        if offset < self.positions.get(tp, 0):
            return False
        self.positions[tp] = offset + 1
        floor = self._floor()
        early = self._pop_early(entry.id)
        if early is not None:
            if early.removed:
                return False
            entry.deliveries, entry.cancels = early.deliveries, early.cancels
        entry.seq = self.next_seq
        self.next_seq += 1
        entry.ev_pos = floor
        policy = self.policy
        entry.deadline = policy.deadline(entry.timestamp, entry.expiration)
        if policy.priority is not None:
            entry.rank = policy.rank(entry.data)
        if policy.barrier is not None:
            entry.barrier = policy.is_barrier(entry.data)
        self._admit(entry)
        self.dirty[entry.id] = entry
        return True

    def restore(self, entry: QueueEntry) -> None:
        """Put back a message from the state store (seq, counts, rank already set).

        Entries must come in seq order; leases are not stored, so it is unleased.
        """
        tp = entry.id[:2]
        self.positions[tp] = max(self.positions.get(tp, 0), entry.id[2] + 1)  # type: ignore[index]
        self.next_seq = max(self.next_seq, entry.seq + 1)
        self._admit(entry)

    def restore_early(self, message: MessageId, early: Early) -> None:
        self._early[message] = early
        self._early_floor = None

    def _admit(self, entry: QueueEntry) -> None:
        self.entries[entry.id] = entry
        self._partitions.setdefault(entry.id[:2], deque()).append((entry.id[2], entry.ev_pos))  # type: ignore[arg-type]
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
        entry.status = Status.AVAILABLE
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

    # -- subscriptions --------------------------------------------------------------
    def subscribe(self, subscription: Subscription) -> None:
        self.subscriptions.append(subscription)
        self._leased[subscription] = {}
        for group in self._parked.values():  # the newcomer may want any of them
            group.drain_into(self._ready)
        self._parked.clear()

    def unsubscribe(self, subscription: Subscription) -> None:
        """The subscription ends: its leases are broken at once (seed 002)."""
        if subscription not in self._leased:
            return
        index = self.subscriptions.index(subscription)
        del self.subscriptions[index]
        if index < self._rr:
            self._rr -= 1  # the same subscription stays next in turn
        now = self.clock()
        for entry in list(self._leased[subscription].values()):
            self._lease_ended(entry, now)
        del self._leased[subscription]
        self._forget_in_parked(subscription)

    def _forget_in_parked(self, subscription: Subscription) -> None:
        """Parked messages are no longer grouped by a subscription that ended (which
        would keep it, and its session, alive)."""
        parked, self._parked = self._parked, {}
        for wanted_by, group in parked.items():
            key = wanted_by - {subscription}
            same = self._parked.get(key)
            if same is None:
                self._parked[key] = group
            else:
                group.drain_into(same)

    def disconnect(self, session: Hashable) -> None:
        for subscription in [s for s in self.subscriptions if s.session == session]:
            self.unsubscribe(subscription)

    def leases_of(self, subscription: Subscription) -> list[QueueEntry]:
        return list(self._leased.get(subscription, {}).values())

    # -- delivery ---------------------------------------------------------------------
    def dispatch(self) -> None:
        """Deliver what can be delivered: each message, oldest (or highest priority) first,
        to the subscription the queue's fairness picks among those with room that want it."""
        open_subs = [s for s in self.subscriptions if s.has_room]
        sources = self._sources(open_subs)
        while open_subs:
            entry = pop_first(sources)
            if entry is None:
                return
            if entry.status is not Status.AVAILABLE:
                continue  # removed while it waited to be delivered
            chosen = self._choose(entry, open_subs)
            if chosen is None:
                self._park(entry)
                continue
            self._deliver(entry, chosen)
            if not chosen.has_room:
                open_subs.remove(chosen)
                sources = self._sources(open_subs)

    def _sources(self, open_subs: list[Subscription]) -> list[ReadyQueue]:
        """Where the next message for `open_subs` can be: the ready queue, and the parked
        groups some of them want."""
        sources = [self._ready]
        for wanted_by, group in self._parked.items():
            if not wanted_by.isdisjoint(open_subs):
                sources.append(group)
        return sources

    def _park(self, entry: QueueEntry) -> None:
        wanted_by = frozenset(s for s in self.subscriptions if s.wants(entry))
        group = self._parked.get(wanted_by)
        if group is None:
            group = self._parked[wanted_by] = ReadyQueue()
        group.push(entry)

    def _choose(self, entry: QueueEntry, open_subs: list[Subscription]) -> Subscription | None:
        fairness = self.policy.fairness
        if fairness == "fast":
            return next((s for s in open_subs if s.wants(entry)), None)
        if fairness == "round-robin":
            return self._next_in_turn(entry)
        return self._most_room(entry, open_subs)

    def _next_in_turn(self, entry: QueueEntry) -> Subscription | None:
        """round-robin: the next subscription after the last one served that has room."""
        subs = self.subscriptions
        count = len(subs)
        for step in range(count):
            index = (self._rr + step) % count
            candidate = subs[index]
            if candidate.has_room and candidate.wants(entry):
                self._rr = index + 1
                return candidate
        return None

    @staticmethod
    def _most_room(entry: QueueEntry, open_subs: list[Subscription]) -> Subscription | None:
        """proportional: the lowest outstanding / max_backlog; the first found on a tie."""
        best = None
        for candidate in open_subs:
            if best is not None and (
                candidate.outstanding * best.max_backlog >= best.outstanding * candidate.max_backlog
            ):
                continue
            if candidate.wants(entry):
                best = candidate
        return best

    def _deliver(self, entry: QueueEntry, subscription: Subscription) -> None:
        now = self.clock()
        entry.deliveries += 1
        entry.holder = subscription
        subscription.outstanding += 1
        self._leased[subscription][entry.id] = entry
        entry.lease_until = now + self.policy.lease_ms
        self._leases[entry.id] = entry
        if self.policy.at_most_once:
            self.dirty[entry.id] = entry
            self._take(entry)
        else:
            entry.status = Status.LEASED
            if self.policy.max_deliveries is not None:  # only MaxDeliveries reads the count
                self.dirty[entry.id] = entry
                self._record(EventKind.DELIVER, entry)
        self.outbox.deliveries.append(Delivery(subscription, entry, entry.lease_until))

    def _take(self, entry: QueueEntry) -> None:
        """at-most-once: the message leaves the queue as it is delivered."""
        del self.entries[entry.id]
        self._taken[entry.id] = entry
        entry.status = Status.TAKEN
        self._active -= 1
        self.outbox.events.append(QueueEvent(EventKind.REMOVE, entry.id, reason=Reason.TAKEN))
        self._promote()

    def _record(self, kind: EventKind, entry: QueueEntry) -> None:
        self.outbox.events.append(QueueEvent(kind, entry.id, entry.deliveries, entry.cancels))

    # -- acknowledgement ----------------------------------------------------------------
    def ack(self, messages: Iterable[MessageId], session: Hashable) -> AckResult:
        """sow_delete by bookmark: each message is processed and leaves the queue.

        With Leasing strict only the session holding the lease may ack a message in the
        queue; permissive lets any session. An ack for a message not read yet (or beyond
        TargetQueueDepth) is remembered and honoured when the message arrives (seed 001).
        """
        acked, refused = 0, []
        for message in messages:
            entry = self.entries.get(message)
            if entry is None:
                acked += self._ack_absent(message, session)
            elif entry.status is Status.WAITING or self._may_act(entry, session):
                self._remove(entry, Reason.ACK)
                acked += 1
            else:
                refused.append(entry.bookmark)
        return AckResult(acked, tuple(refused))

    def _ack_absent(self, message: MessageId, session: Hashable) -> int:
        taken = self._taken.get(message)
        if taken is not None:
            if not self.policy.permissive and taken.holder.session != session:  # type: ignore[union-attr]
                return 0
            self._drop_taken(taken)
            return 1
        if self._unread(message) and (self.in_log is None or self.in_log(message)):
            self._early_for(message).removed = True
            self.outbox.events.append(QueueEvent(EventKind.REMOVE, message, reason=Reason.ACK))
            return 1
        return 0  # already gone, or past the end of the log: no message to remember

    def _may_act(self, entry: QueueEntry, session: Hashable) -> bool:
        if self.policy.permissive:
            return True
        return entry.status is Status.LEASED and entry.holder.session == session  # type: ignore[union-attr]

    def cancel(self, messages: Iterable[MessageId], session: Hashable) -> AckResult:
        """Return leased messages to the queue, counting toward MaxCancels (expired past it).

        at-most-once: no effect on the message, but the backlog slot is freed.
        """
        return self._each(messages, session, self._cancel_one)

    def expire(self, messages: Iterable[MessageId], session: Hashable) -> AckResult:
        """Remove messages at once, as expired (dead-lettered when the queue has a target)."""
        return self._each(
            messages, session, lambda entry: self._remove(entry, Reason.EXPIRE, dead_letter=True)
        )

    def _each(
        self,
        messages: Iterable[MessageId],
        session: Hashable,
        action: Callable[[QueueEntry], None],
    ) -> AckResult:
        done, refused = 0, []
        for message in messages:
            taken = self._taken.get(message)
            if taken is not None:
                done += self._ack_absent(message, session)
                continue
            entry = self.entries.get(message)
            if entry is None or entry.status is Status.WAITING or self.policy.at_most_once:
                continue  # at-most-once: "these options have no effect" (seed 002)
            if self._may_act(entry, session):
                action(entry)
                done += 1
            else:
                refused.append(entry.bookmark)
        return AckResult(done, tuple(refused))

    def _cancel_one(self, entry: QueueEntry) -> None:
        entry.cancels += 1
        self.dirty[entry.id] = entry
        limit = self.policy.max_cancels
        if limit is not None and entry.cancels > limit:
            self._remove(entry, Reason.EXPIRE, dead_letter=True)
            return
        self._record(EventKind.CANCEL, entry)
        if entry.status is Status.LEASED:
            self._lease_ended(entry, self.clock())

    def ack_by_filter(self, matches: Callable[[Any], bool], session: Hashable) -> int:
        """sow_delete with a filter: every active message that matches, leased or not
        (with Leasing strict, not those another session holds)."""
        victims = [
            entry
            for entry in self.entries.values()
            if entry.status in IN_QUEUE
            and (entry.status is not Status.LEASED or self._may_act(entry, session))
            and evaluate(matches, entry.data)
        ]
        removed = 0
        for entry in victims:
            if entry.status in IN_QUEUE:  # a barrier released on the way has gone already
                self._remove(entry, Reason.ACK)
                removed += 1
        return removed

    # -- time ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Leases that ran out, then messages whose time in the queue is over."""
        now = self.clock()
        leases = self._leases
        while leases and next(iter(leases.values())).lease_until <= now:
            self._lease_ended(leases.popitem(last=False)[1], now)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            entry = heapq.heappop(expiry)[2]
            if entry.status in (Status.AVAILABLE, Status.HELD):
                self._remove(entry, Reason.EXPIRE, dead_letter=True)
        self._compact()

    def _compact(self) -> None:
        """Drop removed messages from the ready queue and the parked groups once they are
        most of what those hold (messages expire there while no one takes them)."""
        groups = [self._ready, *self._parked.values()]
        if sum(map(len, groups)) <= 2 * len(self.entries) + COMPACT_SLACK:
            return
        for group in groups:
            group.compact()
        self._parked = {key: group for key, group in self._parked.items() if group}

    def next_due(self) -> int | None:
        """The earliest time `tick` may have something to do."""
        times = [self._expiry[0][0]] if self._expiry else []
        if self._leases:
            times.append(next(iter(self._leases.values())).lease_until)
        return min(times) if times else None

    def _lease_ended(self, entry: QueueEntry, now: int) -> None:
        """A lease ran out or was broken: back to the queue if the message has been in it
        less than Expiration and delivered fewer than MaxDeliveries times, else removed."""
        if entry.status is Status.TAKEN:
            self._drop_taken(entry)
            return
        self._unlease(entry)
        limit = self.policy.max_deliveries
        if (entry.deadline is not None and entry.deadline <= now) or (
            limit is not None and entry.deliveries >= limit
        ):
            self._remove(entry, Reason.EXPIRE, dead_letter=True)
        else:
            self._make_available(entry)

    def _unlease(self, entry: QueueEntry) -> None:
        holder = entry.holder
        if holder is not None:
            holder.outstanding -= 1
            self._leased[holder].pop(entry.id, None)
            entry.holder = None
        self._leases.pop(entry.id, None)

    def _drop_taken(self, entry: QueueEntry) -> None:
        """An at-most-once delivery is acknowledged: the subscriber has room again."""
        self._unlease(entry)
        del self._taken[entry.id]
        entry.status = Status.REMOVED
        self._gone(entry)

    # -- leaving the queue -----------------------------------------------------------
    def _remove(
        self, entry: QueueEntry, reason: Reason, *, dead_letter: bool = False, record: bool = True
    ) -> None:
        status = entry.status
        if status is Status.LEASED:
            self._unlease(entry)
        if status in IN_QUEUE:
            self._active -= 1
        entry.status = Status.REMOVED
        del self.entries[entry.id]
        self.dirty[entry.id] = entry
        if record:
            self.outbox.events.append(QueueEvent(EventKind.REMOVE, entry.id, reason=reason))
            if dead_letter:
                self.outbox.dead_letters.append(entry)
        if entry is self._barrier:
            self._barrier = None
            self._release_held()
        else:
            self._gone(entry)
        self._promote()

    def _gone(self, entry: QueueEntry) -> None:
        """A message left the queue and every backlog: it no longer holds a barrier back."""
        barrier = self._barrier
        if barrier is not None and entry.seq < barrier.seq:
            self._before_barrier -= 1
            if self._before_barrier == 0:
                self._send_barrier(barrier)

    def _send_barrier(self, barrier: QueueEntry) -> None:
        """Seed 001: every message before the barrier is acknowledged, so the barrier goes to
        every current subscription whose filter matches, ignoring backlogs, and leaves the
        queue without waiting for an acknowledgement."""
        for subscription in self.subscriptions:
            if subscription.wants(barrier):
                self.outbox.deliveries.append(Delivery(subscription, barrier, None))
        self._remove(barrier, Reason.BARRIER)

    def _release_held(self) -> None:
        """Messages behind a barrier that was sent become deliverable, up to the next one."""
        held, self._held = self._held, deque()
        for entry in held:
            if entry.status is Status.HELD:
                self._place(entry)
        barrier = self._barrier
        if barrier is not None and self._before_barrier == 0:
            self._send_barrier(barrier)

    def _promote(self) -> None:
        """TargetQueueDepth: activate waiting messages while the active part has room."""
        depth = self.policy.target_depth
        if depth is None:
            return
        now = self.clock()
        waiting = self._waiting
        while waiting and self._active < depth:
            entry = waiting.popleft()
            if entry.status is not Status.WAITING:
                continue  # acknowledged while it waited
            if entry.deadline is not None and entry.deadline <= now:
                entry.status = Status.AVAILABLE  # counted active only to leave at once
                self._active += 1
                self._remove(entry, Reason.EXPIRE, dead_letter=True)
                continue
            self._activate(entry)

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
        for tp, order in self._partitions.items():
            topic, partition = tp
            while order and (topic, partition, order[0][0]) not in self.entries:
                order.popleft()
            if order:
                offsets[tp] = order[0][0]
                floors.append(order[0][1])
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
