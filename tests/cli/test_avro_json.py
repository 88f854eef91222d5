"""Avro topics take JSON as users write it: from a shell pipe, and from the client over
kafka:// and over tcp:// (the gateway's wire carries JSON)."""

from __future__ import annotations

import orjson
import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import MessageError, PublishError
from amps_on_kafka.log.codecs import AvroCodec
from tests.cli.test_cli import lines
from tests.server.conftest import bare_gateway, client_to

__all__ = ["bare_gateway", "client_to"]  # fixtures

TRADE = {
    "type": "record",
    "name": "Trade",
    "fields": [
        {"name": "sym", "type": "string"},
        {"name": "qty", "type": "long"},
        {"name": "px", "type": ["null", "double"], "default": None},
    ],
}


def test_json_for_an_avro_topic_from_the_cli_and_the_client(run, bootstrap, topic_factory):
    topic = topic_factory(message_type="avro", schema=TRADE)
    stdin = '{"sym": "IBM", "qty": 100, "px": 120.5}\n{"sym": "MSFT", "qty": 5}\n'
    result = run("publish", topic, stdin=stdin)
    assert result.exit_code == 0, result.output
    with Client("avro-json") as client:
        client.connect(f"kafka://{bootstrap}")
        client.publish(topic, orjson.dumps({"sym": "AAPL", "qty": 7, "px": None}).decode())
        client.publish(topic, {"sym": "ORCL", "qty": 1, "px": 3.0})
        client.publish_flush(10)

    bad = run("publish", topic, '{"sym": "IBM", "qty": "many"}')
    assert bad.exit_code == 1 and "on field qty (0 message(s) published)" in bad.output
    bad = run("publish", topic, stdin='{"sym": "IBM", "qty": 1}\n{"sym": "IBM", "qtty": 1}\n')
    assert bad.exit_code == 1 and "line 2: " in bad.output and "'qtty'" in bad.output
    assert "(1 message(s) published)" in bad.output
    replayed = [r["data"] for r in lines(run("replay", topic, "--bookmark", "0").output)]
    assert replayed == [
        {"sym": "IBM", "qty": 100, "px": 120.5},
        {"sym": "MSFT", "qty": 5, "px": None},
        {"sym": "AAPL", "qty": 7, "px": None},
        {"sym": "ORCL", "qty": 1, "px": 3.0},
        {"sym": "IBM", "qty": 1, "px": None},  # the line before the bad one
    ]


def test_json_for_an_avro_topic_over_tcp(run, bare_gateway, client_to, topic_factory):
    topic = topic_factory(message_type="avro", schema=TRADE)
    client = client_to(bare_gateway.address)
    client.publish(topic, '{"sym": "IBM", "qty": 100, "px": 120.5}')
    client.publish(topic, {"sym": "MSFT", "qty": 5})
    client.publish_flush(10)
    client.publish(topic, {"sym": "IBM", "qty": "many"})
    with pytest.raises(PublishError, match="on field qty"):
        client.publish_flush(10)
    replayed = [r["data"] for r in lines(run("replay", topic, "--bookmark", "0").output)]
    assert replayed == [
        {"sym": "IBM", "qty": 100, "px": 120.5},
        {"sym": "MSFT", "qty": 5, "px": None},
    ]


@pytest.mark.parametrize("transport", ["kafka", "tcp"])
def test_bytes_for_an_avro_topic_mean_the_same_on_both_transports(
    transport, run, bootstrap, request, topic_factory
):
    """JSON bytes are taken and Avro bytes refused, with one error, whichever transport."""
    topic = topic_factory(message_type="avro", schema=TRADE)
    with Client(f"avro-bytes-{transport}") as client:
        if transport == "kafka":
            client.connect(f"kafka://{bootstrap}")
        else:
            client.connect(f"tcp://{request.getfixturevalue('bare_gateway').address}/amps/json")
        client.logon(30)
        client.publish(topic, b'{"sym": "IBM", "qty": 100}')
        client.publish_flush(10)
        avro = AvroCodec(TRADE).encode({"sym": "MSFT", "qty": 5, "px": None})
        refused = "payload for an Avro topic is not valid JSON .* are not taken"
        with pytest.raises((MessageError, PublishError), match=refused):
            client.publish(topic, avro)  # kafka:// refuses here, tcp:// at the flush
            client.publish_flush(10)
    replayed = [r["data"] for r in lines(run("replay", topic, "--bookmark", "0").output)]
    assert replayed == [{"sym": "IBM", "qty": 100, "px": None}]
