"""Message types: JSON (default), Avro with a configured schema, opaque binary."""

import contextlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import AvroCodec, codec_for, encode_payload

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sym", "type": "string"},
        {"name": "qty", "type": "double"},
    ],
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_json_documents_round_trip(document):
    codec = codec_for("json")
    assert codec.decode(codec.encode(document)) == document


@given(
    st.fixed_dictionaries(
        {
            "id": st.integers(-(2**63), 2**63 - 1),
            "sym": st.text(),
            "qty": st.floats(allow_nan=False),
        }
    )
)
def test_avro_records_round_trip_through_the_configured_schema(record):
    codec = AvroCodec(ORDER_SCHEMA)
    assert codec.decode(codec.encode(record)) == record


@given(st.binary())
def test_binary_payloads_are_opaque(raw):
    value, document = encode_payload(codec_for("binary"), raw)
    assert value == raw and document == raw


def test_json_text_is_validated_before_it_reaches_the_log():
    with pytest.raises(MessageError, match="not valid JSON"):
        encode_payload(codec_for("json"), '{"id": 1,')


def test_json_text_passes_through_unchanged():
    value, document = encode_payload(codec_for("json"), '{"id": 1}')
    assert value == b'{"id": 1}' and document == {"id": 1}


def test_avro_refuses_a_record_that_does_not_fit_the_schema():
    with pytest.raises(MessageError, match="does not fit the Avro schema"):
        AvroCodec(ORDER_SCHEMA).encode({"id": "one", "sym": "IBM", "qty": 1.0})


@given(st.binary(max_size=64))
def test_avro_garbage_is_a_message_error_never_a_crash(raw):
    with contextlib.suppress(MessageError):
        AvroCodec(ORDER_SCHEMA).decode(raw)


def test_truncated_avro_is_named_without_python_internals():
    with pytest.raises(MessageError, match=r"payload \(2 bytes\) is not valid Avro") as caught:
        AvroCodec(ORDER_SCHEMA).decode(b"\x02\x00")  # a double short
    assert " at 0x" not in str(caught.value)


def test_unknown_message_type_is_named():
    with pytest.raises(MessageError, match="unknown message type 'xml'"):
        codec_for("xml")


orders = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "sym": st.text(),
        "qty": st.floats(allow_nan=False, allow_infinity=False),
    }
)


@given(orders)
def test_json_text_for_an_avro_topic_is_encoded_with_its_schema(record):
    codec = AvroCodec(ORDER_SCHEMA)
    value, document = encode_payload(codec, orjson.dumps(record).decode())
    assert document == record and codec.decode(value) == record
    assert value == codec.encode(record)  # Avro bytes, not the JSON text


def test_bytes_for_an_avro_topic_are_json_as_on_the_wire():
    """The gateway's wire can't tell JSON bytes from Avro ones: bytes are JSON everywhere."""
    codec = AvroCodec(ORDER_SCHEMA)
    record = {"id": 1, "sym": "IBM", "qty": 2.0}
    for payload in (orjson.dumps(record), bytearray(orjson.dumps(record))):
        assert encode_payload(codec, payload) == (codec.encode(record), record)
    with pytest.raises(MessageError, match="Avro bytes already encoded are not taken"):
        encode_payload(codec, codec.encode(record))


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('{"id": "one", "sym": "IBM", "qty": 1}', "on field id"),
        ('{"id": 1, "qty": 1}', "for sym"),
        ('{"id": 1, "sym": "IBM", "qty": 1, "px": 2}', "field 'px' is not in the schema"),
        ('{"id": 1,', "not valid JSON"),
    ],
    ids=["wrong-type", "missing", "unknown", "not-json"],
)
def test_json_text_that_does_not_fit_the_schema_names_the_field(text, complaint):
    with pytest.raises(MessageError, match=complaint):
        encode_payload(AvroCodec(ORDER_SCHEMA), text)
