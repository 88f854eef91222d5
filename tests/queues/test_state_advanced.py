"""Seed 001 (Advanced Queue Configuration) on the pure state machine: barrier messages and
TargetQueueDepth; and the events log: replaying it, and the recovery point."""

from __future__ import annotations

from amps_on_kafka.expr import compile_filter
from amps_on_kafka.state.queue_types import (
    EventKind,
    QueueEvent,
    Reason,
    Status,
)
from tests.queues.helpers import (
    FakeClock,
    events_of,
    fill,
    message,
    offsets,
    queue,
    run,
    subscriber,
    to,
)

BARRIER = compile_filter("/barrier = 1").matches


def barrier_queue(**policy):
    return queue(barrier=BARRIER, **policy)


def publish(state, *kinds: str) -> list:
    """Enqueue messages in order: 'm' a plain message, 'B' a barrier."""
    ids = []
    for offset, kind in enumerate(kinds, start=state.positions.get(("orders", 0), 0)):
        entry = message(offset, {"n": offset, "barrier": int(kind == "B")})
        state.enqueue(entry)
        ids.append(entry.id)
    return ids


# -- barrier messages -----------------------------------------------------------------


def test_barrier_is_not_delivered_until_all_previous_messages_are_acknowledged():
    state = barrier_queue()
    subscriber(state, "a", 10)
    first, second, barrier = publish(state, "m", "m", "B")
    assert offsets(run(state)) == [0, 1]
    state.ack([first], "a")
    assert run(state) == []
    state.ack([second], "a")
    assert offsets(run(state)) == [2]
    assert barrier not in state.entries


def test_messages_after_a_barrier_wait_until_the_barrier_is_sent():
    state = barrier_queue()
    subscriber(state, "a", 10)
    first, _, after = publish(state, "m", "B", "m")
    assert offsets(run(state)) == [0]
    assert state.entries[after].status is Status.HELD
    state.ack([first], "a")
    assert offsets(run(state)) == [1, 2]


def test_barrier_goes_to_every_current_subscriber_ignoring_their_backlogs():
    state = barrier_queue()
    a = subscriber(state, "a", 1)
    b = subscriber(state, "b", 1)
    zero = subscriber(state, "zero", 0)  # a max_backlog of 0 still gets the barrier
    first, _ = publish(state, "m", "B")
    run(state)
    state.ack([first], "a" if a.outstanding else "b")
    deliveries = run(state)
    assert sorted(s for s, _ in to(deliveries)) == ["a", "b", "zero"]
    assert all(d.lease_until is None for d in deliveries)
    assert (a.outstanding, b.outstanding, zero.outstanding) == (0, 0, 0)


def test_barrier_leaves_the_queue_without_acknowledgement_and_counts_toward_no_backlog():
    state = barrier_queue()
    a = subscriber(state, "a", 1)
    barrier, _ = publish(state, "B", "m")
    deliveries = run(state)
    assert offsets(deliveries) == [0, 1]  # the barrier did not fill the backlog of 1
    assert barrier not in state.entries
    assert a.outstanding == 1
    reasons = [e.reason for e in events_of(state) if e.kind is EventKind.REMOVE]
    assert reasons == [Reason.BARRIER]


def test_barrier_applies_content_filters_but_pauses_every_subscription():
    state = barrier_queue()
    subscriber(state, "even", 10, flt=compile_filter("/n IN (0, 2, 3)").matches)
    odd = subscriber(state, "odd", 10, flt=compile_filter("/n = 1 OR /n = 3").matches)
    first, _, _, _ = publish(state, "m", "B", "m", "m")
    assert to(run(state)) == [("even", 0)]  # 3 would match odd, but waits behind the barrier
    assert odd.outstanding == 0
    state.ack([first], "even")
    # the barrier (n=1) reaches only odd; then 2 and 3 are delivered (proportionally)
    assert to(run(state)) == [("odd", 1), ("even", 2), ("odd", 3)]


def test_consecutive_barriers_each_wait_for_everything_before_them():
    state = barrier_queue()
    subscriber(state, "a", 10)
    first, _, third, _ = publish(state, "m", "B", "m", "B")
    assert offsets(run(state)) == [0]
    state.ack([first], "a")
    assert offsets(run(state)) == [1, 2]
    state.ack([third], "a")
    assert offsets(run(state)) == [3]
    assert state.depth == 0


def test_barrier_with_no_previous_messages_is_delivered_at_once():
    state = barrier_queue()
    subscriber(state, "a", 1)
    publish(state, "B")
    assert offsets(run(state)) == [0]


def test_barrier_waits_for_at_most_once_deliveries_to_be_acknowledged():
    state = barrier_queue(at_most_once=True, fairness="round-robin")
    subscriber(state, "a", 5)
    first, _ = publish(state, "m", "B")
    assert offsets(run(state)) == [0]
    assert run(state) == []
    state.ack([first], "a")
    assert offsets(run(state)) == [1]


# -- TargetQueueDepth -------------------------------------------------------------------


def test_only_TargetQueueDepth_messages_are_active_and_deliverable():
    state = queue(target_depth=3)
    a = subscriber(state, "a", 10)
    ids = fill(state, 5)
    assert offsets(run(state)) == [0, 1, 2]
    assert (state.active, state.waiting) == (3, 2)
    state.ack(ids[:2], "a")
    assert offsets(run(state)) == [3, 4]
    assert a.outstanding == 3


def test_TargetQueueDepth_sow_and_filtered_ack_see_only_the_active_part():
    state = queue(target_depth=2)
    fill(state, 5)
    assert [e.id[2] for e in state.browse()] == [0, 1]
    assert state.ack_by_filter(compile_filter("/n >= 1").matches, "s") == 1
    assert [e.id[2] for e in state.browse()] == [0, 2]


def test_TargetQueueDepth_no_delivery_when_no_active_message_matches():
    state = queue(target_depth=2)
    subscriber(state, "a", 10, flt=compile_filter("/n = 4").matches)
    fill(state, 5)
    assert run(state) == []


def test_TargetQueueDepth_ack_for_an_inactive_message_is_honoured_when_it_would_activate():
    state = queue(target_depth=1)
    subscriber(state, "a", 10)
    first, second, _ = fill(state, 3)
    assert state.ack([second], "a").acked == 1  # not active yet: remembered
    assert offsets(run(state)) == [0]
    state.ack([first], "a")
    assert offsets(run(state)) == [2]  # the acknowledged message never became active


def test_ack_that_arrives_before_the_message_is_remembered_and_honoured():
    state = queue()
    state.start_at(("orders", 0), 0)
    assert state.ack([("orders", 0, 1)], "a").acked == 1
    subscriber(state, "a", 10)
    fill(state, 3)
    assert offsets(run(state)) == [0, 2]


def test_ack_for_a_message_already_gone_changes_nothing():
    state = queue()
    subscriber(state, "a")
    [first] = fill(state, 1)
    run(state)
    state.ack([first], "a")
    events_of(state)
    assert state.ack([first], "a").acked == 0
    assert events_of(state) == []


# -- the events log ---------------------------------------------------------------------


def _lived(clock: FakeClock, log: list[QueueEvent]):
    """A queue with some history: deliveries, a cancel, acks, an expiry, an early ack.

    After each step the events go to `log`, standing for the events topic: the state
    learns where the next event will land (ev_next), as the engine does from Kafka.
    """
    state = queue(clock, lease_ms=100, max_cancels=5, max_deliveries=10, permissive=True)
    state.start_at(("orders", 0), 0)

    def step(action) -> None:
        action()
        run(state)
        log.extend(events_of(state))
        state.ev_next = len(log)

    subscriber(state, "a", 3)
    step(lambda: fill(state, 6))
    step(lambda: state.ack([("orders", 0, 0)], "a"))
    step(lambda: state.cancel([("orders", 0, 1)], "a"))
    step(lambda: state.ack([("orders", 0, 7)], "a"))  # not read yet
    clock.advance(100)
    step(state.tick)
    step(lambda: state.expire([("orders", 0, 4)], "a"))
    step(lambda: state.ack([("orders", 0, 2), ("orders", 0, 3)], "a"))
    step(lambda: fill(state, 4, start=6))
    step(lambda: state.ack([("orders", 0, 1), ("orders", 0, 5)], "a"))
    step(lambda: state.cancel([("orders", 0, 8)], "a"))
    return state


def test_replaying_the_events_rebuilds_the_same_queue():
    log: list[QueueEvent] = []
    state = _lived(FakeClock(), log)
    rebuilt = queue(FakeClock())
    rebuilt.start_at(("orders", 0), 0)
    for event in log:
        rebuilt.apply_event(event)
    fill(rebuilt, 10)
    assert _counts(rebuilt) == _counts(state)
    assert ("orders", 0, 7) not in rebuilt.entries
    assert rebuilt.outbox.events == []  # replay records nothing


def test_replaying_an_event_twice_changes_nothing():
    state = queue()
    fill(state, 2)
    event = QueueEvent(EventKind.DELIVER, ("orders", 0, 1), deliveries=3, cancels=1)
    state.apply_event(event)
    state.apply_event(event)
    state.apply_event(QueueEvent(EventKind.DELIVER, ("orders", 0, 1), deliveries=2))
    assert (
        state.entries[("orders", 0, 1)].deliveries,
        state.entries[("orders", 0, 1)].cancels,
    ) == (
        3,
        1,
    )


def test_recovery_point_is_the_earliest_offset_with_everything_before_it_removed():
    state = queue()
    subscriber(state, "a", 10)
    ids = fill(state, 5)
    fill(state, 2, partition=1)
    run(state)
    state.ack([ids[0], ids[1], ids[3]], "a")
    state.ack([("orders", 1, 0), ("orders", 1, 1)], "a")
    point = state.recovery_point()
    assert point.offsets == {("orders", 0): 2, ("orders", 1): 2}


def test_rebuilding_from_the_recovery_point_gives_the_same_queue():
    log: list[QueueEvent] = []
    state = _lived(FakeClock(), log)
    point = state.recovery_point()
    assert point.offsets == {("orders", 0): 6}
    assert 0 < point.events < len(log)  # the rebuild skips part of the events log
    rebuilt = queue(FakeClock())
    rebuilt.start_at(("orders", 0), point.offsets[("orders", 0)])
    for event in log[point.events :]:
        rebuilt.apply_event(event)
    fill(rebuilt, 10)
    assert _counts(rebuilt) == _counts(state)


def _counts(state) -> dict:
    return {m: (e.deliveries, e.cancels) for m, e in state.entries.items()}
