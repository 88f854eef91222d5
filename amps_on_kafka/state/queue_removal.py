"""How messages leave a queue or go back to it (state/queue.py): acknowledgements,
cancels and expiries from subscribers, the passage of time (leases that run out,
Expiration), barriers (seed 001) and TargetQueueDepth's waiting messages that become
active as others leave. Every change of durable state puts an event in the outbox.

A mixin of QueueState: it reads the queue's state (set by QueueState.__init__) and puts
messages back with its admission part (_place, _activate, _make_available).
Pure, as the rest of the state machine: no I/O, the clock is injected.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from amps_on_kafka.native import core
from amps_on_kafka.state.queue_types import (
    ACK,
    IN_QUEUE,
    LEASED,
    REMOVE,
    REMOVED,
    WAITING,
    AckResult,
    Delivery,
    EventKind,
    MessageId,
    QueueEntry,
    QueueEvent,
    Reason,
    Status,
    Subscription,
    evaluate,
)

COMPACT_SLACK = 1024  # removed messages left in the delivery structures before a sweep


class Removal:
    """The acknowledgement, time and removal part of QueueState (its attributes are set
    by QueueState.__init__)."""

    # The compiled core's common case of `ack` (native/src/queue_acks.rs): leased
    # messages acked by their holder, with no barrier and no TargetQueueDepth to mind. It
    # stops at the first message it leaves to the loop below; None without the core.
    _acks_compiled: Callable[[Any, list[MessageId], int, Hashable], tuple[int, int]] | None = (
        core.AckApplier(QueueEntry, Subscription, QueueEvent, (LEASED, REMOVED, REMOVE, ACK)).apply
        if core is not None
        else None
    )

    # -- acknowledgement ----------------------------------------------------------------
    def ack(self, messages: Iterable[MessageId], session: Hashable) -> AckResult:
        """sow_delete by bookmark: each message is processed and leaves the queue.

        With Leasing strict only the session holding the lease may ack a message in the
        queue; permissive lets any session. An ack for a message not read yet (or beyond
        TargetQueueDepth) is remembered and honoured when the message arrives (seed 001).
        """
        acked, refused = 0, []
        messages = messages if type(messages) is list else list(messages)
        at, count = 0, len(messages)
        while at < count:
            compiled = self._acks_compiled
            if compiled is not None and self._barrier is None and self.policy.target_depth is None:
                done, at = compiled(self, messages, at, session)
                acked += done
                if at == count:
                    break
            message = messages[at]
            at += 1
            entry = self.entries.get(message)
            if entry is None:
                acked += self._ack_absent(message, session)
            elif entry.status is WAITING or self._may_act(entry, session):
                self._remove(entry, ACK)
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
        return entry.status is LEASED and entry.holder.session == session  # type: ignore[union-attr]

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
        if status is LEASED:
            self._unlease(entry)
        if status in IN_QUEUE:
            self._active -= 1
        entry.status = REMOVED
        del self.entries[entry.id]
        self.dirty[entry.id] = entry
        if record:
            self.outbox.events.append(QueueEvent(REMOVE, entry.id, 0, 0, reason))
            if dead_letter:
                self.outbox.dead_letters.append(entry)
        if entry is self._barrier:
            self._barrier = None
            self._release_held()
        elif self._barrier is not None:  # else _gone has nothing to do: no call
            self._gone(entry)
        if self.policy.target_depth is not None:
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
