"""The compiled parts of the queue state machine against their Python twins: the
applier of acks (native/src/queue_acks.rs; twin: `Removal.ack`'s own loop), the
dispatcher (native/src/queue_dispatch.rs; twin: `Delivering.dispatch`'s own loop), the
enqueuer and the recovery point's walk of the arrivals (native/src/queue_enqueue.rs; twins:
`QueueState.enqueue_read`'s own loop and `_first_queued`), what runs without the core.

Both change the state machine's own structures, so two queues, one with them and one
without, are driven through the same random sequences of everything that can happen to a
queue (the policies of test_state_properties: priorities, barriers, fairness,
TargetQueueDepth, MaxDeliveries, MaxCancels, at-most-once, permissive leasing, filters),
and after every step all they hold and all they answered must be the same.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from amps_on_kafka.expr import compile_filter
from amps_on_kafka.native import core
from amps_on_kafka.processor.queue_recording import events_record
from amps_on_kafka.state.queue import QueueState, _first_queued
from amps_on_kafka.state.queue_store import encode_events
from amps_on_kafka.state.queue_types import (
    QueueEntry,
    QueueEvent,
    QueuePolicy,
    Subscription,
    expanded,
)
from tests.queues.helpers import FakeClock, message
from tests.queues.test_state_properties import FILTERS, LEASE_MS, PARTITIONS, SESSIONS, policies


class TwinState(QueueState):
    """The state machine without the compiled core."""

    _acks_compiled = None
    _dispatch_compiled = None
    _enqueue_compiled = None
    _first_queued_compiled = None


def test_the_compiled_parts_are_in_use():
    assert type(QueueState._acks_compiled.__self__).__name__ == "AckApplier"  # type: ignore[union-attr]
    assert type(QueueState._dispatch_compiled.__self__).__name__ == "Dispatcher"  # type: ignore[union-attr]
    assert type(QueueState._enqueue_compiled.__self__).__name__ == "Enqueuer"  # type: ignore[union-attr]
    assert QueueState._first_queued_compiled is core.first_queued  # type: ignore[union-attr]


def snapshot(state: QueueState) -> dict[str, Any]:
    """Everything a state holds that an ack can change, by value and in order."""
    name = lambda sub: None if sub is None else sub.sub_id  # noqa: E731
    entries = [
        (key, e.id, e.status, name(e.holder), e.deliveries, e.cancels, e.lease_until)
        for key, e in state.entries.items()
    ]
    box = state.outbox.take()
    return {
        "entries": entries,
        "taken": list(state._taken),
        "dirty": [
            (key, e.id, e.status, e.seq, e.ev_pos) for key, e in state.take_dirty()[0].items()
        ],
        "positions": state.positions,
        "partitions": {tp: list(order) for tp, order in state._partitions.items()},
        "next_seq": state.next_seq,
        "active": state._active,
        "leases": list(state._leases),
        "leased": {name(s): list(held) for s, held in state._leased.items()},
        "outstanding": [(s.sub_id, s.outstanding) for s in state.subscriptions],
        "barrier": state._barrier and state._barrier.id,
        "deliveries": [(name(d.subscription), d.entry.id, d.lease_until) for d in box.deliveries],
        "events": [(type(e), tuple(e)) for e in expanded(box.events)],
        "record": events_record(box.events) if box.events else None,
        "ready": [e.id for e in state._ready._in_order]
        + sorted(i[:2] for i in state._ready._others),
        "parked": sorted(len(group) for group in state._parked.values()),
        "dead": [e.id for e in box.dead_letters],
    }


class StateMachine(RuleBasedStateMachine):
    @initialize(policy=policies(), plain=st.integers(0, 3))
    def start(self, policy: QueuePolicy, plain: int) -> None:
        if plain:  # mostly a queue where the compiled parts may act (they leave others)
            policy = replace(policy, barrier=None, target_depth=None, at_most_once=False)
        if plain > 1:
            fairness = (
                "round-robin" if plain == 2 else policy.fairness.replace("round-robin", "fast")
            )
            policy = replace(
                policy, max_deliveries=None, expiration_ms=None, priority=None, fairness=fairness
            )
        self.plain = plain
        self.clock = FakeClock()
        self.states = [QueueState(policy, self.clock), TwinState(policy, self.clock)]
        for state in self.states:
            for partition in PARTITIONS:
                state.start_at(("orders", partition), 0)
        self.next_offset = dict.fromkeys(PARTITIONS, 0)
        self.subs = 0

    def both(self, step) -> None:
        """The step on each queue: the same answer (or error) and the same state after."""
        seen = []
        for state in self.states:
            try:
                answer: Any = step(state)
            except Exception as exc:  # the error, whatever its type, must match
                answer = (type(exc), str(exc))
            state.dispatch()
            seen.append((answer, snapshot(state)))
        assert seen[0] == seen[1]

    @rule(
        partition=st.sampled_from(PARTITIONS),
        fields=st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 1), st.sampled_from([None, None, 0, 0.1])),
            min_size=1,
            max_size=6,
        ),
        gap=st.booleans(),
    )
    def publish(self, partition, fields, gap) -> None:
        """A batch read from the log: messages, maybe a position that held none, and now
        and then an offset read before."""
        read: list = []
        for p, f, expiration in fields:
            offset = self.next_offset[partition]
            self.next_offset[partition] += 1
            data = {"p": p, "f": f, "b": int(offset % 5 == 4)}
            read.append((offset, data, expiration))
        if gap:
            read.insert(len(read) // 2, self.next_offset[partition])
            self.next_offset[partition] += 1
            read.append((max(0, self.next_offset[partition] - 3), {"p": 0}, None))  # read before
        now = self.clock.now
        self.both(lambda s: s.enqueue_read([self.item(x, partition, now) for x in read]))

    @rule(picks=st.lists(st.tuples(st.sampled_from([*PARTITIONS, 2]), st.booleans()), max_size=8))
    def publish_mixed(self, picks) -> None:
        """A batch whose messages alternate between partitions (a partition never started
        among them), now and then one read before: each partition's position and
        arrivals as the twin keeps them."""
        read: list = []
        for partition, before in picks:
            offset = self.next_offset.setdefault(partition, 0)
            if before and offset:
                offset -= 1
            else:
                self.next_offset[partition] += 1
            read.append((partition, (offset, {"p": offset % 3, "f": 0, "b": 0}, None)))
        now = self.clock.now
        self.both(lambda s: s.enqueue_read([self.item(x, p, now) for p, x in read]))

    @rule()
    def recover(self) -> None:
        """The recovery point, and each partition's arrivals the walk leaves behind."""
        self.both(lambda s: s.recovery_point())

    @staticmethod
    def item(what, partition: int, now: int) -> Any:
        if isinstance(what, int):  # a position that held no message
            return (("orders", partition), what)
        offset, data, expiration = what
        return message(offset, data, partition=partition, timestamp=now, expiration=expiration)

    @rule(
        backlog=st.integers(1, 6),
        session=st.sampled_from(SESSIONS),
        text=st.sampled_from(FILTERS),
    )
    def subscribe(self, backlog, session, text) -> None:
        self.subs += 1
        flt = compile_filter(text).matches if text and self.plain < 2 else None
        sub_id = f"sub{self.subs}"
        self.both(lambda s: s.subscribe(Subscription(sub_id, session, flt, backlog)))

    @precondition(lambda self: self.states[0].subscriptions)
    @rule(data=st.data())
    def unsubscribe(self, data) -> None:
        at = data.draw(st.integers(0, len(self.states[0].subscriptions) - 1))
        self.both(lambda s: s.unsubscribe(s.subscriptions[at]))

    @rule(
        data=st.data(),
        verb=st.sampled_from(["ack", "ack", "ack", "cancel"]),
        session=st.sampled_from(SESSIONS),
    )
    def acknowledge(self, data, verb, session) -> None:
        """Mostly messages the session holds, mixed with others it does not (held by
        another session, available, removed, not read yet), in any order."""
        holders = sorted({e.holder.session for e in self.states[0].leased()})
        if holders and data.draw(st.booleans()):
            session = data.draw(st.sampled_from(holders))
        held = [e.id for e in self.states[0].leased() if e.holder.session == session]
        others = [e.id for e in self.states[0].entries.values()] + [
            ("orders", p, self.next_offset[p] + d) for p in PARTITIONS for d in (-1, 1)
        ]
        chosen = data.draw(st.permutations(held)) if held else []
        for _ in range(data.draw(st.integers(0 if held else 1, 3))):
            other = data.draw(st.sampled_from(others))
            chosen.insert(data.draw(st.integers(0, len(chosen))), other)
        self.both(lambda s: getattr(s, verb)(list(chosen), session))

    @rule(ms=st.integers(0, 2 * LEASE_MS))
    def time_passes(self, ms) -> None:
        self.clock.advance(ms)
        self.both(lambda s: s.tick())


TestQueueState = StateMachine.TestCase
TestQueueState.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class Touchy(str):
    """A session whose comparison fails."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError(f"cannot compare {other!r}")

    __hash__ = str.__hash__


class Entry(QueueEntry):
    """A message of another class: left to the twin."""

    __slots__ = ()


@settings(max_examples=200, deadline=None)
@given(
    offsets=st.lists(st.integers(-3, 12), max_size=12),
    queued=st.sets(st.integers(-3, 12)),
    partition=st.sampled_from([0, 1, True, 1.0]),
)
def test_the_walk_of_arrivals_is_the_twins(offsets, queued, partition):
    """first_queued drops from the arrivals' front the offsets whose message left, and
    returns the first one's message, as `_first_queued` does (a partition that only
    equals the ids' finds them as a dict does)."""
    entries = {("orders", 1, offset): object() for offset in queued}
    outcomes = []
    for walk in (core.first_queued, _first_queued):  # type: ignore[union-attr]
        order = deque(offsets)
        outcomes.append((walk(order, entries, "orders", partition), list(order)))
    assert outcomes[0] == outcomes[1]


def test_the_walk_of_arrivals_fails_as_the_twin():
    """Arrivals that are not a deque (a list: no popleft) fail in both with the same
    error, once an offset must be dropped."""
    entries = {("orders", 0, 5): object()}
    errors = []
    for walk in (core.first_queued, _first_queued):  # type: ignore[union-attr]
        with pytest.raises(AttributeError) as caught:
            walk([1, 5], entries, "orders", 0)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("position", [2**64, 3.0, None])
def test_a_position_the_enqueuer_does_not_read_is_left_to_the_twin(position):
    """A partition's position that is not an int of 64 bits (or none at all) leaves its
    messages to the twin, and the queue ends as the twin's."""
    outcomes = []
    for cls in (QueueState, TwinState):
        state = cls(QueuePolicy("Q"), FakeClock())
        if position is not None:
            state.start_at(("orders", 0), position)  # type: ignore[arg-type]
        read = [QueueEntry(("orders", p, o), 1, b"{}") for o in (2, 3, 5) for p in (0, 1)]
        state.enqueue_read(read)
        outcomes.append((snapshot(state), state.recovery_point()))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("odd", ["session", "entry", "generator"])
def test_errors_and_other_classes_end_as_the_twins(odd: str):
    """A session whose comparison raises fails both at the same message with the same
    state behind; an entry of another class and messages given as a generator are
    acked as the twin acks them."""
    outcomes = []
    for cls in (QueueState, TwinState):
        state = cls(QueuePolicy("Q", max_backlog=10), FakeClock())
        holder = Subscription("s", Touchy("a") if odd == "session" else "a", max_backlog=10)
        state.subscribe(holder)
        make = Entry if odd == "entry" else QueueEntry
        for offset in range(4):
            state.enqueue(make(("orders", 0, offset), 1, b"{}"))
        state.dispatch()
        ids = [("orders", 0, offset) for offset in (2, 0, 3, 1)]
        try:
            answer: Any = state.ack(iter(ids) if odd == "generator" else ids, "a")
        except RuntimeError as exc:
            answer = str(exc)
        outcomes.append((answer, snapshot(state)))
    assert outcomes[0] == outcomes[1]
    expect = "cannot compare 'a'" if odd == "session" else 4
    assert outcomes[0][0] == expect or outcomes[0][0].acked == expect


def test_acks_recorded_as_runs_make_the_twins_record():
    """The compiled applier's acks go into one run at the outbox's end across calls (a
    topic escaped as orjson escapes it); an id it can't write (an offset past a signed
    64-bit int) gets the twin's QueueEvent in place and the next ack a new run; an ack
    whose topics alternate writes each id's own (the applier keeps the last topic's
    text): the events, one by one, and the record's bytes are the twin's."""
    topics = ['a"\\\n\u00e9', "b", "c"]
    offsets = [0, 1, 2**63]
    outcomes = []
    for cls in (QueueState, TwinState):
        state = cls(QueuePolicy("Q", max_backlog=10), FakeClock())
        state.subscribe(Subscription("s", "a", max_backlog=10))
        for topic in topics:
            for offset in offsets:
                state.enqueue(QueueEntry((topic, 0, offset), 1, b"{}"))
        state.dispatch()
        state.outbox.deliveries.clear()
        state.ack([(topics[0], 0, offset) for offset in (0, 2**63, 1)], "a")
        state.ack([(topics[1], 0, 0), (topics[2], 0, 0), (topics[1], 0, 1)], "a")
        events = state.outbox.take().events
        outcomes.append((expanded(events), events_record(events), [type(e) for e in events]))
    compiled, twin = outcomes
    assert compiled[:2] == twin[:2]
    assert twin[1] == encode_events(twin[0]) and len(twin[0]) == 6
    runs = [kind for kind in compiled[2] if kind is not QueueEvent]
    assert len(runs) == 2 and compiled[2][1] is QueueEvent  # run, event, run
