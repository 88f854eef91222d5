"""The gateway protocol on the wire: logon, acks, publishing, errors that keep the connection.

These run against a gateway whose engine serves no SOW topic; SOW commands are in
test_sow.py, against a running worker.
"""

from __future__ import annotations

import struct

import orjson
import pytest

from amps_on_kafka.log.codecs import AvroCodec
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.server.replies import record_payload
from amps_on_kafka.state.record import SowRecord
from tests.server.helpers import is_ack


@pytest.fixture
def wire(bare_gateway, wire_to):
    connection = wire_to(bare_gateway.address)
    assert connection.logon("protocol-test").header["status"] == "success"
    return connection


def assert_alive(wire) -> None:
    reply = wire.request({"c": "heartbeat", "cid": "hb"})
    assert is_ack(reply, "heartbeat") and reply.header["status"] == "success"


def failure(reply) -> str:
    assert reply.header["c"] == "ack" and reply.header["status"] == "failure", reply.header
    return reply.header["reason"]


def test_logon_answers_with_the_name_and_the_frame_limit(bare_gateway, wire_to):
    reply = wire_to(bare_gateway.address).logon("someone")
    assert reply.header == {
        "c": "ack",
        "a": "processed",
        "status": "success",
        "cid": "logon",
        "client_name": "someone",
        "max_frame_bytes": bare_gateway.max_frame_bytes,
    }


def test_commands_before_logon_fail_and_the_connection_stays(bare_gateway, wire_to):
    wire = wire_to(bare_gateway.address)
    reply = wire.request({"c": "publish", "cid": "1", "t": "x"}, b"{}")
    assert failure(reply) == "publish: log on first"
    assert wire.logon().header["status"] == "success"
    assert_alive(wire)


def test_a_second_logon_on_a_connection_fails(wire):
    reply = wire.request({"c": "logon", "cid": "again", "client_name": "other"})
    assert "already logged on" in failure(reply)


def test_a_new_logon_with_the_same_name_replaces_the_old_connection(bare_gateway, wire_to):
    first = wire_to(bare_gateway.address)
    first.logon("twin")
    second = wire_to(bare_gateway.address)
    assert second.logon("twin").header["status"] == "success"
    assert first.is_closed()
    assert_alive(second)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({"c": "teleport"}, "unknown command 'teleport'"),
        ({"c": 7}, "unknown command 7"),
        ({"c": "heartbeat", "a": "received,eventually"}, "unknown ack type(s) eventually"),
        ({"c": "publish"}, "publish needs 't'"),
        ({"c": "sow", "t": "orders"}, "'orders' is not a SOW topic of this worker"),
        ({"c": "unsubscribe", "sub_id": "nope"}, "no subscription 'nope' on this connection"),
        ({"c": "subscribe", "t": "x", "f": "/a = = 1"}, "position"),
        ({"c": "subscribe", "t": "x", "o": "oof,turbo"}, "unknown or malformed option 'turbo'"),
        ({"c": "sow_delete", "t": "orders"}, "'orders' is not a SOW topic of this worker"),
    ],
)
def test_bad_commands_fail_with_a_reason_and_the_connection_survives(wire, header, reason):
    reply = wire.request({**header, "cid": "bad"})
    assert reason in failure(reply)
    assert_alive(wire)


def test_a_malformed_header_fails_and_the_connection_survives(wire):
    text = b'{"c": "publish", '
    wire.send_raw(struct.pack(">II", 4 + len(text), len(text)) + text)
    assert failure(wire.recv()).startswith("frame header is not valid JSON")
    assert_alive(wire)


def test_an_oversized_frame_is_refused_by_command_id_and_skipped(bare_gateway, wire):
    limit = bare_gateway.max_frame_bytes
    header = {"c": "publish", "cid": "big", "t": "x"}
    wire.send(header, b"x" * limit)
    reply = wire.recv()
    assert reply.header["cid"] == "big"
    size = 4 + len(orjson.dumps(header)) + limit
    assert failure(reply) == f"frame of {size} bytes exceeds the limit of {limit}"
    assert_alive(wire)


def test_a_frame_length_that_breaks_the_stream_closes_the_connection(wire):
    wire.send_raw(struct.pack(">I", 1) + b"x")
    assert "can't hold a header length" in failure(wire.recv())
    assert wire.is_closed()


def test_publish_to_an_unknown_topic_fails(wire):
    reply = wire.request({"c": "publish", "cid": "1", "t": "no-such-topic-here"}, b'{"id": 1}')
    assert "does not exist" in failure(reply)
    assert_alive(wire)


def test_publish_validation_failures_carry_the_reason_and_the_sequence(wire, topic_factory):
    topic = topic_factory(1, key=("/id",))
    bad_json = wire.request({"c": "publish", "cid": "1", "t": topic, "s": 41}, b"{nope")
    assert "not valid JSON" in failure(bad_json) and bad_json.header["s"] == 41
    no_key = wire.request({"c": "publish", "cid": "2", "t": topic, "s": 42}, b'{"qty": 1}')
    assert failure(no_key) == "message has no value for the SOW key field /id"
    # the first took the full path (the topic unknown yet), the second the one without
    # _handle's layers (publishing.publish_at_once): refused alike
    assert bad_json.header["error"] == no_key.header["error"] == "MessageError"
    assert no_key.header["s"] == 42
    negative = wire.request({"c": "publish", "cid": "3", "t": topic, "e": -1}, b'{"id": 1}')
    assert "expiration must be 0" in failure(negative)
    assert_alive(wire)


def test_publish_acks_received_processed_persisted_and_the_record_is_in_kafka(
    wire, bootstrap, topic_factory
):
    topic = topic_factory(1, key=("/id",))
    wire.send(
        {
            "c": "publish",
            "cid": "p",
            "t": topic,
            "s": 7,
            "x": "corr",
            "e": 30,
            "a": "received,processed,persisted",
        },
        b'{"id": 5, "qty": 2}',
    )
    acks = wire.until(lambda f: is_ack(f, "persisted"))
    assert [(f.header["a"], f.header["status"], f.header["s"]) for f in acks] == [
        ("received", "success", 7),
        ("processed", "success", 7),
        ("persisted", "success", 7),
    ]
    with Replay(bootstrap, topic, "0", max_idle=5) as replay:
        record = next(m for m in replay if isinstance(m, LogMessage))
    assert record.data == {"id": 5, "qty": 2}
    assert (record.sow_key, record.publisher_id, record.sequence) == ("5", "protocol-test", 7)
    assert (record.correlation_id, record.expiration) == ("corr", 30)


def test_delta_publish_is_written_as_a_delta(wire, bootstrap, topic_factory):
    topic = topic_factory(1, key=("/id",))
    wire.send(
        {"c": "delta_publish", "t": topic, "a": "persisted", "cid": "d"}, b'{"id": 1, "qty": 3}'
    )
    assert wire.recv().header["status"] == "success"
    with Replay(bootstrap, topic, "0", max_idle=5) as replay:
        record = next(m for m in replay if isinstance(m, LogMessage))
    assert record.command == "delta_publish"


def test_flush_is_answered_once_everything_before_it_is_persisted(wire, topic_factory):
    topic = topic_factory(2)
    for i in range(200):
        wire.send({"c": "publish", "t": topic, "s": i}, orjson.dumps({"i": i}))
    wire.send({"c": "flush", "cid": "f"})
    frames = wire.until(lambda f: f.header.get("cid") == "f")
    assert len(frames) == 1 and is_ack(frames[0], "processed")  # no failure came before it


def test_a_log_topic_subscription_delivers_new_publishes(
    wire, wire_to, bare_gateway, topic_factory
):
    topic = topic_factory(2)
    wire.send(
        {
            "c": "subscribe",
            "cid": "s",
            "sub_id": "live",
            "t": topic,
            "f": "/n > 1",
            "a": "processed",
        }
    )
    assert is_ack(wire.recv(), "processed")
    publisher = wire_to(bare_gateway.address)
    publisher.logon("publisher")
    for n in range(4):
        publisher.send({"c": "publish", "t": topic, "x": f"c{n}"}, orjson.dumps({"n": n}))
    deliveries = [wire.recv(), wire.recv()]
    assert sorted(orjson.loads(f.payload)["n"] for f in deliveries) == [2, 3]
    for frame in deliveries:
        assert frame.header["c"] == "publish" and frame.header["sub_id"] == "live"
        assert frame.header["bm"].startswith(f"{topic}|") and frame.header["ts"] > 0
        assert frame.header["x"] == f"c{orjson.loads(frame.payload)['n']}"


def test_a_bookmark_subscription_replays_then_completes_then_goes_live(wire, topic_factory):
    topic = topic_factory(1)
    for n in range(5):
        wire.send({"c": "publish", "t": topic}, orjson.dumps({"n": n}))
    assert is_ack(wire.request({"c": "flush", "cid": "f"}), "processed")
    wire.send(
        {
            "c": "subscribe",
            "cid": "b",
            "t": topic,
            "bm": "0",
            "f": "/n >= 3",
            "a": "processed,completed",
        }
    )
    frames = wire.until(lambda f: is_ack(f, "completed"))
    assert is_ack(frames[0], "processed")
    replayed = [orjson.loads(f.payload)["n"] for f in frames[1:-1]]
    assert replayed == [3, 4]
    assert [f.header["bm"] for f in frames[1:-1]] == [f"{topic}|0|3|", f"{topic}|0|4|"]
    wire.send({"c": "publish", "t": topic}, b'{"n": 9}')
    live = wire.recv()
    assert live.header["sub_id"] == "b" and orjson.loads(live.payload) == {"n": 9}


def test_a_bookmark_past_the_log_fails_the_subscription(wire, topic_factory):
    topic = topic_factory(1)
    reply = wire.request({"c": "subscribe", "cid": "b", "t": topic, "bm": f"{topic}|0|99|"})
    assert "past the end of the log" in failure(reply)
    assert_alive(wire)


def test_unsubscribe_all_stops_log_subscriptions(wire, topic_factory):
    topic = topic_factory(1)
    for sub_id in ("a", "b"):
        wire.send({"c": "subscribe", "cid": sub_id, "sub_id": sub_id, "t": topic, "a": "processed"})
        assert is_ack(wire.recv(), "processed")
    reply = wire.request({"c": "unsubscribe", "cid": "u", "sub_id": "all", "a": "processed"})
    assert is_ack(reply, "processed")
    again = wire.request({"c": "unsubscribe", "cid": "u2", "sub_id": "a"})
    assert failure(again) == "no subscription 'a' on this connection"


def test_a_sub_id_in_use_is_refused(wire, topic_factory):
    topic = topic_factory(1)
    wire.send({"c": "subscribe", "cid": "1", "sub_id": "same", "t": topic, "a": "processed"})
    assert is_ack(wire.recv(), "processed")
    reply = wire.request({"c": "subscribe", "cid": "2", "sub_id": "same", "t": topic})
    assert failure(reply) == "sub_id 'same' is already in use on this connection"


def test_bytes_inside_an_avro_record_go_on_the_wire_as_base64():
    """An Avro `bytes` field raised a TypeError in wire_payload and the message was lost."""
    schema = {"type": "record", "name": "r", "fields": [{"name": "b", "type": "bytes"}]}
    codec = AvroCodec(schema)
    record = SowRecord("t", 0, "k", codec.encode({"b": b"\xff\x00"}), 1, 0, codec=codec)
    assert orjson.loads(record_payload(record)) == {"b": {"base64": "/wA="}}
