"""The log envelope round-trips every combination of metadata (hypothesis)."""

import contextlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.envelope import (
    MAX_EXPIRATION,
    Command,
    Envelope,
    EnvelopeError,
    check_expiration,
    is_plain_publish,
)

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


header_names = st.sampled_from(["c", "t", "k", "e", "p", "s", "x", "m", "f", "ks", "z"])
header_values = st.none() | st.binary(max_size=12) | st.integers(-5, 10**6).map(b"%d".__mod__)


@given(st.none() | st.lists(st.tuples(header_names, header_values), max_size=6))
def test_a_record_called_a_plain_publish_decodes_to_one(headers):
    """is_plain_publish is the worker's shortcut past from_headers: never wrong when yes."""
    if not is_plain_publish(headers):
        return
    envelope = Envelope.from_headers(headers)
    assert envelope.command is Command.PUBLISH
    assert (envelope.expiration, envelope.filter, envelope.sow_keys) == (None, None, None)


@given(envelopes.filter(lambda e: e.command is Command.PUBLISH and e.expiration is None))
def test_what_publishers_write_for_a_plain_publish_is_recognised(envelope):
    envelope.filter = envelope.sow_keys = None
    ascii_only = all(
        v is None or v.isascii()
        for v in (envelope.topic, envelope.sow_key, envelope.publisher_id, envelope.correlation_id)
    )
    assert is_plain_publish(envelope.to_headers()) is ascii_only


@pytest.mark.parametrize(
    "headers",
    [
        [("c", b"delta_publish")],
        [("e", b"30")],
        [("s", b"-1")],
        [("s", b"seven")],
        [("p", "é".encode())],
        [("k", None)],
    ],
)
def test_anything_unusual_is_left_to_the_full_decoder(headers):
    assert not is_plain_publish(headers)


@given(
    st.binary(max_size=24)
    | st.floats().map(lambda f: repr(f).encode())
    | st.integers().map(b"%d".__mod__)
)
def test_an_expiration_the_envelope_accepts_fits_a_stored_deadline(value):
    """Issue 13, defect 1: `inf`, `nan`, `1e308` or `1e17` in the `e` header made a deadline
    the packed record could not hold, and the worker died on it."""
    try:
        expiration = Envelope.from_headers([("e", value)]).expiration
    except EnvelopeError as exc:
        assert "'e'" in str(exc)
        return
    assert expiration is not None and 0 <= expiration <= MAX_EXPIRATION
    assert 2**53 + round(expiration * 1000) < 2**63  # any timestamp a log plausibly holds


@given(st.floats() | st.integers(-(2**70), 2**70))
def test_check_expiration_takes_exactly_the_finite_lifetimes_up_to_100_years(value):
    fits = math.isfinite(value) and 0 <= value <= MAX_EXPIRATION
    try:
        assert check_expiration(value) == value and fits
    except MessageError as exc:
        assert not fits and "expiration must be" in str(exc)
