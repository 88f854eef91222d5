"""Subscriptions and delivery of a queue (state/queue.py): who subscribes, and which
subscription each available message goes to under the queue's fairness (fast,
round-robin, proportional), with a lease or, at-most-once, taken out of the queue.
Messages no subscription with room wants are parked by the set of subscriptions that do,
so a dispatch does not look at them again until one of those has room.

A mixin of QueueState: it reads the queue's state (set by QueueState.__init__) and calls
its removal part (state/queue_removal.py) when a lease is broken or a message is taken.
Pure, as the rest of the state machine: no I/O, the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from amps_on_kafka.native import core
from amps_on_kafka.state.queue_types import (
    AVAILABLE,
    LEASED,
    Delivery,
    EventKind,
    QueueEntry,
    QueueEvent,
    Reason,
    Status,
    Subscription,
)
from amps_on_kafka.state.ready_queue import ReadyQueue, pop_first


class Delivering:
    """The subscription and delivery part of QueueState (its attributes are set by
    QueueState.__init__)."""

    # The compiled core's common case of `dispatch` (native/src/queue_dispatch.rs):
    # messages in arrival order leased to subscriptions that want them all, when
    # `_plain_dispatch`. It stops where the loop of `dispatch` must go on; None without
    # the core.
    _dispatch_compiled: Callable[[Any, list[Subscription], int], None] | None = (
        core.Dispatcher(QueueEntry, Subscription, ReadyQueue, Delivery, (AVAILABLE, LEASED)).run
        if core is not None
        else None
    )

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
        now = self.clock()  # one reading for the dispatch's leases
        compiled = self._dispatch_compiled
        if compiled is not None and open_subs and self._plain_dispatch(open_subs):
            compiled(self, open_subs, now)  # what it leaves, the loop below delivers
        sources = self._sources(open_subs)
        while open_subs:
            entry = pop_first(sources)
            if entry is None:
                return
            if entry.status is not AVAILABLE:
                continue  # removed while it waited to be delivered
            chosen = self._choose(entry, open_subs)
            if chosen is None:
                self._park(entry)
                continue
            self._deliver(entry, chosen, now)
            if not chosen.has_room:
                open_subs.remove(chosen)
                sources = self._sources(open_subs)

    def _plain_dispatch(self, open_subs: list[Subscription]) -> bool:
        """Whether the compiled dispatch may act: nothing parked, subscriptions that want
        every message, a fairness that keeps no turn, and no delivery to record."""
        policy = self.policy
        return (
            not self._parked
            and policy.fairness != "round-robin"
            and not policy.records_deliveries
            and all(s.filter is None for s in open_subs)
        )

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
            if candidate.filter is None or candidate.wants(entry):
                best = candidate
        return best

    def _deliver(self, entry: QueueEntry, subscription: Subscription, now: int) -> None:
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
            entry.status = LEASED
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
