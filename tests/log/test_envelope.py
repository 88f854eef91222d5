"""The log envelope round-trips every combination of metadata (hypothesis)."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.envelope import Command, Envelope

text = st.text(min_size=1, max_size=40)
envelopes = st.builds(
    Envelope,
    command=st.sampled_from(list(Command)),
    topic=st.none() | text,
    sow_key=st.none() | text,
    expiration=st.none() | st.integers(0, 10**9).map(float) | st.floats(0, 1e9, allow_nan=False),
    publisher_id=st.none() | text,
    sequence=st.none() | st.integers(0, 2**63 - 1),
    correlation_id=st.none() | text,
    message_type=st.sampled_from(["json", "avro", "binary"]),
    filter=st.none() | text,
    sow_keys=st.none() | st.lists(text, max_size=5).map(tuple),
)


@given(envelopes)
def test_every_envelope_round_trips_through_kafka_headers(envelope):
    headers = envelope.to_headers()
    assert all(isinstance(name, str) and isinstance(value, bytes) for name, value in headers)
    assert Envelope.from_headers(headers) == envelope


def test_a_plain_publish_costs_no_header_but_publisher_and_sequence():
    headers = Envelope(publisher_id="p", sequence=7).to_headers()
    assert headers == [("p", b"p"), ("s", b"7")]


def test_no_headers_means_a_json_publish():
    assert Envelope.from_headers(None) == Envelope()
    assert Envelope.from_headers([]).command is Command.PUBLISH


def test_headers_of_other_applications_are_ignored():
    assert Envelope.from_headers([("traceparent", b"00-abc"), ("s", b"3")]) == Envelope(sequence=3)


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("c", b"explode", "unknown command"),
        ("s", b"seven", "'s'"),
        ("e", b"soon", "'e'"),
        ("ks", b"[1, 2]", "list of strings"),
        ("k", b"\xff\xfe", "'k'"),
    ],
)
def test_a_corrupt_header_is_a_message_error_naming_it(name, value, complaint):
    with pytest.raises(MessageError, match="bad envelope header") as caught:
        Envelope.from_headers([(name, value)])
    assert complaint in str(caught.value)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["c", "t", "k", "e", "p", "s", "x", "m", "f", "ks", "z"]),
            st.binary(max_size=20),
        )
    )
)
def test_arbitrary_headers_never_crash_the_decoder(headers):
    with contextlib.suppress(MessageError):
        Envelope.from_headers(headers)
