"""The frame codec: round trips and streaming decode, whatever the byte stream's splits."""

from __future__ import annotations

import itertools
import struct

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.protocol.frames import BadFrame, Frame, FrameDecoder, encode_frame

LIMIT = 4096

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
headers = st.dictionaries(st.text(max_size=10), json_values, max_size=6)
payloads = st.binary(max_size=300)


def raw_frame(
    header_bytes: bytes, payload: bytes = b"", *, header_length: int | None = None
) -> bytes:
    """A frame built by hand, so tests can lie about its header length."""
    stated = len(header_bytes) if header_length is None else header_length
    return struct.pack(">II", 4 + len(header_bytes) + len(payload), stated) + header_bytes + payload


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def decode(chunks: list[bytes], limit: int = LIMIT) -> list[Frame | BadFrame]:
    decoder = FrameDecoder(limit)
    return [event for chunk in chunks for event in decoder.feed(chunk)]


@settings(max_examples=200)
@given(
    st.lists(st.tuples(headers, payloads), max_size=8),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_any_split_of_the_stream_decodes_to_the_frames_sent(frames, cuts):
    stream = b"".join(encode_frame(h, p) for h, p in frames)
    events = decode(split(stream, cuts), limit=1 << 20)
    assert events == [Frame(h, p) for h, p in frames]


@settings(max_examples=100)
@given(
    st.lists(
        st.sampled_from(["good", "oversized", "bad_json", "not_object", "lying_header_length"]),
        max_size=8,
    ),
    st.lists(st.integers(0, 100_000), max_size=30),
)
def test_bad_frames_are_skipped_and_the_stream_resynchronises(kinds, cuts):
    """Every kind of recoverable bad frame yields one BadFrame and nothing else is lost."""
    stream, expected = b"", []
    for i, kind in enumerate(kinds):
        if kind == "good":
            stream += encode_frame({"c": "publish", "i": i}, b"x" * i)
            expected.append(("frame", i))
        elif kind == "oversized":
            stream += encode_frame({"cid": str(i)}, b"y" * (LIMIT + i))
            expected.append(("bad", {"cid": str(i)}))
        elif kind == "bad_json":
            stream += raw_frame(b"{not json", b"zz")
            expected.append(("bad", None))
        elif kind == "not_object":
            stream += raw_frame(b"[1, 2]")
            expected.append(("bad", None))
        else:
            stream += raw_frame(b"{}", b"abc", header_length=6)  # longer than the frame
            expected.append(("bad", None))
    events = decode(split(stream, cuts))
    seen = [("frame", e.header["i"]) if isinstance(e, Frame) else ("bad", e.header) for e in events]
    assert seen == expected
    assert not any(isinstance(e, BadFrame) and e.fatal for e in events)


def test_an_oversized_frame_is_refused_from_its_header_before_its_payload_arrives():
    """Nothing but the header is read: the answer comes although 4 GB never arrive."""
    decoder = FrameDecoder(LIMIT)
    header = orjson.dumps({"c": "publish", "cid": "7"})
    events = decoder.feed(struct.pack(">II", 0xFFFFFFFF, len(header)) + header + b"a" * 10_000)
    assert events == [
        BadFrame(
            f"frame of {0xFFFFFFFF} bytes exceeds the limit of {LIMIT}",
            {"c": "publish", "cid": "7"},
        )
    ]
    for _ in range(50):  # a megabyte of the payload streams through without piling up
        assert decoder.feed(b"b" * 20_000) == []


def test_an_oversized_frame_with_a_huge_header_is_refused_without_its_header():
    header = orjson.dumps({"pad": "p" * (LIMIT * 2)})
    events = decode([encode_frame({"pad": "p" * (LIMIT * 2)}), encode_frame({"c": "heartbeat"})])
    assert len(header) > LIMIT
    assert events[0].header is None and "exceeds the limit" in events[0].reason
    assert events[1] == Frame({"c": "heartbeat"}, b"")


def test_malformed_json_is_reported_with_the_parser_reason():
    [event] = decode([raw_frame(b'{"c": ')])
    assert isinstance(event, BadFrame)
    assert event.reason.startswith("frame header is not valid JSON")
    assert not event.fatal


def test_a_length_too_small_for_the_header_length_breaks_the_stream():
    decoder = FrameDecoder(LIMIT)
    [event] = decoder.feed(struct.pack(">I", 2) + b"xx" + encode_frame({"c": "heartbeat"}))
    assert event.fatal and "can't hold a header length" in event.reason
    assert decoder.feed(encode_frame({"c": "heartbeat"})) == []  # nothing after a break


def test_a_frame_exactly_at_the_limit_is_accepted():
    header = orjson.dumps({"c": "publish"})
    payload = b"p" * (LIMIT - 4 - len(header))
    assert decode([encode_frame({"c": "publish"}, payload)]) == [Frame({"c": "publish"}, payload)]
    assert isinstance(decode([encode_frame({"c": "publish"}, payload + b"!")])[0], BadFrame)
