"""HAClient is a Client: the same public methods with the same signatures, plus reconnect."""

from __future__ import annotations

import asyncio
import inspect
import math

import pytest

from amps_on_kafka import COMPLETED, AsyncClient, Command, HAClient, Message
from amps_on_kafka.client import AsyncStream, Client, ClientBase, MessageStream
from amps_on_kafka.errors import (
    FilterError,
    InvalidBookmark,
    MessageError,
    OptionError,
    PublishError,
    ServerError,
    UnknownTopic,
    WrongTransport,
    server_error,
)


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_ha_client_has_every_client_method_with_the_same_signature():
    client, ha = public_methods(Client), public_methods(HAClient)
    assert set(client) <= set(ha)
    assert {name: ha[name] for name in client} == client
    assert set(ha) - set(client) == {"connect_and_logon", "reconnect"}
    assert set(public_methods(ClientBase)) == set(client)


def test_every_public_method_has_a_docstring():
    for cls in (Client, HAClient, AsyncClient, AsyncStream, MessageStream, Command, Message):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                assert inspect.getdoc(member), f"{cls.__name__}.{name}"


def test_an_ha_client_is_used_as_a_client_on_both_transports(uri, topic_factory):
    topic = topic_factory(1)
    with HAClient("ha-api") as ha:
        ha.connect(uri)
        ha.logon(30)
        ha.execute(Command("publish").set_topic(topic).set_data({"n": 1}))
        ha.publish_flush(30)
        stream = ha.bookmark_subscribe(topic, "0", sub_id="ha")
        assert isinstance(stream, MessageStream)
        assert stream.next(timeout=30).data == {"n": 1}
        assert stream.next(timeout=30) is COMPLETED
        assert stream.next(timeout=0.2) is None
        ha.unsubscribe("ha")
        assert stream.ended
        if uri.startswith("tcp"):
            ha.heartbeat(30)
        else:
            assert ha.sow_delete(topic, keys=["1"]).sequence is not None  # Client's DeleteAck
            # a gateway-only command fails at once, as on a Client (no failing over forever)
            for call in (lambda: ha.sow(topic), ha.heartbeat, lambda: ha.set_ack_batch_size(5)):
                with pytest.raises(WrongTransport, match="needs a worker"):
                    call()


def test_bad_arguments_raise_the_same_error_on_both_transports(uri, connect, topic_factory):
    """Checked by the client before anything is sent: one exception type, whichever
    transport would have refused it."""
    topic = topic_factory(1)
    client = connect(uri)
    with pytest.raises(InvalidBookmark, match=r"malformed bookmark 'garbage\|x\|'"):
        client.bookmark_subscribe(topic, "garbage|x|", sub_id="after")
    with pytest.raises(InvalidBookmark, match="a bookmark must be a string, not int"):
        client.bookmark_subscribe(topic, 0, sub_id="after")  # was AttributeError: 'strip'
    with pytest.raises(MessageError, match=r"exactly one of filter, keys or data \(got none\)"):
        client.sow_delete(topic)
    with pytest.raises(MessageError, match=r"\(got \['filter', 'keys'\]\)"):
        client.sow_delete(topic, "/id = 1", keys=["1"])
    with pytest.raises(MessageError, match=r"a list of keys, not a string: keys=\['123'\]"):
        client.sow_delete(topic, keys="123")  # deleted the keys '1', '2' and '3'
    with pytest.raises(OptionError, match="rate 'fast'"):  # amps_on_kafka.errors, as documented
        client.bookmark_subscribe(topic, "0", options="rate=fast", sub_id="after")
    with client.bookmark_subscribe(topic, "0", sub_id="after") as stream:  # sub_id free again
        assert stream.next(timeout=30) is COMPLETED


def test_bad_query_arguments_are_refused_before_sending_on_both_transports(uri, connect):
    """A gateway refused them (ServerError "option(s) bogus not supported here"), and a
    kafka:// client said WrongTransport: now the client's ValueError or OptionError."""
    client = connect(uri)
    with pytest.raises(OptionError, match="sow_and_subscribe takes option oof only, not 'bogus'"):
        client.sow_and_subscribe("orders", options="oof,bogus")
    for top_n in ("3", -1, 2.5, True):
        with pytest.raises(
            ValueError, match=rf"top_n must be a whole number >= 0 or None, not {top_n!r}"
        ):
            client.sow("orders", top_n=top_n)
        with pytest.raises(ValueError, match="top_n must be a whole number"):
            client.execute(Command("sow_and_subscribe").set_topic("orders").set_top_n(top_n))
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 0 or None, not 'x'"):
        client.sow("orders", batch_size="x")
    for name in ("top_n", "batch_size"):  # no frame can carry them: was orjson's TypeError
        with pytest.raises(ValueError, match=rf"{name} must be at most {2**63 - 1} \(64 bits\)"):
            client.sow("orders", **{name: 2**64})


def test_an_infinite_timeout_waits_without_limit_and_nan_is_refused(uri):
    """`timeout=math.inf` ended in OverflowError ("timestamp out of range for platform
    time_t") from the wait under logon, publish_flush and heartbeat."""
    with Client("inf-timeouts") as client:
        client.connect(uri)
        client.logon(math.inf)
        client.publish_flush(math.inf)
        if uri.startswith("tcp://"):
            client.heartbeat(math.inf)
        for call in (client.logon, client.publish_flush):
            with pytest.raises(ValueError, match=r"timeout must be a number of seconds 0 or"):
                call(math.nan)


def test_a_wrong_publish_argument_type_is_one_type_error_on_every_client(
    uri, connect, topic_factory
):
    """kafka:// raised confluent's "argument 1 must be str or None" for an int topic, or
    "no value for the SOW key field" for data=42; tcp:// sent both and failed at the flush."""
    topic = topic_factory(1, key=("/id",))
    calls = {
        "data must be a dict, str or bytes, not int": lambda c: c.publish(topic, 123),
        "topic must be a str, not NoneType": lambda c: c.publish(None, {"id": 1}),
        "topic must be a str, not int": lambda c: c.delta_publish(7, {"id": 1}),
        "topic must be a str, not list": lambda c: c.publish([topic], {"id": 1}),
        "topic must be a str, not dict": lambda c: c.delta_publish({}, {"id": 1}),
        "data must be a dict, str or bytes, not list": lambda c: c.delta_publish(topic, [1]),
    }
    with HAClient("ha-types", [uri]) as ha:
        ha.connect_and_logon()
        for client in (connect(uri), ha):
            for reason, call in calls.items():
                with pytest.raises(TypeError, match=reason):
                    call(client)
            client.publish_flush(30)  # nothing was sent: nothing fails here
        assert len(ha.publish_store) == 0  # nothing stored either

    async def run() -> None:
        async with AsyncClient(client=connect(uri)) as aclient:
            with pytest.raises(TypeError, match="data must be a dict, str or bytes, not float"):
                await aclient.publish(topic, 1.5)

    asyncio.run(run())


def test_unsubscribing_what_ended_already_is_nothing_to_do_on_both(uri, connect, topic_factory):
    """tcp:// raised ServerError ("no subscription") where kafka:// did nothing."""
    topic = topic_factory(1)
    client = connect(uri)
    idle = client.bookmark_subscribe(topic, "0", sub_id="idle", timeout=0.3)
    assert list(idle) == [COMPLETED] and idle.ended  # ended by its idle timeout
    closed = client.bookmark_subscribe(topic, "0", sub_id="closed")
    closed.close()
    for sub_id in ("idle", "closed", "never-made"):
        client.unsubscribe(sub_id)
    with client.bookmark_subscribe(topic, "0", sub_id="idle") as again:  # the id is free
        assert again.next(timeout=30) is COMPLETED


def test_a_refusal_is_the_same_error_class_on_both_transports(uri, connect, topic_factory):
    """The gateway's failure ack names the kind (UnknownTopic, InvalidBookmark...): the
    tcp:// client raises it (a ServerError too), as the kafka:// client raises it."""
    topic = topic_factory(1)
    client = connect(uri)
    with pytest.raises(UnknownTopic, match="topic 'no-such-topic-17' does not exist"):
        client.bookmark_subscribe("no-such-topic-17", "0")
    with pytest.raises(InvalidBookmark, match="past the end of the log") as past:
        client.bookmark_subscribe(topic, f"{topic}|0|999|")
    assert isinstance(past.value, ServerError) == uri.startswith("tcp")


def test_a_refused_publish_raises_at_publish_on_kafka_and_at_the_flush_on_tcp(uri, connect):
    """As docs/subscribers.md says: the kafka:// client checks a publish itself; the
    gateway's refusal of a tcp:// publish comes back at the next flush, with its reason."""
    client = connect(uri)
    reason = "topic 'no-such-topic-17' does not exist"
    if uri.startswith("kafka"):
        with pytest.raises(UnknownTopic, match=reason):
            client.publish("no-such-topic-17", {"id": 1})
    else:
        client.publish("no-such-topic-17", {"id": 1})
        with pytest.raises(PublishError, match=rf"topic 'no-such-topic-17' sequence \d+: {reason}"):
            client.publish_flush(30)


def test_a_kind_the_client_does_not_know_is_a_plain_server_error():
    for kind in (None, "NoSuchKind", 7, "AmpsError"):
        assert type(server_error("why", kind)) is ServerError
    refused = server_error("why", "FilterError")
    assert isinstance(refused, FilterError) and isinstance(refused, ServerError)
    assert str(refused) == "why"
