"""Issue 13, defect 10: seed 004's replay controls behave alike over kafka:// and tcp://.

Over tcp:// the gateway used to refuse every option (`option(s) live not supported
here`). It now applies log/controls.py, the code a kafka:// client runs for itself, so
each test runs once per transport and asserts the same observable result: the same
messages in the same order, the same keys conflated, pacing never faster than asked.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.client import Client, MemoryBookmarkStore
from amps_on_kafka.errors import AmpsError, MessageError
from amps_on_kafka.log.controls import OptionError
from amps_on_kafka.log.envelope import EnvelopeError
from amps_on_kafka.log.message import COMPLETED
from tests.cli.test_replay_bad_records import BAD_HEADER, BAD_JSON, produce_raw
from tests.server.conftest import bare_gateway, client_to, wire_to
from tests.server.helpers import WAIT
from tests.subscribers.conftest import until_completed

__all__ = ["bare_gateway", "client_to", "wire_to"]  # the gateway fixtures, for tcp://

TRANSPORTS = ("kafka", "tcp")


@pytest.fixture(params=TRANSPORTS)
def subscriber(request, bootstrap) -> Client:
    """A logged-on Client over each transport in turn."""
    if request.param == "kafka":
        uri = f"kafka://{bootstrap}"
    else:
        uri = f"tcp://{request.getfixturevalue('bare_gateway').address}/amps/json"
    with Client(f"controls-{request.param}-{uuid.uuid4().hex[:6]}") as client:
        client.connect(uri)
        client.logon()
        yield client


@pytest.fixture
def published(client, topic_factory) -> Callable[[int], str]:
    """`published(count)`: a one-partition topic keyed by /id holding {"id": n % 4, "n": n}."""

    def make(count: int) -> str:
        topic = topic_factory(1, key=("/id",))
        for n in range(count):
            client.publish(topic, {"id": n % 4, "n": n})
        client.publish_flush(30)
        return topic

    return make


def rows(messages: list) -> list[tuple[str, dict]]:
    return [(m.bookmark, m.data) for m in messages]


def replayed(client: Client, topic: str, options: str | None = None) -> list:
    with client.bookmark_subscribe(topic, "0", options=options, timeout=WAIT) as stream:
        return until_completed(stream)


def test_rate_paces_alike_and_never_faster_than_asked(subscriber, published):
    """Seed 004 `rate=`: 21 messages at 10/s take at least 2 s from the first to the last
    on both transports (due times advance by exact steps); the messages are the same."""
    topic = published(21)
    started = None
    with subscriber.bookmark_subscribe(topic, "0", options="rate=10", timeout=WAIT) as stream:
        messages = []
        for message in stream:
            if message is COMPLETED:
                break
            started = started or time.monotonic()
            messages.append(message)
        span = time.monotonic() - started
    assert [m.data["n"] for m in messages] == list(range(21))
    assert span >= 1.9  # 20 steps of 100 ms; the first one's own delivery may lag a little


def test_conflation_collapses_the_same_keys_alike(subscriber, published):
    """Seed 004 `conflation=`: the newest per key, with the bookmark of the first one."""
    topic = published(12)
    messages = replayed(subscriber, topic, "conflation=5s,conflation_key=/id")
    assert [(m.bookmark, m.data["n"]) for m in messages] == [
        (f"{topic}|0|{k}|", 8 + k) for k in range(4)
    ]


def test_conflation_releases_a_held_message_in_a_quiet_log_alike(subscriber, client, published):
    """A message held for its interval is released on time though nothing else arrives:
    on kafka:// by reopening the replay (Ticks), on the gateway by its heartbeat TICKs."""
    topic = published(0)
    options = "conflation=300ms"
    with subscriber.bookmark_subscribe(topic, "0", options=options, timeout=WAIT) as stream:
        assert next(stream) is COMPLETED
        client.publish(topic, {"id": 1, "n": 1})
        client.publish_flush(30)
        assert next(stream).data == {"id": 1, "n": 1}


@pytest.mark.parametrize("option", ["live", "fully_durable"])
def test_durability_options_are_accepted_alike_and_deliver_the_same(subscriber, published, option):
    """Both read the log up to Kafka's high watermark, so the messages are the same."""
    topic = published(6)
    assert rows(replayed(subscriber, topic, option)) == rows(replayed(subscriber, topic))


def test_the_pause_option_holds_the_stream_alike(subscriber, published):
    """`pause` is the client's own on both transports: nothing comes until resume."""
    topic = published(3)
    options = "pause"
    with subscriber.bookmark_subscribe(topic, "0", sub_id="p", options=options, timeout=WAIT) as s:
        box: list = []
        arrived = threading.Event()

        def take() -> None:
            box.append(next(s))
            arrived.set()

        threading.Thread(target=take, daemon=True).start()
        assert not arrived.wait(0.5)  # paused: nothing comes (a wait for an absence)
        subscriber.resume("p")
        assert arrived.wait(WAIT)
        assert [box[0].data["n"], *(m.data["n"] for m in until_completed(s))] == [0, 1, 2]


def test_options_combine_over_tcp_as_over_kafka(subscriber, published):
    """rate and conflation together: the conflated messages, paced."""
    topic = published(8)
    messages = replayed(subscriber, topic, "rate=1000,conflation=5s")
    assert sorted(m.data["n"] for m in messages) == [4, 5, 6, 7]


# -- the gateway's own answers, on the wire -------------------------------------------------


@pytest.fixture
def wire(bare_gateway, wire_to):
    connection = wire_to(bare_gateway.address)
    assert connection.logon("controls-wire").header["status"] == "success"
    return connection


def failure_of(wire, topic: str, options: str, bookmark: str | None = "0") -> str:
    header = {"c": "subscribe", "cid": "s", "t": topic, "o": options}
    if bookmark is not None:
        header["bm"] = bookmark
    reply = wire.request(header)
    assert reply.header["status"] == "failure", reply.header
    return reply.header["reason"]


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ("rate=fast", "rate 'fast'"),
        ("conflation=soon", "conflation interval"),
        ("live,rate=10", "not supported with the live option"),
        ("replay_faster", "unknown or malformed option 'replay_faster'"),
        ("pause", "pause is not a gateway option"),
        ("oof", "oof needs a SOW topic of this worker and no bookmark"),
    ],
)
def test_the_gateway_names_a_bad_option(wire, topic_factory, options, complaint):
    """The gateway parses options with the same code as kafka://, with its reasons."""
    assert complaint in failure_of(wire, topic_factory(1), options)
    assert wire.request({"c": "heartbeat", "cid": "hb"}).header["status"] == "success"


def test_a_raw_protocol_subscriber_gets_conflated_deliveries(wire, client, published):
    """Over the wire: `o` as AMPS spells it; the gateway conflates, bookmark of the first."""
    topic = published(8)
    header = {"c": "subscribe", "cid": "c", "t": topic, "bm": "0", "a": "completed"}
    wire.send({**header, "o": "conflation=5s"})
    frames = wire.until(lambda f: f.header.get("a") == "completed")[:-1]
    got = [(f.header["bm"], orjson.loads(f.payload)["n"]) for f in frames]
    assert got == [(f"{topic}|0|{k}|", 4 + k) for k in range(4)]


def test_a_client_refuses_a_bad_option_before_sending_it(bare_gateway, client_to, published):
    """The tcp:// client checks options as the kafka:// one does (OptionError), so a
    typo never reaches the gateway."""
    tcp = client_to(bare_gateway.address)
    with pytest.raises(OptionError, match="rate 'fast'"):
        tcp.bookmark_subscribe(published(1), "0", options="rate=fast")


# -- bad records and deletes in a client's stream -------------------------------------------


def test_a_payload_that_does_not_decode_arrives_alike_and_its_data_says_why(
    subscriber, client, topic_factory, bootstrap
):
    """Issue 13: a record whose payload is not JSON does not end the stream: it arrives
    with its bookmark, `data` raises MessageError naming the problem, and the replay goes
    on. The same on both transports."""
    topic = topic_factory(1, key=("/id",))
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    produce_raw(bootstrap, topic, [(BAD_JSON, [])])
    client.publish(topic, {"id": 2})
    client.publish_flush(30)
    first, bad, last = replayed(subscriber, topic)
    assert [m.bookmark for m in (first, bad, last)] == [f"{topic}|0|{n}|" for n in range(3)]
    with pytest.raises(MessageError, match="payload is not valid JSON"):
        bad.data  # noqa: B018
    assert (first.data, last.data) == ({"id": 1}, {"id": 2})


def test_a_record_whose_headers_do_not_decode_does_not_end_a_stored_replay(
    client, topic_factory, bootstrap
):
    """kafka:// with a bookmark store, which reads every record's headers: the record
    arrives, its envelope's properties raise EnvelopeError, and the replay goes on."""
    topic = topic_factory(1, key=("/id",))
    produce_raw(bootstrap, topic, [(b'{"id": 1}', [BAD_HEADER]), (b'{"id": 2}', [])])
    client.set_bookmark_store(MemoryBookmarkStore())
    bad, good = replayed(client, topic)
    with pytest.raises(EnvelopeError, match=f"header {BAD_HEADER[0]!r}"):
        bad.expiration  # noqa: B018
    assert (bad.data, good.data) == ({"id": 1}, {"id": 2})


def test_a_replayed_delete_carries_its_keys_or_its_filter(client, topic_factory):
    """Issue 13: a replayed delete by key had `data` None and nothing else to apply."""
    topic = topic_factory(1, key=("/id",))
    client.sow_delete(topic, keys=["7"])
    client.sow_delete(topic, filter="/n > 3")
    client.publish_flush(30)
    by_key, by_filter = replayed(client, topic)
    assert (by_key.command, by_key.sow_keys, by_key.filter) == ("sow_delete", ("7",), None)
    assert (by_filter.sow_keys, by_filter.filter) == (None, "/n > 3")


def write_with_a_header_name_that_is_not_utf8(bootstrap: str, topic: str, count: int) -> None:
    """Python's client can't write such a name; kcat, as any librdkafka producer, can."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/bootstrap.sh installs it)")
    command = [kcat.encode(), b"-b", bootstrap.encode(), b"-t", topic.encode(), b"-P"]
    lines = b'{"id": 1}\n' * count
    subprocess.run([*command, b"-H", b"\xff\xfe=v"], input=lines, check=True, timeout=30)


@pytest.mark.parametrize("store", [False, True])
def test_a_header_name_that_is_not_utf8_does_not_end_a_kafka_replay(
    client, topic_factory, bootstrap, store
):
    """Such headers don't read at all (EnvelopeError); a bookmark store reads every
    record's headers for duplicate detection: the record still arrives, undetected as a
    duplicate, and the replay goes on."""
    topic = topic_factory(1, key=("/id",))
    write_with_a_header_name_that_is_not_utf8(bootstrap, topic, 3)
    produce_raw(bootstrap, topic, [(b'{"id": 2}', [])])
    if store:
        client.set_bookmark_store(MemoryBookmarkStore())
    messages = replayed(client, topic)
    assert [m.data["id"] for m in messages] == [1, 1, 1, 2]
    with pytest.raises(EnvelopeError, match="not UTF-8"):
        messages[0].command  # noqa: B018


def replay_threads(sub_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"amps-replay-{sub_id}"]


def test_a_slowly_paced_gateway_replay_ends_at_once_when_unsubscribed(wire, published):
    """At rate=0.2 the gateway's replay thread waits 5 s between messages; it waits on
    the subscription's stop event, so an unsubscribe ends it within a second, not at the
    next due time (a thread per forgotten subscription otherwise)."""
    topic = published(3)
    header = {"c": "subscribe", "cid": "slow", "sub_id": "slow", "t": topic, "bm": "0"}
    wire.send({**header, "o": "rate=0.2"})
    assert orjson.loads(wire.recv().payload)["n"] == 0
    (thread,) = replay_threads("slow")
    reply = wire.request({"c": "unsubscribe", "cid": "u", "sub_id": "slow", "a": "processed"})
    assert reply.header["status"] == "success"
    thread.join(1.0)
    assert not thread.is_alive()


def test_a_followed_topic_deleted_ends_the_stream_naming_it_alike(subscriber, client, published):
    """Over kafka:// the replay raises UnknownTopic; over tcp:// the gateway's replay thread
    does, and the subscription fails with its reason (docs/operations.md, A replay whose
    topic or Kafka goes away): neither waits silently, as a follower used to."""
    topic = published(1)
    admin = AdminClient({"bootstrap.servers": client.transport.bootstrap})
    with (
        subscriber.bookmark_subscribe(topic, "0", timeout=30) as stream,
        pytest.raises(AmpsError) as raised,
    ):
        for item in stream:
            if item is COMPLETED:
                admin.delete_topics([topic])[topic].result(30)
    assert f"topic {topic!r} was deleted while it was replayed" in str(raised.value)
