"""The Client over tcp://: the same API and message shape as kafka://, plus SOW commands."""

from __future__ import annotations

import itertools

import pytest

from amps_on_kafka.client import Client, Command
from amps_on_kafka.errors import PublishError, TransportError, WrongTransport
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.log.replay import Replay
from tests.server.helpers import WAIT

FIELDS = ("command", "topic", "bookmark", "timestamp", "sow_key", "expiration", "data")


def test_connecting_to_nothing_is_a_transport_error(bare_gateway):
    host, _, _ = bare_gateway.address.rpartition(":")
    with pytest.raises(TransportError, match="can't connect to the gateway"):
        Client("nobody").connect(f"tcp://{host}:1/amps/json")
    with pytest.raises(TransportError, match="/amps/json only"):
        Client("nobody").connect(f"tcp://{bare_gateway.address}/amps/fix")


def test_gateway_commands_on_kafka_say_they_need_a_worker(bootstrap):
    with Client("kafka-only") as client:
        client.connect(f"kafka://{bootstrap}")
        # unsubscribe works on kafka:// too: it closes bookmark subscriptions (client_api)
        for call in (lambda: client.sow("t"), lambda: client.subscribe("t"), client.heartbeat):
            with pytest.raises(WrongTransport, match="needs a worker: connect with tcp://"):
                call()


def test_tcp_and_kafka_deliver_the_same_messages(bare_gateway, client_to, bootstrap, topic_factory):
    """A bookmark replay reads alike through the gateway and straight from Kafka."""
    topic = topic_factory(2, key=("/id",))
    client = client_to(bare_gateway.address)
    sequences = [
        client.publish(topic, {"id": i, "n": i * i}, expiration=60 if i % 2 else None)
        for i in range(6)
    ]
    client.publish_flush(WAIT)
    with client.bookmark_subscribe(topic, "0", "/n >= 4", timeout=WAIT) as stream:
        over_tcp = list(itertools.takewhile(lambda m: m is not COMPLETED, stream))
    with Client("direct") as direct:
        direct.connect(f"kafka://{bootstrap}")
        with direct.bookmark_subscribe(topic, "0", "/n >= 4", timeout=WAIT) as stream:
            from_kafka = list(itertools.takewhile(lambda m: m is not COMPLETED, stream))
    assert len(over_tcp) == 4
    assert sorted(m.sequence for m in from_kafka) == sequences[2:]  # the client's own numbers
    assert by_partition(over_tcp) == by_partition(from_kafka)


def by_partition(messages: list) -> list[list]:
    """Messages as rows, grouped by partition in a stable sort: partitions interleave freely
    in a replay, but each partition's own order must hold."""
    rows = [[getattr(m, f) for f in FIELDS] for m in messages]
    return sorted(rows, key=lambda row: int(row[2].split("|")[1]))


def test_until_is_refused_over_tcp(bare_gateway, client_to, topic_factory):
    client = client_to(bare_gateway.address)
    with pytest.raises(WrongTransport, match="`until` needs the kafka:// transport"):
        client.bookmark_subscribe(topic_factory(1), "0", until="0|1|")


def test_refused_publishes_reach_the_failed_write_handler(bare_gateway, client_to, topic_factory):
    topic = topic_factory(1, key=("/id",))
    client = client_to(bare_gateway.address)
    failures: list[FailedWrite] = []
    client.set_failed_write_handler(failures.append)
    good = client.publish(topic, {"id": 1})
    bad = client.publish(topic, "{not json")
    keyless = client.publish(topic, {"qty": 1})
    client.publish_flush(WAIT)
    assert [(f.topic, f.sequence) for f in failures] == [(topic, bad), (topic, keyless)]
    assert "not valid JSON" in failures[0].reason
    assert failures[1].reason == "message has no value for the SOW key field /id"
    assert good < bad < keyless


def test_publish_flush_raises_for_refused_publishes(bare_gateway, client_to, topic_factory):
    topic = topic_factory(1, key=("/id",))
    client = client_to(bare_gateway.address)
    client.publish(topic, {"nokey": 1})
    with pytest.raises(PublishError, match=r"1 publish\(es\) not persisted.*SOW key field /id"):
        client.publish_flush(WAIT)
    client.publish_flush(WAIT)  # reported once


def test_close_persists_what_was_published(bare_gateway, bootstrap, topic_factory):
    topic = topic_factory(1)
    with Client("closing") as client:
        client.connect(f"tcp://{bare_gateway.address}/amps/json")
        client.logon()
        for i in range(50):
            client.publish(topic, {"i": i})
    with Replay(bootstrap, topic, "0", until="0|1|") as replay:
        assert sum(1 for m in replay if m is not COMPLETED) == 50


def test_an_idle_stream_ends_after_its_timeout(bare_gateway, client_to, topic_factory):
    client = client_to(bare_gateway.address)
    with client.subscribe(topic_factory(1), timeout=0.3) as stream:
        assert list(stream) == []


def test_a_lost_connection_fails_the_stream(bare_gateway, client_to, topic_factory):
    client = client_to(bare_gateway.address)
    stream = client.subscribe(topic_factory(1), timeout=WAIT)
    bare_gateway.stop()
    with pytest.raises(TransportError, match="closed the connection"):
        next(stream)
    with pytest.raises(TransportError):
        client.heartbeat()


def test_closing_a_stream_unsubscribes(served, client_to):
    client = client_to(served.address)
    stream = client.subscribe(served.topic, sub_id="mine")
    stream.close()
    client.unsubscribe("mine")  # ended already: nothing to do, as on kafka://
    again = client.subscribe(served.topic, sub_id="mine")  # the gateway let the sub_id go
    client.publish(served.topic, {"id": 1, "qty": 1})
    assert next(again).data == {"id": 1, "qty": 1}


def test_sow_and_subscribe_yields_groups_records_and_oof(served, client_to):
    client = client_to(served.address)
    client.publish(served.topic, {"id": 1, "qty": 10})
    with client.subscribe(served.topic, timeout=WAIT) as applied:
        client.publish(served.topic, {"id": 2, "qty": 10})
        client.publish_flush(WAIT)
        next(applied)
        next(applied)
    with client.sow_and_subscribe(served.topic, "/qty > 5", "oof", timeout=WAIT) as stream:
        head = [(m.command, m.sow_key) for m in itertools.islice(stream, 4)]
        client.publish(served.topic, {"id": 2, "qty": 1})
        oof = next(stream)
    assert head[0] == ("group_begin", None) and head[3] == ("group_end", None)
    assert sorted(head[1:3]) == [("sow", "1"), ("sow", "2")]
    assert (oof.command, oof.reason, oof.sow_key, oof.data) == (
        "oof",
        "match",
        "2",
        {"id": 2, "qty": 1},
    )


def test_execute_runs_commands_by_name(served, client_to):
    client = client_to(served.address)
    with client.subscribe(served.topic, timeout=WAIT) as applied:
        sequence = client.execute(Command("publish").set_topic(served.topic).set_data({"id": 7}))
        client.execute(Command("flush").set_timeout(WAIT))
        assert next(applied).data == {"id": 7}
    assert isinstance(sequence, int)
    sow = Command("sow").set_topic(served.topic).set_filter("/id = 7").set_batch_size(5)
    assert [m.data for m in client.execute(sow)] == [{"id": 7}]
    deleted = client.execute(Command("sow_delete").set_topic(served.topic).set_sow_keys("7"))
    assert deleted.matches == 1
    with pytest.raises(ValueError, match="unknown command 'teleport'"):
        Command("teleport")


def test_a_republish_keeps_its_original_sequence_over_tcp(
    bare_gateway, client_to, bootstrap, topic_factory
):
    """What a publish store replays after a crash must carry the number it first had."""
    topic = topic_factory(1, key=("/id",))
    client = client_to(bare_gateway.address)
    assert client.publish(topic, {"id": 1}, sequence=424242) == 424242
    client.publish_flush(WAIT)
    with Client("reader") as direct:
        direct.connect(f"kafka://{bootstrap}")
        with direct.bookmark_subscribe(topic, "0", timeout=WAIT) as stream:
            (message,) = list(itertools.takewhile(lambda m: m is not COMPLETED, stream))
    assert (message.publisher_id, message.sequence) == (client.name, 424242)


def test_a_logon_to_something_else_than_a_gateway_says_so(bootstrap):
    """tcp:// to the Kafka broker's port: it hangs up on the first frame."""
    client = Client("not-a-gateway")
    client.connect(f"tcp://{bootstrap}/amps/json")
    with pytest.raises(TransportError, match=r"no worker's gateway listens there .*kafka://"):
        client.logon(10)
    client.close()
