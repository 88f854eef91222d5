"""The compiled maker of a queue's delivered messages (native/src/queue_messages.rs)
against its Python twin (processor/queues.py `_messages_twin`), the compiled writer
of a batched subscription's `recs` entries against its twin (server/queues.py
`_write_recs_twin`), and the compiled count of redeliveries against its twin
(processor/queue_recording.py `_redelivered_twin`).

The maker writes each QueueMessage's slots itself and reads the deliveries' slots where
their classes store them, so every slot of every message must hold what the twin's
constructor puts there, for any delivery, and it must fail where the twin fails.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.log.codecs import BINARY, JSON
from amps_on_kafka.native import core
from amps_on_kafka.processor import queue_recording
from amps_on_kafka.processor.queue_recording import _redelivered_twin, redelivered
from amps_on_kafka.processor.queues import QueueMessage, _message, _messages_twin, messages_of
from amps_on_kafka.server.queues import _write_recs_twin, burst_records, write_recs
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


# -- a batched subscription's `recs` written from its deliveries (BurstWriter) ---------------
class Avro:
    """A codec whose payloads are converted (Avro goes out as JSON)."""

    message_type = "avro"

    def decode(self, payload: bytes) -> object:
        if payload.startswith(b"!"):
            raise ValueError("not avro")
        return {"was": payload.hex()}


CODECS = st.sampled_from([None, None, JSON, BINARY, Avro()])


@st.composite
def burst(draw) -> list[Delivery | Loose]:
    """A burst's deliveries: mostly plain, some of every shape the writer leaves."""
    made = draw(st.lists(deliveries(), max_size=8))
    for delivery in made:
        if draw(st.integers(0, 3)) == 0:
            delivery.entry.codec = draw(CODECS)
    return made


def written(write, batch, now):
    try:
        recs, payloads, size = burst_records("q", "s", batch, now, write)
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)))
    return ("written", recs, payloads, size)


def test_the_compiled_burst_writer_is_in_use():
    assert write_recs != _write_recs_twin
    assert type(write_recs.__self__) is core.BurstWriter


@given(burst(), st.integers(-(2**40), 2**40) | st.just(0.5))
def test_a_burst_is_written_as_the_twin_writes_it(batch, now):
    """The same entries' bytes, payloads and size, or the same error, for any burst: the
    writer's stops (another codec, another shape) are made by the caller as the twin's."""
    assert written(write_recs, batch, now) == written(_write_recs_twin, batch, now)


def test_the_writer_writes_what_orjson_writes_for_the_dict():
    plain = QueueEntry(('a"\\\n', 0, 2**63 - 1), -(2**63), b"{}", JSON)
    barrier = QueueEntry(("t", 3, 4), 5, b"xyz")
    batch = [Delivery(SUBSCRIPTIONS[1], plain, 900), Delivery(SUBSCRIPTIONS[1], barrier, None)]
    recs, payloads = [], []
    assert write_recs(batch, 0, 400, JSON, recs, payloads, 7) == (2, 12)
    assert recs == [
        orjson.dumps({"bm": plain.bookmark, "ts": -(2**63), "lp": 500, "n": 2}),
        orjson.dumps({"bm": "t|3|4|", "ts": 5, "n": 3}),
    ]
    assert payloads[0] is plain.payload and payloads[1] is barrier.payload


def test_the_writer_stops_where_the_caller_goes_on():
    """At a codec other than None and `plain`, and (compiled) at a shape it leaves: what it
    wrote so far stands, and the index says where the caller takes over."""
    entries = [QueueEntry(("t", 0, n), 1, b"{}", codec) for n, codec in enumerate([None, JSON])]
    batch = [Delivery(SUBSCRIPTIONS[1], entry, 10) for entry in entries]
    for write in (write_recs, _write_recs_twin):
        recs: list[bytes] = []
        assert write(batch, 0, 0, None, recs, [], 0) == (1, 2)
        assert write(batch, 1, 0, JSON, recs, [], 2) == (2, 4)
    odd = [Delivery(SUBSCRIPTIONS[1], QueueEntry(("t", 0, 1), 2**64, b""), None)]
    assert write_recs(odd, 0, 0, None, [], [], 0) == (0, 0)
    assert write_recs(batch, 0, 2**64, None, [], [], 0) == (0, 0)


@given(st.lists(st.tuples(deliveries(), INTS | st.integers(0, 3)), max_size=6))
def test_redeliveries_are_counted_as_the_twin_counts(drawn):
    """Any deliveries (of other classes, with a count that is a bool or beyond 64 bits
    among them): the compiled count is the twin's, or None where any is not the common
    form and the twin counts them all."""
    assert queue_recording._redelivered_compiled is not None
    batch = []
    for delivery, times in drawn:
        delivery.entry.deliveries = times
        batch.append(delivery)
    common = all(
        type(d) is Delivery
        and type(d.entry.deliveries) is int
        and -(2**63) <= d.entry.deliveries < 2**63
        for d in batch
    )
    counted = queue_recording._redelivered_compiled(batch)
    assert counted == (_redelivered_twin(batch) if common else None)
    assert redelivered(batch) == _redelivered_twin(batch)
