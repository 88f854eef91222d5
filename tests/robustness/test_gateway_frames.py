"""Issue 13 at the gateway: any bytes a client may send.

Hypothesis sends three kinds of input to a worker's gateway: any bytes after a logon;
frames with valid length prefixes around garbage headers (not JSON, JSON that is not an
object, objects of unknown keys); and well-formed headers of every command whose fields
hold garbage of every JSON type. Every frame is answered — by a reply with its cid, a
failure ack carrying a reason when it was refused — or the connection is closed after a
failure ack that says why. A normal client, on its own connection, is served after every
example: the gateway neither crashed nor froze.
"""

from __future__ import annotations

import json
import struct
import uuid
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from amps_on_kafka.protocol.frames import Frame
from amps_on_kafka.server.session import HANDLERS
from tests.server.conftest import served, wire_to  # noqa: F401 (fixtures)
from tests.server.helpers import Wire, is_ack

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
READ_TIMEOUT = 0.3  # the gateway's ReadTimeout here: a frame left unfinished is closed soon
FIELDS = (
    *("t", "s", "k", "e", "f", "bm", "sub_id", "query_id", "o", "bs", "top_n", "orderby"),
    *("x", "client_name"),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def raw_frame(header: dict[str, Any], payload: bytes) -> bytes:
    """A frame as any client may write it: Python's json writes integers of any size and
    NaN, which orjson (and encode_frame) would refuse to."""
    encoded = json.dumps(header).encode()
    return struct.pack(">II", 4 + len(encoded) + len(payload), len(encoded)) + encoded + payload


def reasoned(frame: Frame) -> None:
    """A failure must say why."""
    header = frame.header
    if header.get("status") == "failure":
        assert isinstance(header.get("reason"), str) and header["reason"], header


def answered_or_closed(wire: Wire, cid: str) -> str:
    """Read until a reply to `cid` ("answered"), or the close ("closed"), which must come
    right after a failure ack with a reason."""
    last: Frame | None = None
    while True:
        try:
            frame = wire.recv()
        except ConnectionError:
            assert last is not None and is_ack(last, "processed"), "closed without a reason"
            assert last.header["status"] == "failure"
            return "closed"
        reasoned(frame)
        if frame.header.get("cid") == cid or unreadable(frame):
            return "answered"
        last = frame


def unreadable(frame: Frame) -> bool:
    """The refusal of a frame whose header is not JSON (NaN, Infinity): it has no cid to
    echo, and says so."""
    reason = frame.header.get("reason", "")
    return "cid" not in frame.header and reason.startswith("frame header is not valid JSON")


def check_normal_client(normal: Wire, topic: str) -> None:
    """The bystander: a heartbeat, a publish persisted, a sow query."""
    cid = uuid.uuid4().hex
    assert is_ack(normal.request({"c": "heartbeat", "cid": cid}), "heartbeat")
    reply = normal.request(
        {"c": "publish", "cid": cid, "t": topic, "a": "persisted"}, b'{"id": "normal"}'
    )
    assert reply.header["status"] == "success", reply.header
    reply = normal.request({"c": "sow", "cid": cid + "q", "t": topic, "a": "processed"})
    assert is_ack(reply, "processed") and reply.header["status"] == "success", reply.header
    normal.until(lambda f: f.header.get("c") == "group_end" and f.header["cid"] == cid + "q")


def logged_on(address: str, opened: list[Wire]) -> Wire:
    wire = Wire(address)
    opened.append(wire)
    assert wire.logon(f"fuzz-{uuid.uuid4().hex[:8]}").header["status"] == "success"
    return wire


def test_any_bytes_are_answered_or_closed_with_a_reason(served, wire_to):  # noqa: F811
    served.gateway.settings = served.gateway.settings.model_copy(
        update={"read_timeout": READ_TIMEOUT}
    )
    normal = wire_to(served.address)
    normal.logon(f"normal-{uuid.uuid4().hex[:8]}")
    opened: list[Wire] = []

    @EXAMPLES
    @given(st.binary(min_size=1, max_size=300))
    def garbage(data: bytes) -> None:
        wire = logged_on(served.address, opened)
        wire.send_raw(data)
        wire.send({"c": "heartbeat", "cid": "after"})  # answered unless swallowed
        note(answered_or_closed(wire, "after"))
        wire.close()
        check_normal_client(normal, served.topic)

    try:
        garbage()
    finally:
        for wire in opened:
            wire.close()


header_bytes = st.one_of(
    st.binary(max_size=80),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(
        lambda v: json.dumps(v).encode()
    ),
)


def test_garbage_headers_in_valid_frames_are_answered(served, wire_to):  # noqa: F811
    normal = wire_to(served.address)
    normal.logon(f"normal-{uuid.uuid4().hex[:8]}")
    wire = wire_to(served.address)
    wire.logon("headers")

    @EXAMPLES
    @given(header_bytes, st.binary(max_size=50))
    def garbage_header(header: bytes, payload: bytes) -> None:
        wire.send_raw(struct.pack(">II", 4 + len(header) + len(payload), len(header)))
        wire.send_raw(header + payload)
        wire.send({"c": "heartbeat", "cid": "after-header"})
        replies = wire.until(lambda f: f.header.get("cid") == "after-header")
        note(str([f.header for f in replies]))
        assert len(replies) >= 2, "the garbage frame was not answered"
        for frame in replies:
            reasoned(frame)
        check_normal_client(normal, served.topic)

    garbage_header()


def command_headers(topic: str) -> st.SearchStrategy[dict[str, Any]]:
    """Every command, its fields garbage or sensible, asking for `processed` so that each
    one is answered whatever it does (`a` itself may be garbage too)."""
    topics = st.sampled_from([topic, "no-such-topic", ""]) | json_values
    fields = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)
    acks = st.just("processed") | json_values

    def build(command: str, chosen: dict, t: Any, a: Any) -> dict[str, Any]:
        header = {**chosen, "c": command, "t": t, "cid": uuid.uuid4().hex}
        # `a: null` is no `a` at all, and a command that succeeds unasked is not answered
        header["a"] = f"processed,{a}" if isinstance(a, str) else ("processed" if a is None else a)
        return header

    return st.builds(build, st.sampled_from(sorted(HANDLERS)), fields, topics, acks)


payloads = st.dictionaries(st.sampled_from(["id", "qty", "sym"]), json_values, max_size=3).map(
    lambda v: json.dumps(v).encode()
)


def test_every_command_with_garbage_fields_is_answered(served, wire_to):  # noqa: F811
    normal = wire_to(served.address)
    normal.logon(f"normal-{uuid.uuid4().hex[:8]}")
    opened: list[Wire] = []
    wire = logged_on(served.address, opened)

    @settings(EXAMPLES, max_examples=150)
    @given(command_headers(served.topic), st.binary(max_size=40) | payloads)
    def garbage_fields(header: dict[str, Any], payload: bytes) -> None:
        nonlocal wire
        note(str(header))
        if header["c"] == "logon":  # only a connection not yet logged on can try it
            fresh = Wire(served.address)
            opened.append(fresh)
            fresh.send_raw(raw_frame(header, payload))
            note(answered_or_closed(fresh, header["cid"]))
        else:
            wire.send_raw(raw_frame(header, payload))
            if answered_or_closed(wire, header["cid"]) == "closed":
                wire = logged_on(served.address, opened)
        check_normal_client(normal, served.topic)

    try:
        garbage_fields()
    finally:
        for each in opened:
            each.close()
