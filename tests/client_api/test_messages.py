"""One Message type: every transport and command, the same attributes; COMPLETED too."""

from __future__ import annotations

import pytest

from amps_on_kafka import COMPLETED, Command, Message
from amps_on_kafka.client.message import DeleteAck, GatewayMessage
from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import EnvelopeError
from amps_on_kafka.log.message import LogMessage

ATTRIBUTES = (
    "command",
    "topic",
    "logical_topic",
    "data",
    "payload",
    "raw",
    "bookmark",
    "timestamp",
    "sow_key",
    "sow_keys",
    "filter",
    "expiration",
    "correlation_id",
    "sub_id",
    "publisher_id",
    "sequence",
    "reason",
    "lease_period",
    "ack_type",
    "status",
    "matches",
)


def every_kind() -> list[Message]:
    headers = [("p", b"pub-1"), ("s", b"17"), ("k", b"4")]
    log = LogMessage("orders", 1, 5, 1_700_000_000_000, b'{"id": 4}', headers, JSON)
    oof = GatewayMessage("oof", "orders", {"bm": "orders|0|3|", "reason": "deleted"}, b"{}", "s1")
    return [log, oof, GatewayMessage("ack", "orders", {"a": "processed", "status": "success"})]


@pytest.mark.parametrize(
    "message", [*every_kind(), DeleteAck("orders", 5, matches=2), COMPLETED], ids=repr
)
def test_every_message_has_every_attribute(message):
    assert isinstance(message, Message)
    values = {name: getattr(message, name) for name in ATTRIBUTES}
    assert isinstance(values["command"], str)


def test_a_log_record_and_a_gateway_message_read_alike():
    log, oof, _ = every_kind()
    assert (log.bookmark, log.publisher_id, log.sequence, log.sow_key) == (
        "orders|1|5|",
        "pub-1",
        17,
        "4",
    )
    assert (log.data, log.payload, log.reason) == ({"id": 4}, b'{"id": 4}', None)
    assert (oof.reason, oof.sub_id, oof.data, oof.raw) == ("deleted", "s1", {}, b"{}")


def test_completed_is_a_message_with_nothing_to_ack_or_discard():
    assert (COMPLETED.command, COMPLETED.ack_type, COMPLETED.bookmark, COMPLETED.data) == (
        "ack",
        "completed",
        None,
        None,
    )
    COMPLETED.ack()
    COMPLETED.discard()


def test_ack_and_discard_say_why_they_do_not_apply():
    log, oof, _ = every_kind()
    with pytest.raises(MessageError, match="only messages of a queue subscription"):
        log.ack()
    with pytest.raises(MessageError, match=r"call client\.set_bookmark_store"):
        log.discard()
    with pytest.raises(MessageError, match="not delivered by a subscription"):
        oof.ack()


def test_bookmark_subscribe_delivers_messages_alike_on_both_transports(uri, connect, topic_factory):
    """The README's loop runs through COMPLETED; sub_id, publisher_id and sequence are
    there whichever transport delivered the message."""
    topic = topic_factory(1, key=("/id",))
    client = connect(uri)
    sequences = [client.publish(topic, {"id": n}) for n in range(3)]
    client.publish_flush(30)
    seen = []
    with client.bookmark_subscribe(topic, "0", sub_id="alike", timeout=30) as stream:
        for message in stream:
            seen.append((message.bookmark, message.data))  # COMPLETED reads too
            if message is COMPLETED:
                break
            assert isinstance(message, Message)
            message.ack()  # no lease: nothing to do, on either transport
            assert (message.sub_id, message.publisher_id) == ("alike", client.name)
            assert (message.topic, message.command) == (topic, "publish")
            assert message.sequence == sequences[len(seen) - 1]
            assert message.timestamp is not None
    assert seen == [(f"{topic}|0|{n}|", {"id": n}) for n in range(3)] + [(None, None)]


@pytest.fixture(params=["kafka", "tcp"])
def delete_target(request, bootstrap, topic_factory) -> tuple[str, str]:
    """(uri, topic) of a SOW topic keyed by /id: the log itself, or a worker's gateway."""
    if request.param == "kafka":
        return f"kafka://{bootstrap}", topic_factory(2, key=("/id",))
    served = request.getfixturevalue("served")
    return served.uri, served.topic


def test_sow_delete_returns_one_ack_type_on_both_transports(delete_target, connect):
    uri, topic = delete_target
    client = connect(uri)
    for n in range(4):
        client.publish(topic, {"id": n, "qty": n * 10})
    client.publish_flush(30)
    by_keys = client.sow_delete(topic, keys=["0", "1"], correlation_id="c-1")
    by_filter = client.sow_delete(topic, "/qty = 20", timeout=30)
    by_data = client.sow_delete(topic, data={"id": 3})
    counted = uri.startswith("tcp")
    for ack, deleted in ((by_keys, 2), (by_filter, 1), (by_data, 1)):
        assert type(ack) is DeleteAck and isinstance(ack, Message)
        assert (ack.command, ack.status, ack.topic) == ("ack", "success", topic)
        assert isinstance(ack.sequence, int)
        assert ack.matches == (deleted if counted else None)
        assert ack.ack_type == ("processed" if counted else None)
    assert by_keys.correlation_id == "c-1" and by_filter.correlation_id is None
    assert by_keys.sequence < by_filter.sequence < by_data.sequence
    handled: list[Message] = []
    command = Command("sow_delete").set_topic(topic).set_filter("/id = 9")
    client.execute_async(command, handled.append)
    assert [type(m) for m in handled] == [DeleteAck]


def test_every_message_has_one_repr_whichever_transport_built_it(uri, connect, topic_factory):
    """The reprs named the engine's classes (GatewayMessage, LogMessage for a
    RecordMessage), which differ per transport, while the docs promise one Message type."""
    topic = topic_factory(1)
    client = connect(uri)
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    with client.bookmark_subscribe(topic, "0") as stream:
        message = stream.next(timeout=30)
    assert repr(message) == f"Message(publish, {topic}, {topic}|0|0|)"
    assert [repr(m) for m in every_kind()] == [
        "Message(publish, orders, orders|1|5|)",
        "Message(oof, orders, orders|0|3|)",
        "Message(ack, orders, processed)",
    ]
    unreadable = LogMessage("t", 0, 1, 0, b"{}", EnvelopeError("bad header"), JSON)
    assert repr(unreadable) == "Message(?, t, t|0|1|)"  # a repr that can't fail in a log line
