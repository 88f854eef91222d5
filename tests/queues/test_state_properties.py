"""Invariants of the queue state machine under random sequences of everything that can
happen to a queue (hypothesis RuleBasedStateMachine).

Seed 002's guarantees as invariants: a message is leased to one subscriber at a time, a
backlog is never exceeded, a removed message is never delivered again, every message is
in exactly one place, the queue is a function of its logs (replaying the events, from the
start or from the recovery point, rebuilds it), barriers hold later messages back, and at
most TargetQueueDepth messages are active.
"""

from __future__ import annotations

import heapq
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from amps_on_kafka.expr import compile_filter
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_types import (
    EventKind,
    MessageId,
    QueueEntry,
    QueueEvent,
    QueuePolicy,
    Status,
    Subscription,
    expanded,
)
from amps_on_kafka.state.ready_queue import ReadyQueue
from tests.queues.helpers import FakeClock, message

SESSIONS = ["s0", "s1", "s2"]
FILTERS = [None, "/f = 0", "/f = 1"]
PARTITIONS = [0, 1]
LEASE_MS = 100


@st.composite
def policies(draw) -> QueuePolicy:
    at_most_once = draw(st.booleans())
    depth = draw(st.none() | st.integers(1, 4))
    ordered = depth is None and draw(st.booleans())
    return QueuePolicy(
        name="Q",
        at_most_once=at_most_once,
        lease_ms=LEASE_MS,
        expiration_ms=draw(st.none() | st.integers(50, 400)),
        fairness="round-robin"
        if at_most_once
        else draw(st.sampled_from(["fast", "round-robin", "proportional"])),
        max_cancels=draw(st.none() | st.integers(0, 2)),
        max_deliveries=draw(st.none() | st.integers(1, 3)),
        permissive=draw(st.booleans()),
        priority=(lambda d: d["p"]) if ordered else None,
        barrier=compile_filter("/b = 1").matches if depth is None and draw(st.booleans()) else None,
        target_depth=depth,
    )


class QueueMachine(RuleBasedStateMachine):
    @initialize(policy=policies())
    def start(self, policy: QueuePolicy) -> None:
        self.clock = FakeClock()
        self.state = QueueState(policy, self.clock)
        for partition in PARTITIONS:
            self.state.start_at(("orders", partition), 0)
        self.published: list = []  # every message read, in order
        self.next_offset = dict.fromkeys(PARTITIONS, 0)
        self.log: list[QueueEvent] = []  # the events topic
        self.removed: set[MessageId] = set()
        self.subs: list[Subscription] = []

    # -- what can happen ----------------------------------------------------------
    @rule(
        partition=st.sampled_from(PARTITIONS),
        p=st.integers(0, 3),
        f=st.integers(0, 1),
        barrier=st.integers(0, 3).map(lambda n: int(n == 0)),
        expiration=st.none() | st.sampled_from([0, 0.1]),
    )
    def publish(self, partition, p, f, barrier, expiration) -> None:
        offset = self.next_offset[partition]
        self.next_offset[partition] += 1
        entry = message(
            offset,
            {"p": p, "f": f, "b": barrier},
            partition=partition,
            timestamp=self.clock.now,
            expiration=expiration,
        )
        self.published.append(entry)
        self.state.enqueue(entry)
        self.settle()

    @rule(
        backlog=st.integers(0, 3),
        session=st.sampled_from(SESSIONS),
        text=st.sampled_from(FILTERS),
    )
    def subscribe(self, backlog, session, text) -> None:
        flt = compile_filter(text).matches if text else None
        sub = Subscription(f"sub{len(self.subs)}", session, flt, backlog)
        self.subs.append(sub)
        self.state.subscribe(sub)
        self.settle()

    @precondition(lambda self: self.state.subscriptions)
    @rule(data=st.data())
    def unsubscribe(self, data) -> None:
        self.state.unsubscribe(data.draw(st.sampled_from(self.state.subscriptions)))
        self.settle()

    @rule(session=st.sampled_from(SESSIONS))
    def disconnect(self, session) -> None:
        self.state.disconnect(session)
        self.settle()

    @rule(
        data=st.data(),
        verb=st.sampled_from(["ack", "cancel", "expire"]),
        session=st.sampled_from(SESSIONS),
    )
    def acknowledge(self, data, verb, session) -> None:
        """Usually a message the session holds; sometimes any message, read or not."""
        held = [e.id for e in self.state.leased() if e.holder.session == session]
        anything = [e.id for e in self.published] + [
            ("orders", p, self.next_offset[p] + 1) for p in PARTITIONS
        ]
        pool = held if held and data.draw(st.booleans()) else anything
        chosen = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        getattr(self.state, verb)(chosen, session)
        self.settle()

    @rule(text=st.sampled_from(["/f = 0", "/p > 1"]), session=st.sampled_from(SESSIONS))
    def ack_by_filter(self, text, session) -> None:
        self.state.ack_by_filter(compile_filter(text).matches, session)
        self.settle()

    @rule(ms=st.integers(0, 2 * LEASE_MS))
    def time_passes(self, ms) -> None:
        self.clock.advance(ms)
        self.state.tick()
        self.settle()

    def settle(self) -> None:
        """Dispatch, check each delivery, and write the events to the log."""
        self.state.dispatch()
        box = self.state.outbox.take()
        available = [e for e in self.state.entries.values() if e.status is Status.AVAILABLE]
        for delivery in box.deliveries:
            assert delivery.entry.id not in self.removed, "a removed message was delivered"
            if delivery.lease_until is not None:  # not a barrier, which ignores backlogs
                self.check_nothing_earlier_was_passed_over(delivery, available)
        events = expanded(box.events)  # a compiled run of acks as its QueueEvents
        for event in events:
            if event.kind is EventKind.REMOVE:
                self.removed.add(event.id)
        self.log.extend(events)
        self.state.ev_next = len(self.log)

    @staticmethod
    def check_nothing_earlier_was_passed_over(delivery, available: list[QueueEntry]) -> None:
        """Oldest (highest priority) first: a subscriber got nothing while a message it
        wants, earlier in delivery order, stayed in the queue."""
        order = (-delivery.entry.rank, delivery.entry.seq)
        earlier = [e for e in available if (-e.rank, e.seq) < order]
        assert not any(delivery.subscription.wants(e) for e in earlier)

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def one_holder_per_message_and_backlogs_respected(self) -> None:
        held: dict[MessageId, Subscription] = {}
        for sub in self.state.subscriptions:
            leases = self.state.leases_of(sub)
            assert sub.outstanding == len(leases)
            assert sub.outstanding <= sub.max_backlog
            for entry in leases:
                assert entry.id not in held, "leased to two subscribers"
                assert entry.holder is sub
                held[entry.id] = sub
        leased = {m for m, e in self.state.entries.items() if e.status is Status.LEASED}
        assert leased <= set(held)

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        in_queue = set(self.state.entries)
        taken = {e.id for e in self.state.leased() if e.status is Status.TAKEN}
        read = {e.id for e in self.published}
        assert not in_queue & self.removed
        assert not taken & in_queue
        assert read <= in_queue | taken | self.removed

    @invariant()
    def at_most_target_depth_active(self) -> None:
        depth = self.state.policy.target_depth
        if depth is not None:
            assert self.state.active <= depth
            assert len(self.state.browse()) <= depth

    @invariant()
    def a_barrier_waits_exactly_until_everything_before_it_is_acknowledged(self) -> None:
        barriers = [e for e in self.state.entries.values() if e.barrier]
        if barriers:
            first = min(b.seq for b in barriers)
            out = list(self.state.leased())
            assert all(e.seq < first for e in out), "a message after the barrier went out"
            before = [e for e in [*self.state.entries.values(), *out] if e.seq < first]
            assert before, "nothing is left before the barrier, yet it was not sent"

    @invariant()
    def dispatch_leaves_no_deliverable_message_behind(self) -> None:
        waiting = [e for e in self.state.entries.values() if e.status is Status.AVAILABLE]
        for sub in self.state.subscriptions:
            if sub.has_room:
                assert not any(sub.wants(e) for e in waiting)

    @invariant()
    def the_logs_rebuild_the_queue(self) -> None:
        """Leases are not recorded; neither are at-most-once deliveries awaiting their ack,
        so a barrier that waits only for those is sent at once by a rebuilt queue."""
        expected = self._counts(self.state)
        rebuilt = self._rebuilt(dict.fromkeys(PARTITIONS, 0), 0)
        point = self.state.recovery_point()
        starts = {p: point.offsets[("orders", p)] for p in PARTITIONS}
        from_point = self._rebuilt(starts, point.events)
        if any(e.status is Status.TAKEN for e in self.state.leased()):
            barriers = {m for m, e in self.state.entries.items() if e.barrier}
            expected, rebuilt, from_point = (
                {m: c for m, c in counts.items() if m not in barriers}
                for counts in (expected, rebuilt, from_point)
            )
        assert rebuilt == expected
        assert from_point == expected

    def _rebuilt(self, starts: dict[int, int], first_event: int) -> dict:
        rebuilt = QueueState(self.state.policy, lambda: 0)  # time stands still on replay
        for partition, offset in starts.items():
            rebuilt.start_at(("orders", partition), offset)
        for event in self.log[first_event:]:
            rebuilt.apply_event(event)
        for entry in self.published:
            copy = message(
                entry.id[2],
                entry.data,
                partition=entry.id[1],
                timestamp=entry.timestamp,
                expiration=entry.expiration,
            )
            rebuilt.enqueue(copy)
        return self._counts(rebuilt)

    @staticmethod
    def _counts(state: QueueState) -> dict:
        """Messages and their counts; deliveries are recorded only for MaxDeliveries."""
        recorded = state.policy.max_deliveries is not None
        return {m: (e.deliveries if recorded else 0, e.cancels) for m, e in state.entries.items()}


QueueMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_queue_state_machine = QueueMachine.TestCase


@given(
    st.lists(
        st.one_of(st.tuples(st.just("push"), st.integers(0, 3)), st.just(("pop", 0))),
        max_size=200,
    )
)
def test_the_ready_queue_pops_highest_rank_then_oldest_whatever_the_push_order(steps):
    """ReadyQueue (a deque for what comes in order, a heap for the rest) pops exactly as
    one heap over (-rank, seq) would."""
    ready, model, seqs = ReadyQueue(), [], itertools.count()
    waiting: list[QueueEntry] = []
    for action, rank in steps:
        if action == "push":
            # a new message, or one that comes back (an older seq), either may jump ahead
            entry = waiting.pop() if waiting and rank % 2 else message(next(seqs))
            entry.seq = entry.id[2]
            entry.rank = rank
            ready.push(entry)
            heapq.heappush(model, (-entry.rank, entry.seq, entry))
        elif model:
            assert bool(ready)
            expected = heapq.heappop(model)[2]
            assert ready.pop() is expected
            waiting.append(expected)
    assert bool(ready) == bool(model)
    while model:
        assert ready.pop() is heapq.heappop(model)[2]
