"""The compiled split of a gateway read into frames (native/src/frames.rs) against its
Python twin (protocol/frames.py, split_frames) and against the decoder as it was, and
the compiled split of a client's read (client_frames) against the same twin; and
the compiled read of a plain publish's SOW key against its twin
(log/one_frame_publishers.py, payload_key).

A stream of frames — plain publishes as clients write them, near-plain headers (another
key, a key twice, escapes, a sequence that is negative, a float, a boolean or past 64
bits), headers that are not JSON, lengths that disagree, frames over the limit, cut
anywhere into reads — must give the same events read by the compiled core, by the twin,
and by the decoder without `publishes` with its plain publishes made Publish tuples: the
same frames, the same errors naming the problem, the same state after each read.
"""

from __future__ import annotations

import json
import struct
from unittest import mock

import orjson
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.log.one_frame_publishers import payload_key
from amps_on_kafka.native import core
from amps_on_kafka.protocol import frames
from amps_on_kafka.protocol.frames import Event, Frame, FrameDecoder, plain_publish
from amps_on_kafka.server.publishing import plain_extent_twin

LIMIT = 200  # the decoders' frame limit: some frames drawn are larger

spaces = st.sampled_from(["", " ", "\n\t ", "\r"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
names = st.sampled_from(["c", "t", "s", "a", "k", "\\u0063", "é"]) | st.text(max_size=3)
values = (
    st.sampled_from(["publish", "publish ", "Publish", "sow"])
    | scalars
    | st.lists(scalars, max_size=2)
)
sequences = st.integers(0, 2**64 - 1).map(str) | st.sampled_from(  # as written: JSON text
    ["-0", "-1", "1.0", "1e2", "true", "18446744073709551616", "007", '"1"', "null"]
)

ODD = [
    b"",
    b"[]",
    b"{",
    b"null",
    b"\xef\xbb\xbf{}",
    b'{"c":"publish","t":"a","s":1}\x00',
    b'{"c":"publish","t":"\xff","s":1}',
    b'{"c":"publish","t":"\\ud800","s":1}',
    b'{"c":"publish","t":"\\ud83d\\ude42","s":1}',
    b'{"c":"publish","t":"a\\nb","s":1}',
    b'{"c":"publish","t":"a","s":1,}',
    b'{"c":"publish","c":"publish","t":"a"}',
    b'{"c":"publish","t":"a","t":"b"}',
    b'{"c":"publish","t":"a","s":1,"s":2}',
    b'{"t":"a","c":"publish"}',
    b'{"c":"publish"}',
    b'{"c":"publish","t":null}',
    b'{"c":"publish","t":"a","s":NaN}',
    # our client's template (native/src/frames.rs reads it without serde_json) at its edges
    b'{"c":"publish","t":"a","s":0}',
    b'{"c":"publish","t":"a","s":00}',
    b'{"c":"publish","t":"a","s":}',
    b'{"c":"publish","t":"a"}',
    b'{"c":"publish","t":"a","s":9999999999999999999}',
    b'{"c":"publish","t":"a","s":12345678901234567890}',
    b'{"c":"publish","t":"a\x01","s":1}',
    b'{"c":"publish","t":"\xc3\xa9","s":1} ',
]


@st.composite
def headers(draw) -> bytes:
    """A header as a client might write it: mostly a plain publish's, often near one."""
    shape = draw(st.sampled_from(["plain"] * 6 + ["tokens"] * 3 + ["odd"]))
    if shape == "odd":
        return draw(st.sampled_from(ODD))
    dumps = json.dumps if draw(st.booleans()) else lambda v: json.dumps(v, ensure_ascii=False)
    if shape == "plain":
        topic = draw(st.text(max_size=6) | st.sampled_from(["orders", "é", "a\x00", "🙂"]))
        members = [("c", dumps("publish")), ("t", dumps(topic))]
        if draw(st.booleans()):
            members.append(("s", draw(sequences)))
        members = draw(st.permutations(members)) if draw(st.booleans()) else members
    else:
        members = [(n, dumps(v)) for n, v in draw(st.lists(st.tuples(names, values), max_size=4))]
    s = draw(spaces)
    text = "{" + s + ("," + s).join(f"{dumps(n)}{s}:{s}{v}" for n, v in members) + s + "}"
    text = text.replace('"\\\\u0063"', '"\\u0063"')  # the escaped name "c"
    return text.encode("utf-8", "surrogatepass")


@st.composite
def streams(draw) -> bytes:
    """Frames back to back; now and then lengths that disagree or a frame over LIMIT."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        header = draw(headers())
        payload = draw(st.binary(max_size=8) | st.sampled_from([b'{"id": 1}', b"x" * 180]))
        total, header_length = 4 + len(header) + len(payload), len(header)
        fault = draw(st.sampled_from([None] * 8 + ["header", "small", "cut"]))
        if fault == "header":
            header_length = total + draw(st.integers(-3, 3))
        elif fault == "small":
            total = draw(st.integers(0, 3))
        frame = struct.pack(">II", total, header_length) + header + payload
        if fault == "cut":
            frame = frame[: draw(st.integers(0, len(frame)))]
        out.append(frame)
    return b"".join(out)


def today(events: list[Event]) -> list[Event]:
    """The events of a decoder without `publishes`, with its plain publishes as tuples."""
    made: list[Event] = []
    for e in events:
        plain = plain_publish(e.header) if type(e) is Frame else None
        made.append((*plain, e.payload) if plain is not None else e)
    return made


def read_three_ways(stream: bytes, cuts: list[int]) -> list[tuple[list[Event], ...]]:
    compiled = FrameDecoder(LIMIT, publishes=True)
    plain = FrameDecoder(LIMIT)  # a client's decoder: compiled too (client_frames)
    with mock.patch.object(frames, "core", None):
        twin, plain_twin = FrameDecoder(LIMIT, publishes=True), FrameDecoder(LIMIT)
    reads, start = [], 0
    for end in [*sorted(cuts), len(stream)]:
        chunk = stream[start:end]
        start = max(start, end)
        results = tuple(d.feed(chunk) for d in (compiled, twin, plain, plain_twin))
        assert results[2] == results[3]  # a client's compiled split gives its twin's events
        reads.append((*results[:2], today(results[2])))
        states = {(d.partial, d.broken) for d in (compiled, twin, plain, plain_twin)}
        assert len(states) == 1, states
    return reads


@settings(max_examples=500, deadline=None)
@given(streams().flatmap(lambda b: st.tuples(st.just(b), st.lists(st.integers(0, len(b))))))
@example((orjson.dumps({"c": "publish", "t": "a", "s": 1}), []))
def test_the_compiled_split_gives_the_twins_events_and_todays(case):
    stream, cuts = case
    for compiled, twin, before in read_three_ways(stream, cuts):
        assert compiled == twin == before
        for e in compiled:
            event("plain publish" if type(e) is tuple else type(e).__name__)


def test_a_plain_publish_is_read_as_a_tuple_and_anything_else_as_before():
    stream = b"".join(
        frames.encode_frame(header, b'{"id": 1}')
        for header in (
            {"c": "publish", "t": "orders", "s": 7},
            {"c": "publish", "t": "orders"},
            {"c": "publish", "t": "orders", "s": 7, "a": "persisted"},
            {"c": "publish", "t": "orders", "s": -1},
        )
    )
    events = FrameDecoder(LIMIT, publishes=True).feed(stream)
    assert events[:2] == [("orders", 7, b'{"id": 1}'), ("orders", None, b'{"id": 1}')]
    assert [type(e) for e in events[2:]] == [Frame, Frame]


def test_the_core_reads_plain_publishes_without_the_twin():
    stream = bytearray(frames.encode_frame({"c": "publish", "t": "é", "s": 2**64 - 1}, b"{}"))

    def twin(*_frame: int) -> Event:
        raise AssertionError("a plain publish was handed to the twin")

    assert core.split_frames(stream, 0, LIMIT, twin) == ([("é", 2**64 - 1, b"{}")], len(stream))


# -- a plain publish's SOW key, read from its payload (publish_key) ----------------------
PAYLOADS = [
    b'{"id": 1e400}',
    b'{"id": 1, "v": 1e400}',
    b'{"id": -0}',
    b'{"id": 18446744073709551615}',
    b'{"id": 18446744073709551616}',
    b'{"id": -9223372036854775809}',
    b'{"id": "\\ud800"}',
    b'{"id": "a", "v": "\\udc00"}',
    b'{"i\\u0064": "x"}',
    b'{"id": 1, "id": 2}',
    b'{"id": ""}',
    b'{"id": true}',
    b'{"id": 1.5}',
    b'{"id": 1, "v": ' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"id": 1}\x00',
    b"\xef\xbb\xbf{}",
    b"[1, 2]",
    b'"text"',
    b"",
    # what native/src/json_scan.rs answers itself, or leaves to serde_json, at its edges
    b'{"v": "a\\"b\\\\\\/\\n\\u00e9", "id": "k", "w": [1e99, -0.5E-99, 1e100, 0]}',
    b'{"v": 1' + b"0" * 299 + b', "id": 1' + b"0" * 18 + b"}",
    b'{"id": 1' + b"0" * 19 + b"}",
    b'{"id": 1, "v": 1' + b"0" * 300 + b"}",
    b'{"id": 1, "v": 1e308}',
    b'{"id": 1, "v": 01}',
    b'{"id": 1, "v": 1.}',
    b'{"id": 1, "v": [1,]}',
    b'{"id": 1, "v": "\xc3\xa9\xe2\x82\xac"}',
    b'{"id": 1, "v": "\xc3"}',
    b'{"id": 1, "v": "tab\there"}',
    b'{"id": 1, "v": "\\x"}',
    b'{"id": "\xc3\xa9t\xc3\xa9", "v": ' + b"[" * 100 + b"]" * 100 + b"}",
    b'\t{"id" : "k" ,"v":{"id":2}}\r\n',
]


@st.composite
def payloads(draw) -> bytes:
    """A publish's payload: mostly an object with or without its key field, now and then
    odd, broken or cut."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(PAYLOADS))
    members = draw(st.lists(st.tuples(st.sampled_from(["id", "v", "é"]), values), max_size=3))
    if draw(st.booleans()):
        key = draw(st.integers(-(2**65), 2**65) | st.text(max_size=3) | scalars)
        members.insert(draw(st.integers(0, len(members))), ("id", key))
    dumps = json.dumps if draw(st.booleans()) else lambda v: json.dumps(v, ensure_ascii=False)
    s = draw(spaces)
    text = "{" + ("," + s).join(f"{dumps(n)}:{s}{dumps(v)}" for n, v in members) + "}"
    raw = text.encode("utf-8", "surrogatepass")
    return raw[: draw(st.integers(0, len(raw)))] if draw(st.integers(0, 9)) == 0 else raw


@settings(max_examples=500, deadline=None)
@given(payloads(), st.sampled_from(["id", None]))
@example(b'{"id": 7, "v": [1, {"a": null}]}', "id")
def test_the_compiled_key_read_gives_the_twins_or_leaves_it_the_payload(payload, field):
    compiled, twin = core.publish_key(payload, field), payload_key(payload, field)
    event("left to the twin" if compiled is False and twin is not False else "same answer")
    if twin is False:
        assert compiled is False
    elif compiled is not False:
        assert compiled == twin


def test_a_plain_key_is_read_by_the_core():
    assert core.publish_key(b'{"v": [1.5, {"id": 2}], "id": 7}', "id") == "7"
    assert core.publish_key(b'{"id": "k\\u00e9"}', "id") == "ké"
    assert core.publish_key(b'{"id": "k"} ', None) is None
    assert core.publish_key(b'\t{"id" : "k" ,"v":{"id":2}}\r\n', "id") == "k"
    assert core.publish_key(b'{"v": "\\"\\u00e9", "id": 1' + b"0" * 18 + b"}", "id") == str(10**18)
    assert core.publish_key(b'{"id": "\xc3\xa9", "v": [-0.5E-99, 1e99]}', "id") == "\u00e9"


# -- the run of plain publishes a read's batch may take (plain_extent) ------------------
@st.composite
def runs(draw) -> tuple[list[Event], int, int, int, set[str]]:
    """Events as a read gives them (Publish tuples, now and then a Frame), a start and
    end within them, a byte room and the topics taken."""
    topics = st.sampled_from(["a", "b", "é"])
    publish = st.tuples(topics, st.none() | st.integers(0, 9), st.binary(max_size=40))
    frame = st.just(Frame({"c": "flush"}, b""))
    events = draw(st.lists(publish | frame | publish, max_size=12))
    start = draw(st.integers(0, len(events)))
    last = draw(st.integers(start, len(events)))
    return events, start, last, draw(st.integers(-1, 400)), draw(st.sets(topics))


@settings(max_examples=300, deadline=None)
@given(runs(), st.sampled_from([0, 16]))
def test_the_compiled_extent_of_a_run_is_the_twins(run, overhead):
    events, start, last, room, taken = run
    asked: dict[str, list[str]] = {"compiled": [], "twin": []}

    def takes(side: str):  # a topic's verdict is asked once a run, by either
        return lambda topic: asked[side].append(topic) or topic in taken

    compiled = core.plain_extent(events, start, last, room, overhead, takes("compiled"))
    twin = plain_extent_twin(events, start, last, room, overhead, takes("twin"))
    assert compiled == twin
    assert asked["compiled"] == asked["twin"]


def test_an_extent_whose_topic_check_raises_raises_the_same():
    def takes(topic: str) -> bool:
        raise KeyError(topic)

    events = [("a", None, b"{}")]
    for extent in (core.plain_extent, plain_extent_twin):
        with pytest.raises(KeyError, match="a"):
            extent(events, 0, 1, 100, 0, takes)
