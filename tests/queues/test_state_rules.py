"""The queue rules of seed 002 (Understanding AMPS Queuing), one test per rule, on the pure
state machine with a clock the test moves."""

from __future__ import annotations

import gc
from types import FrameType

import pytest

from amps_on_kafka.expr import compile_filter
from amps_on_kafka.state.queue_removal import COMPACT_SLACK
from amps_on_kafka.state.queue_types import (
    EventKind,
    QueuePolicy,
    Reason,
    Status,
    Subscription,
    effective_backlog,
    expanded,
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


def matches(text: str):
    return compile_filter(text).matches


# -- delivery semantics --------------------------------------------------------------


def test_at_least_once_delivers_each_message_to_a_single_subscriber_at_a_time():
    state = queue()
    a, b = subscriber(state, "a", 5), subscriber(state, "b", 5)
    fill(state, 6)
    deliveries = run(state)
    assert sorted(offsets(deliveries)) == list(range(6))
    assert {d.subscription.sub_id for d in deliveries} == {"a", "b"}
    assert a.outstanding + b.outstanding == 6
    assert all(state.entries[d.entry.id].status is Status.LEASED for d in deliveries)


def test_at_least_once_ack_with_the_bookmark_removes_the_message():
    state = queue()
    subscriber(state, "a")
    [first] = fill(state, 1)
    run(state)
    result = state.ack([first], "a")
    assert result.acked == 1
    assert first not in state.entries
    assert [(e.kind, e.reason) for e in events_of(state)] == [(EventKind.REMOVE, Reason.ACK)]


@pytest.mark.parametrize(("limit", "recorded"), [(None, []), (3, [EventKind.DELIVER])])
def test_deliveries_are_recorded_only_when_MaxDeliveries_needs_the_count(limit, recorded):
    state = queue(max_deliveries=limit)
    subscriber(state, "a")
    fill(state, 1)
    run(state)
    assert [e.kind for e in events_of(state)] == recorded


def test_at_least_once_lease_that_runs_out_makes_the_message_available_to_another_subscriber():
    clock = FakeClock()
    state = queue(clock, lease_ms=1000, fairness="round-robin")
    a = subscriber(state, "a")
    fill(state, 1)
    assert to(run(state)) == [("a", 0)]
    b = subscriber(state, "b")
    clock.advance(999)
    state.tick()
    assert run(state) == []
    clock.advance(1)
    state.tick()
    assert a.outstanding == 0
    deliveries = run(state)
    assert to(deliveries) == [("b", 0)]
    assert deliveries[0].entry.deliveries == 2
    assert b.outstanding == 1


def test_at_least_once_disconnect_breaks_the_leases_at_once():
    state = queue(lease_ms=60_000)
    subscriber(state, "a", 2, session="s1")
    fill(state, 2)
    run(state)
    b = subscriber(state, "b", 2, session="s2")
    state.disconnect("s1")
    assert sorted(offsets(run(state))) == [0, 1]
    assert b.outstanding == 2


def test_at_most_once_removes_the_message_from_the_queue_when_it_is_delivered():
    state = queue(at_most_once=True, fairness="round-robin")
    subscriber(state, "a")
    [first] = fill(state, 1)
    run(state)
    assert first not in state.entries
    assert state.browse() == []
    [event] = events_of(state)
    assert (event.kind, event.reason) == (EventKind.REMOVE, Reason.TAKEN)


def test_at_most_once_subscriber_still_acks_to_free_its_backlog():
    state = queue(at_most_once=True, fairness="round-robin")
    a = subscriber(state, "a")
    first, _ = fill(state, 2)
    assert offsets(run(state)) == [0]
    assert run(state) == []  # backlog full until the ack
    assert state.ack([first], "a").acked == 1
    assert a.outstanding == 0
    assert offsets(run(state)) == [1]


@pytest.mark.parametrize("verb", ["cancel", "expire"])
def test_at_most_once_cancel_and_expire_have_no_effect_on_the_message(verb):
    state = queue(at_most_once=True, fairness="round-robin")
    subscriber(state, "a")
    [first] = fill(state, 1)
    run(state)
    events_of(state)
    getattr(state, verb)([first], "a")
    assert run(state) == []  # not returned to the queue
    assert events_of(state) == []  # nothing new to record
    assert state.depth == 0


@pytest.mark.parametrize("verb", ["cancel", "expire"])
def test_at_most_once_cancel_and_expire_have_no_effect_on_a_message_not_delivered_yet(verb):
    state = queue(at_most_once=True, fairness="round-robin", permissive=True, max_cancels=0)
    [first] = fill(state, 1)
    assert getattr(state, verb)([first], "anyone").acked == 0
    assert events_of(state) == []
    assert state.entries[first].status is Status.AVAILABLE


def test_at_most_once_message_is_not_redelivered_when_the_subscriber_fails():
    clock = FakeClock()
    state = queue(clock, at_most_once=True, fairness="round-robin", lease_ms=100)
    a = subscriber(state, "a")
    fill(state, 1)
    run(state)
    state.disconnect("a")
    clock.advance(1000)
    state.tick()
    subscriber(state, "b")
    assert run(state) == []
    assert a.outstanding == 0


# -- subscription backlog --------------------------------------------------------------


def test_backlog_defaults_to_one_when_the_subscription_gives_no_max_backlog():
    assert effective_backlog(None, [QueuePolicy("Q", max_backlog=100)]) == 1


def test_backlog_is_the_minimum_of_max_backlog_and_every_matched_MaxPerSubscriptionBacklog():
    policies = [QueuePolicy("A", max_backlog=8), QueuePolicy("B", max_backlog=3)]
    assert effective_backlog(10, policies) == 3
    assert effective_backlog(2, policies) == 2


def test_backlog_never_exceeded_and_refilled_as_messages_are_acknowledged():
    state = queue()
    a = subscriber(state, "a", 3)
    ids = fill(state, 10)
    assert offsets(run(state)) == [0, 1, 2]
    assert run(state) == []
    state.ack(ids[:2], "a")
    assert offsets(run(state)) == [3, 4]
    assert a.outstanding == 3


def test_backlog_is_shared_by_every_queue_a_subscription_matches():
    clock = FakeClock()
    first, second = queue(clock), queue(clock)
    shared = Subscription("s", "s", None, 3)
    first.subscribe(shared)
    second.subscribe(shared)
    fill(first, 2)
    fill(second, 5, topic="other")
    assert len(run(first)) == 2
    assert len(run(second)) == 1
    assert shared.outstanding == 3


# -- delivery fairness -----------------------------------------------------------------


def _with_backlogs(fairness: str, leased: dict[str, tuple[int, int]]):
    """Subscribers with (max_backlog, currently leased) each."""
    state = queue(fairness=fairness)
    subs = {}
    for name, (backlog, count) in leased.items():
        sub = subscriber(state, name, backlog)
        sub.outstanding = count  # leased from other queues
        subs[name] = sub
    return state, subs


def test_proportional_inky_blinky_clyde_goes_to_clyde():
    """Inky 1 of 2 (50%), Blinky 3 of 4 (75%), Clyde 4 of 10 (40%): Clyde has most room."""
    state, _ = _with_backlogs("proportional", {"Inky": (2, 1), "Blinky": (4, 3), "Clyde": (10, 4)})
    fill(state, 1)
    assert to(run(state)) == [("Clyde", 0)]


def test_proportional_same_unused_capacity_goes_to_the_first_subscription_found():
    state, _ = _with_backlogs("proportional", {"a": (4, 2), "b": (2, 1), "c": (8, 4)})
    fill(state, 1)
    assert to(run(state)) == [("a", 0)]


def test_proportional_is_the_default_for_at_least_once_and_round_robin_for_at_most_once():
    from amps_on_kafka.config import QueueConfig

    assert QueueConfig(Name="q").fairness == "proportional"
    assert QueueConfig(Name="q", Semantics="at-most-once").fairness == "round-robin"


def test_fast_delivers_to_the_first_subscription_found_without_a_full_backlog():
    state = queue(fairness="fast")
    subscriber(state, "a", 2)
    subscriber(state, "b", 2)
    fill(state, 3)
    assert to(run(state)) == [("a", 0), ("a", 1), ("b", 2)]


def test_round_robin_delivers_evenly_among_subscribers_with_room():
    state = queue(fairness="round-robin")
    for name in "abc":
        subscriber(state, name, 10)
    fill(state, 6)
    assert [s for s, _ in to(run(state))] == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_skips_subscriptions_whose_backlog_is_full():
    state = queue(fairness="round-robin")
    subscriber(state, "a", 1)
    subscriber(state, "b", 10)
    subscriber(state, "c", 10)
    fill(state, 5)
    assert [s for s, _ in to(run(state))] == ["a", "b", "c", "b", "c"]


# -- order -------------------------------------------------------------------------------


def test_oldest_message_first():
    state = queue()
    subscriber(state, "a", 100)
    fill(state, 5)
    assert offsets(run(state)) == [0, 1, 2, 3, 4]


def test_returned_message_keeps_its_place_as_oldest():
    clock = FakeClock()
    state = queue(clock, lease_ms=10)
    subscriber(state, "a", 1)
    fill(state, 3)
    assert offsets(run(state)) == [0]
    clock.advance(10)
    state.tick()
    assert offsets(run(state)) == [0]


def test_filtered_subscription_gets_the_oldest_message_that_matches():
    state = queue()
    subscriber(state, "a", 10, flt=matches("/n > 2"))
    fill(state, 6)
    assert offsets(run(state)) == [3, 4, 5]
    assert sorted(e.id[2] for e in state.browse() if e.status is Status.AVAILABLE) == [0, 1, 2]


def test_a_returned_message_goes_before_later_ones_passed_over_while_its_holder_was_full():
    state = queue()
    subscriber(state, "odd", 2, flt=matches("/n % 2 = 1"))
    even = subscriber(state, "even", 1, flt=matches("/n % 2 = 0"))
    fill(state, 3)
    assert to(run(state)) == [("even", 0), ("odd", 1)]  # 2 waits: only "even" wants it
    state.cancel([("orders", 0, 0)], "even")
    assert to(run(state)) == [("even", 0)]
    assert even.outstanding == 1


def test_a_subscription_that_ended_is_not_kept_alive_by_messages_it_wanted():
    state = queue()
    subscriber(state, "picky", 1, flt=matches("/n = 999"))
    gone = subscriber(state, "gone", 1)
    fill(state, 2)
    assert to(run(state)) == [("gone", 0)]  # 1 waits for "gone": "picky" has room, no use
    state.unsubscribe(gone)
    holders = [r for r in gc.get_referrers(gone) if not isinstance(r, FrameType)]
    assert holders == []
    assert sorted(e.id[2] for e in state.browse()) == [0, 1]


def test_messages_no_subscriber_with_room_wants_are_not_filtered_again_on_every_dispatch():
    """Dispatch stays proportional to what it delivers, not to how many messages wait
    for a subscriber that is full or absent."""
    evaluations = 0

    def wants_even(data):
        nonlocal evaluations
        evaluations += 1
        return data["n"] % 2 == 0

    state = queue()
    subscriber(state, "even", 1, flt=wants_even)
    fill(state, 1000)
    delivered = 0
    while got := run(state):  # one message at a time: 500 dispatches
        delivered += len(got)
        state.ack([d.entry.id for d in got], "even")
    assert delivered == 500
    assert sorted(e.id[2] for e in state.browse()) == list(range(1, 1000, 2))
    assert evaluations < 3 * 1000  # each of the 500 odd ones was looked at 250 times before


def test_priority_highest_first_and_oldest_first_within_a_priority():
    state = queue(priority=lambda d: d["p"])
    subscriber(state, "a", 100)
    for offset, p in enumerate([1, 5, 3, 5, 1]):
        state.enqueue(message(offset, {"p": p}))
    assert offsets(run(state)) == [1, 3, 2, 0, 4]


@pytest.mark.parametrize("value", [None, "high", -1, 1.9e19, True], ids=str)
def test_priority_null_non_numeric_or_not_unsigned_64_bit_is_lowest(value):
    state = queue(priority=lambda d: d.get("p"))
    subscriber(state, "a", 100)
    state.enqueue(message(0, {"p": value}))
    state.enqueue(message(1, {"p": 0}))
    state.enqueue(message(2, {"p": 2**64 - 1}))
    assert offsets(run(state)) == [2, 1, 0]


def test_priority_from_a_configured_expression():
    from amps_on_kafka.config import QueueConfig

    policy = QueuePolicy.from_config(QueueConfig(Name="q", Priority="/price * /qty"))
    assert policy.rank({"price": 2.5, "qty": 4}) == 10
    assert policy.rank({"price": 2}) == -1


# -- acknowledging -----------------------------------------------------------------------


def test_one_ack_can_carry_several_bookmarks():
    state = queue()
    subscriber(state, "a", 5)
    ids = fill(state, 5)
    run(state)
    assert state.ack(ids[1:4], "a").acked == 3
    assert sorted(state.entries) == [ids[0], ids[4]]


def test_cancel_returns_the_message_and_counts_toward_MaxCancels():
    state = queue(max_cancels=2)
    subscriber(state, "a")
    [first] = fill(state, 1)
    for cancels in (1, 2):
        run(state)
        assert state.cancel([first], "a").acked == 1
        assert state.entries[first].cancels == cancels
        assert state.entries[first].status is Status.AVAILABLE
    run(state)
    state.cancel([first], "a")  # the third cancel is greater than MaxCancels
    assert first not in state.entries
    box = state.outbox.take()
    assert expanded(box.events)[-1].reason is Reason.EXPIRE
    assert [e.id for e in box.dead_letters] == [first]


def test_expire_removes_the_message_at_once_for_the_dead_letter_topic():
    state = queue()
    subscriber(state, "a")
    [first] = fill(state, 1)
    run(state)
    assert state.expire([first], "a").acked == 1
    assert run(state) == []
    assert [e.id for e in state.outbox.take().dead_letters] == [first]


def test_ack_by_filter_acks_every_match_leased_or_not():
    state = queue(permissive=True)
    subscriber(state, "a", 2, session="s1")
    fill(state, 5)
    run(state)  # 0 and 1 leased to s1
    assert state.ack_by_filter(matches("/n IN (1, 2, 3)"), "s2") == 3
    assert sorted(m[2] for m in state.entries) == [0, 4]


def test_ack_by_filter_with_strict_leasing_leaves_messages_another_session_holds():
    state = queue()
    subscriber(state, "a", 2, session="s1")
    fill(state, 5)
    run(state)
    assert state.ack_by_filter(matches("/n IN (1, 2, 3)"), "s2") == 2
    assert sorted(m[2] for m in state.entries) == [0, 1, 4]


def test_strict_leasing_refuses_an_ack_from_a_session_without_the_lease():
    clock = FakeClock()
    state = queue(clock, lease_ms=10)
    subscriber(state, "a", session="s1")
    [first] = fill(state, 1)
    run(state)
    first_bookmark = "orders|0|0|"
    assert state.ack([first], "s2").refused == (first_bookmark,)
    clock.advance(10)
    state.tick()  # the lease ran out: a late ack from the old holder is refused too
    assert state.ack([first], "s1").refused == (first_bookmark,)
    assert first in state.entries


def test_permissive_leasing_accepts_an_ack_without_the_lease():
    state = queue(permissive=True)
    a = subscriber(state, "a", session="s1")
    [first] = fill(state, 1)
    run(state)
    assert state.ack([first], "s2").acked == 1
    assert a.outstanding == 0


# -- leases and lifetimes ------------------------------------------------------------------


def test_lease_runs_out_after_Expiration_removes_the_message():
    clock = FakeClock()
    state = queue(clock, lease_ms=300, expiration_ms=150)
    subscriber(state, "a")
    [first] = fill(state, 1, timestamp=clock.now)
    run(state)
    clock.advance(150)
    state.tick()  # past Expiration while leased: stays with its holder
    assert state.entries[first].status is Status.LEASED
    clock.advance(150)
    state.tick()
    assert first not in state.entries
    assert [e.id for e in state.outbox.take().dead_letters] == [first]


def test_lease_runs_out_at_MaxDeliveries_removes_the_message():
    clock = FakeClock()
    state = queue(clock, lease_ms=10, max_deliveries=2)
    subscriber(state, "a")
    [first] = fill(state, 1)
    delivered = 0
    for _ in range(4):
        delivered += len(run(state))
        clock.advance(10)
        state.tick()
    assert delivered == 2
    assert first not in state.entries


def test_unleased_message_older_than_Expiration_is_removed():
    clock = FakeClock()
    state = queue(clock, expiration_ms=1000)
    first, second = fill(state, 2, timestamp=clock.now)
    state.enqueue(message(2, timestamp=clock.now + 500))
    clock.advance(1000)
    state.tick()
    assert sorted(state.entries) == [("orders", 0, 2)]
    assert {e.id for e in state.outbox.take().dead_letters} == {first, second}


def test_messages_that_expire_unread_do_not_pile_up_while_no_one_subscribes():
    clock = FakeClock()
    state = queue(clock, expiration_ms=1000)
    for start in range(0, 20_000, 2000):
        fill(state, 2000, start=start, timestamp=clock.now)
        clock.advance(1000)
        state.tick()
    assert not state.entries
    assert len(state._ready) <= 2000 + COMPACT_SLACK  # what expired was let go


def test_message_expiration_overrides_the_queue_Expiration():
    clock = FakeClock()
    state = queue(clock, expiration_ms=1000)
    state.enqueue(message(0, timestamp=clock.now, expiration=0.1))
    state.enqueue(message(1, timestamp=clock.now, expiration=0))  # never
    clock.advance(5000)
    state.tick()
    assert list(state.entries) == [("orders", 0, 1)]
    assert state.next_due() is None


# -- browsing --------------------------------------------------------------------------------


def test_sow_on_a_queue_returns_its_current_messages_in_delivery_order():
    state = queue(priority=lambda d: d["p"])
    subscriber(state, "a")
    for offset, p in enumerate([1, 3, 2]):
        state.enqueue(message(offset, {"p": p}))
    run(state)
    assert [e.id[2] for e in state.browse()] == [1, 2, 0]
    assert [e.id[2] for e in state.browse(matches("/p < 3"))] == [2, 0]
