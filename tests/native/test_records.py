"""The compiled replay messages (native/src/records.rs) against their Python twins
(log/message.py): the batch builder against `_BuiltOneByOne` (RecordMessage built one by
one), and the compiled `LogMessage.data` against the Python getter it stands for.

The builder writes the messages' slots itself, so every slot of every message must hold
what the twin's constructor puts there (the same objects), it must stop at the same
record with an error, and a message it built must read (`.data`, `.bookmark`, the
envelope) exactly as one the twin built. `.data` must give the same value, or the same
error, for every codec, payload and state of the message.
"""

from __future__ import annotations

import sys

import orjson
import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log import message as log_message
from amps_on_kafka.log.codecs import BINARY, JSON, codec_for
from amps_on_kafka.log.message import LogMessage, RecordMessage, _BuiltOneByOne
from amps_on_kafka.native import core

AVRO = codec_for("avro", {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
CODECS = st.sampled_from([JSON, BINARY, AVRO])
PAYLOADS = st.one_of(
    st.none(),
    st.binary(max_size=8),
    st.builds(
        orjson.dumps,
        st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**63 - 1), max_size=2),
    ),
    st.sampled_from([b"{", b"\x02", b"\xff\xfe", b"[]", b"null", b"1e400"]),
)
ERRORS = st.sampled_from([KafkaError._PARTITION_EOF, KafkaError.OFFSET_OUT_OF_RANGE])


class _OwnValue(Message):
    """A record type whose value() is its own: the builder calls the C functions of a
    batch's first record's methods directly only for records of exactly that type, so
    this one's value() must be called as Python calls it, wherever it is in a batch."""

    def value(self) -> bytes:
        return b'{"own": 1}'


@st.composite
def records(draw) -> Message:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return Message(topic="t", partition=0, offset=0, error=KafkaError(draw(ERRORS)))
    return (_OwnValue if kind == 1 else Message)(
        topic=draw(st.sampled_from(["t", "orders.v1"])),
        partition=draw(st.integers(0, 3)),
        offset=draw(st.integers(0, 2**40)),
        value=draw(PAYLOADS),
        headers=draw(st.sampled_from([None, [("p", b"pub"), ("s", b"3")], [("c", b"\xff")]])),
        timestamp=(1, draw(st.integers(0, 2**42))),
    )


def compiled(batch: list[Message], codec) -> object:
    return log_message.record_messages(batch, codec)


def _set_slots(message: LogMessage) -> list[str]:
    return [name for name in LogMessage.__slots__ if _is_set(message, name)]


def _is_set(message: LogMessage, name: str) -> bool:
    try:
        LogMessage.__dict__[name].__get__(message)
    except AttributeError:
        return False
    return True


def outcome(read) -> tuple[str, object]:
    """What reading gives: ("value", v) or ("error", type and text)."""
    try:
        return ("value", read())
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)))


def test_the_compiled_builder_and_data_are_in_use():
    assert log_message.record_messages != _BuiltOneByOne
    assert type(LogMessage.__dict__["data"]).__name__ == "LazyData"


@given(st.lists(records(), max_size=6), CODECS)
def test_the_builder_makes_what_the_constructor_makes(batch, codec):
    ours, twin = compiled(batch, codec), _BuiltOneByOne(batch, codec)
    built, expected = list(ours), list(twin)
    assert ours.read == twin.read == len(built) == len(expected)
    assert list(ours) == []  # ended, and stays ended
    for message, other in zip(built, expected, strict=True):
        assert type(message) is RecordMessage
        assert _set_slots(message) == _set_slots(other)
        for name in _set_slots(other):
            mine = LogMessage.__dict__[name].__get__(message)
            assert mine is LogMessage.__dict__[name].__get__(other), name
        assert message.bookmark == other.bookmark
        assert (message.topic, message.timestamp) == (other.topic, other.timestamp)
        assert outcome(lambda m=message: m.data) == outcome(lambda o=other: o.data)
        assert outcome(lambda m=message: m.envelope) == outcome(lambda o=other: o.envelope)


@given(PAYLOADS | st.sampled_from(["text", 7]), CODECS, st.booleans())
def test_data_reads_as_the_python_getter_reads(raw, codec, decoded_before):
    """The same value or error, and the same decoded payload kept in the message."""
    getter = LogMessage.__dict__["data"].getter
    ours, twin = (LogMessage("t", 0, 1, 2, raw, None, codec) for _ in range(2))
    if decoded_before:
        outcome(getter.__get__(ours)), outcome(getter.__get__(twin))
    assert outcome(lambda: ours.data) == outcome(lambda: getter(twin))
    if _is_set(twin, "_data"):
        assert outcome(lambda: ours._data) == outcome(lambda: twin._data)


def test_data_of_an_unset_slot_or_another_object_fails_as_the_getter_does():
    getter = LogMessage.__dict__["data"].getter
    bare = LogMessage.__new__(LogMessage)
    assert outcome(lambda: bare.data) == outcome(lambda: getter(bare))
    assert outcome(lambda: LogMessage.__dict__["data"].__get__(object())) == outcome(
        lambda: getter(object())
    )
    assert LogMessage.__dict__["data"].__get__(None, LogMessage) is LogMessage.__dict__["data"]


class _Posing:
    """Says it is a LogMessage (isinstance agrees) without a LogMessage's slots."""

    __class__ = LogMessage  # type: ignore[assignment]


def test_data_of_an_object_posing_as_a_message_is_the_getters():
    """The compiled descriptor reads slots only of a LogMessage's type, not of whatever
    `__class__` claims: the getter decides for anything else."""
    getter = LogMessage.__dict__["data"].getter
    posing = _Posing()
    assert isinstance(posing, LogMessage)
    assert outcome(lambda: LogMessage.__dict__["data"].__get__(posing)) == outcome(
        lambda: getter(posing)
    )


def test_a_bad_json_payload_raises_message_error_each_time():
    message = next(iter(compiled([Message(topic="t", value=b"{", timestamp=(1, 0))], JSON)))
    for _ in range(2):
        with pytest.raises(MessageError, match="payload is not valid JSON"):
            message.data  # noqa: B018


def test_built_messages_hold_their_references():
    """The builder's slot writes own their references: messages outlive their batch, and
    the records and payloads go with the messages."""
    batch = [Message(topic="t", offset=i, value=b"[%d]" % i, timestamp=(1, 0)) for i in range(50)]
    value, record = batch[0].value(), batch[0]
    messages = list(compiled(batch, JSON))
    del batch
    # value: here, the record's own, message 0's `raw`, getrefcount's argument
    assert sys.getrefcount(value) == 4
    # record: here, message 0's `_record` and `_headers`, the argument
    assert sys.getrefcount(record) == 4
    assert [m.data for m in messages] == [[i] for i in range(50)]
    del messages
    assert sys.getrefcount(record) == 2


@pytest.mark.parametrize(
    ("cls", "slot", "error"),
    [
        (int, "raw", TypeError),
        (type("Open", (), {}), "raw", TypeError),  # instances have a __dict__
        (RecordMessage, "no_such_slot", AttributeError),
        (RecordMessage, "codec", ValueError),  # written twice: the first value would leak
    ],
)
def test_a_builder_refuses_what_it_cannot_lay_out(cls, slot, error):
    with pytest.raises(error):
        core.RecordBuilder(cls, [], slot, "codec", [])
