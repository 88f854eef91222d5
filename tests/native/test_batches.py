"""The tcp:// client's messages of a batch frame made by the compiled core
(native/src/batches.rs, message.batch_messages) against the Python twin
(tcp_connection._records' own loop): the same messages, slot for slot, and the same
errors where the entries are odd.

Over generated `recs` (entries that are dicts with `n` within the payload, and odd ones:
`n` missing, a bool, negative, a float, beyond the payload; entries that are not dicts)
and payloads of any bytes, so the compiled builder stops anywhere and the twin goes on.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.client import message as message_module
from amps_on_kafka.client import tcp_connection
from amps_on_kafka.client.acks import AckBatcher
from amps_on_kafka.client.message import GatewayMessage
from amps_on_kafka.native import core
from amps_on_kafka.protocol.frames import Frame

SLOTS = GatewayMessage.__slots__
odd_n = st.sampled_from([True, False, -1, 1.0, "1", None, 2**70]) | st.integers(-3, 10_000)
entries = st.one_of(
    st.fixed_dictionaries({"n": st.integers(0, 40)}, optional={"k": st.text(max_size=3)}),
    st.fixed_dictionaries({}, optional={"n": odd_n, "bm": st.just("t|0|1|")}),
    st.sampled_from([[], "n", 3, None]),
)
ACKS = AckBatcher(lambda header: None)  # a queue burst's messages can be acked: its batcher
frames = st.builds(
    lambda recs, payload, topic, sub_id, command: (
        command,
        Frame({"t": topic, "sub_id": sub_id, "recs": recs}, payload),
        ACKS if command == "publish" else None,
    ),
    st.lists(entries, max_size=8),
    st.binary(max_size=120),
    st.none() | st.text(max_size=3),
    st.none() | st.text(max_size=3),
    st.sampled_from(["sow", "publish"]),
)


def made(
    command: str, frame: Frame, acks: AckBatcher | None, builder: Any
) -> tuple[list, str | None]:
    """The messages _records makes with `builder` (None: the twin alone), as their slot
    values, and the error that ended them, if one did."""
    made: list = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcp_connection, "batch_messages", builder)
        try:
            for message in tcp_connection._records(command, frame, acks):
                assert type(message) is GatewayMessage
                made.append([getattr(message, slot) for slot in SLOTS])
        except Exception as exc:  # the twin's error, whichever it is
            return made, f"{type(exc).__name__}: {exc}"
    return made, None


@settings(max_examples=400, deadline=None)
@given(frames)
def test_the_compiled_messages_are_the_twins(case: tuple[str, Frame, AckBatcher | None]) -> None:
    command, frame, acks = case
    compiled = made(command, frame, acks, message_module.batch_messages)
    assert compiled == made(command, frame, acks, None)


def test_a_scans_frame_is_made_by_the_core_and_its_metas_are_the_headers() -> None:
    recs = [{"k": "1", "n": 2}, {"k": "2", "n": 0}, {"k": "3", "n": 3}]
    frame = Frame({"c": "sow", "t": "orders", "recs": recs}, b"{}abc")
    built = message_module.batch_messages(recs, frame.payload, ("sow", "orders", None, None))  # type: ignore[misc]
    messages = list(built)
    assert (built.read, built.offset) == (3, 5)
    assert [m.payload for m in messages] == [b"{}", b"", b"abc"]
    assert [m.meta for m in messages] == recs and messages[0].meta is recs[0]
    assert messages[0].data == {} and messages[1].data is None
    assert messages[0].acks is None and messages[0].sow_key == "1"


def test_a_queue_bursts_messages_carry_its_acks() -> None:
    """The burst's batcher is a frame value: each message made ackable by the core."""
    recs = [{"bm": "q|0|1|", "lp": 100, "n": 2}, {"bm": "q|0|2|", "lp": 100, "n": 2}]
    sent: list[dict[str, Any]] = []
    acks = AckBatcher(sent.append, batch_size=2, timeout=60)  # the batch fills first
    built = message_module.batch_messages(recs, b"{}{}", ("publish", "q", "s", acks))  # type: ignore[misc]
    messages = list(built)
    assert all(m.acks is acks for m in messages)
    for m in messages:
        m.ack()
    acks.close()
    assert sent == [{"c": "sow_delete", "t": "q", "bm": "q|0|1|,q|0|2|"}]


def test_the_core_stops_at_an_entry_it_is_not_sure_of() -> None:
    recs = [{"n": 1}, {"n": True}, {"n": 1}]
    built = message_module.batch_messages(recs, b"ab", ("sow", "t", None, None))  # type: ignore[misc]
    assert len(list(built)) == 1 and (built.read, built.offset) == (1, 1)


def test_a_builder_refuses_a_slot_named_twice_and_a_wrong_frame() -> None:
    with pytest.raises(ValueError, match="a slot is named twice"):
        core.BatchBuilder(GatewayMessage, "meta", "meta", [], [])  # type: ignore[union-attr]
    builder = core.BatchBuilder(GatewayMessage, "meta", "payload", ["topic"], [])  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="a value for each frame slot"):
        builder.build([], b"", ())


def outcome(read: Any) -> tuple[str, object]:
    """What reading gives: ("value", v) or ("error", type and text)."""
    try:
        return ("value", read())
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)))


def test_a_gateway_messages_data_is_read_by_the_compiled_descriptor() -> None:
    assert type(GatewayMessage.__dict__["data"]).__name__ == "LazyData"


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=20)
    | st.builds(
        orjson.dumps,
        st.recursive(st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(), st.lists),
    )
    | st.sampled_from([b"", b"{", b'{"a": 1}', b"\xff", "text", 7]),
    st.booleans(),
)
def test_data_reads_as_the_python_getter_reads(payload: Any, decoded_before: bool) -> None:
    """`GatewayMessage.data` compiled (records.rs's LazyData, with no codec slot) against
    the property's getter: the same value or error, and the same decoded payload kept."""
    getter = GatewayMessage.__dict__["data"].getter
    ours, twin = (GatewayMessage("publish", "q", {}, payload) for _ in range(2))
    if decoded_before:
        outcome(lambda: getter(ours)), outcome(lambda: getter(twin))
    assert outcome(lambda: ours.data) == outcome(lambda: getter(twin))
    assert outcome(lambda: ours._data) == outcome(lambda: twin._data)
