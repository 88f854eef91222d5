"""The compiled maker of a queue's delivered messages (native/src/queue_messages.rs)
against its Python twin (processor/queues.py `_messages_twin`).

The maker writes each QueueMessage's slots itself and reads the deliveries' slots where
their classes store them, so every slot of every message must hold what the twin's
constructor puts there, for any delivery, and it must fail where the twin fails.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.log.codecs import BINARY, JSON
from amps_on_kafka.native import core
from amps_on_kafka.processor.queues import QueueMessage, _message, _messages_twin, messages_of
from amps_on_kafka.state.queue_types import Delivery, QueueEntry, Subscription

INTS = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([2**64, True])
TOPICS = st.text(max_size=5) | st.sampled_from(["t", "\ud800", 3])
SUBSCRIPTIONS = [Subscription("s1", "a"), Subscription("s2", "b", burst=True)]


class Loose:
    """A delivery of another class: read by its attributes, as the twin reads any."""

    def __init__(self, delivery: Delivery) -> None:
        self.subscription, self.entry = delivery.subscription, delivery.entry
        self.lease_until = delivery.lease_until


@st.composite
def deliveries(draw) -> Delivery | Loose:
    topic, odd = draw(TOPICS), draw(st.integers(0, 9)) == 0
    entry = QueueEntry(
        (topic, draw(INTS), draw(INTS)) if odd else ("t", draw(st.integers(0, 9)), draw(INTS)),
        draw(INTS),
        draw(st.binary(max_size=4)),
        draw(st.sampled_from([JSON, BINARY, None])),
        draw(st.none() | st.just([("p", b"x")])),
        deliveries=draw(st.integers(0, 5)),
    )
    if odd and draw(st.booleans()):
        entry.id = ("t", 1)  # type: ignore[assignment]
    lease = draw(st.none() | INTS | st.just(1.5))
    delivery = Delivery(draw(st.sampled_from(SUBSCRIPTIONS)), entry, lease)
    return Loose(delivery) if odd and draw(st.booleans()) else delivery


def outcome(make, queue, batch, now):
    try:
        made = make(queue, batch, now)
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)))
    return ("made", [[(type(getattr(m, s)), getattr(m, s)) for s in SLOTS] for m in made])


SLOTS = QueueMessage.__slots__


def test_the_compiled_maker_is_in_use():
    assert messages_of != _messages_twin
    assert type(messages_of.__self__) is core.MessageMaker


@given(st.lists(deliveries(), max_size=5), st.integers(-(2**40), 2**40) | st.just(0.5))
def test_the_maker_makes_what_the_twin_makes(batch, now):
    assert outcome(messages_of, "q", batch, now) == outcome(_messages_twin, "q", batch, now)


def test_messages_hold_the_entrys_objects():
    entry = QueueEntry(("t", 2, 7), 5, b"{}", JSON, [("p", b"x")], deliveries=2)
    made = messages_of(
        "q",
        [Delivery(SUBSCRIPTIONS[0], entry, 1_000), Delivery(SUBSCRIPTIONS[1], entry, None)],
        400,
    )
    assert [m.lease_ms for m in made] == [600, None]
    assert made[0].bookmark == entry.bookmark == "t|2|7|"
    assert made[0].id is entry.id and made[0].payload is entry.payload
    assert made[0].headers is entry.headers and made[1].sub_id == "s2"


def test_a_maker_refuses_another_message_layout():
    class Other:
        __slots__ = ("queue", "sub_id")

    with pytest.raises(ValueError, match="must have the slots"):
        core.MessageMaker(Other, Delivery, Subscription, QueueEntry, _message)
