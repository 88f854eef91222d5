"""A publisher's own producer (the kafka:// client's): compiled where it can be
(log/native_producer.own_producer) and held to confluent-kafka's, which it uses without
the core. The same calls write the same records (partition, key, value, headers), a
failed publish is reported alike (the failed-write handler, publish_flush's error), and
clients opened and closed leave no thread, many publishes no memory, behind.

The compiled publisher numbers publish_document's records instead of giving each a
callback (RdProducer.produce_numbered): the numbers, negative ones and ones past what an
opaque holds (the callback path) included, must reach the failures as the sequences."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

import amps_on_kafka.log.native_producer as native_producer_module
from amps_on_kafka.client import Client
from amps_on_kafka.errors import PublishError
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.native_producer import CompiledProducer, own_producer
from amps_on_kafka.log.publisher import FailedWrite, LogPublisher
from amps_on_kafka.native import core
from tests.log.conftest import records_of
from tests.log.test_publish_failures import NOISE, small_topic
from tests.log.test_replay_hostile import _rss_kib
from tests.polling import until

pytestmark = pytest.mark.skipif(
    core is None or not hasattr(core, "RdProducer"), reason="needs the compiled core"
)

PRODUCERS = ["compiled", "confluent"]


def made(bootstrap: str, kind: str, first: int, **kw: Any) -> LogPublisher:
    """A publisher as the kafka:// client makes it (failures only), of producer `kind`."""
    publisher = LogPublisher(bootstrap, "same", first_sequence=first, report_successes=False, **kw)
    assert (publisher._numbered is not None) == (kind == "compiled")
    assert isinstance(publisher._producer, CompiledProducer) == (kind == "compiled")
    return publisher


def script(publisher: LogPublisher, topics: dict[str, str]) -> None:
    """One client's publishes: Client.publish's one-frame path (keyed, composite, unkeyed,
    placed by another partitioner) among the general path's (an expiration, a
    correlation id, an explicit sow key, a delta_publish, text data, a sow_delete)."""
    document = publisher.publish_document
    for n in range(60):
        document(topics["keyed"], {"id": n % 7, "n": "x" * (n % 4)})
        document(topics["composite"], {"id": n % 3, "n": n % 2})
        document(topics["unkeyed"], {"n": n})
        document(topics["placed"], {"id": f"k{n % 5}"})
        if n % 9 == 0:
            document(topics["keyed"], {"id": n}, expiration=30.0)
            document(topics["keyed"], {"id": n}, correlation_id="c")
            document(topics["explicit"], {"n": n}, sow_key=f"e{n}")
            publisher.publish(topics["keyed"], {"id": 1, "d": n}, command=Command.DELTA_PUBLISH)
            document(topics["unkeyed"], '{"text": 1}')
    publisher.sow_delete(topics["keyed"], keys=["1", "2"])
    publisher.flush(30)


def logged(bootstrap: str, topics: dict[str, str]) -> dict[str, list[tuple[Any, ...]]]:
    """Each topic's records by label: partition, key, value, headers (in offset order)."""
    return {
        label: sorted(
            (r.partition(), r.offset(), r.key(), r.value(), r.headers())
            for r in records_of(bootstrap, topic)
        )
        for label, topic in topics.items()
    }


SPECS: dict[str, tuple[int, dict[str, Any]]] = {
    "keyed": (4, {"key": ("/id",)}),
    "composite": (3, {"key": ("/id", "/n")}),
    "unkeyed": (1, {}),  # more partitions: librdkafka places keyless records at random
    "placed": (3, {"key": ("/id",), "partitioner": "fnv1a"}),
    "explicit": (2, {"key_from_publish": True}),
}


def test_both_producers_write_the_same_records(bootstrap: str, topic_factory, monkeypatch) -> None:
    written = []
    for kind in PRODUCERS:
        if kind == "confluent":
            monkeypatch.setattr(native_producer_module, "native_producer", lambda *args: None)
        topics = {label: topic_factory(n, **spec) for label, (n, spec) in SPECS.items()}
        publisher = made(bootstrap, kind, first=1_000)
        try:
            script(publisher, topics)
        finally:
            publisher.close(30)
        written.append(logged(bootstrap, topics))
    assert written[0] == written[1]
    assert sum(map(len, written[0].values())) == 60 * 4 + 7 * 5 + 2


@pytest.mark.parametrize("first", [-4, 1_000, 2**61 - 2], ids=["negative", "usual", "past"])
def test_a_failed_publish_is_reported_alike(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    """A record the broker refuses (too large for its topic): the failed-write handler
    gets its topic, sequence and reason, and an unhandled one fails publish_flush with
    the same words, whichever producer; successes around it are not reported. The
    sequences cross zero, and run past what a numbered record holds (±2^61)."""
    answers = []
    for kind in PRODUCERS:
        if kind == "confluent":
            monkeypatch.setattr(native_producer_module, "native_producer", lambda *args: None)
        topic = small_topic(bootstrap)
        failures: list[FailedWrite] = []
        publisher = made(bootstrap, kind, first=first, on_failed_write=failures.append)
        try:
            sequences = []
            for data in script_of_sizes():  # one a batch: Kafka refuses a batch whole
                sequences.append(publisher.publish_document(topic, data))
                publisher.flush(30)
            publisher.on_failed_write = None
            publisher.publish_document(topic, {"big": NOISE})
            with pytest.raises(PublishError) as raised:
                publisher.flush(30)
        finally:
            publisher.close(30)
        assert [f.sequence for f in failures] == [sequences[1], sequences[3]]
        assert all(f.topic == topic for f in failures)
        answers.append(([f.reason for f in failures], str(raised.value).replace(topic, "T")))
    assert answers[0] == answers[1]
    assert "not persisted" in answers[0][1] and "too large" in answers[0][0][0].lower()


def script_of_sizes() -> Iterator[dict[str, Any]]:
    """A small record, a refused one, a small one, a refused one, a small one."""
    for n in range(5):
        yield {"big": NOISE} if n % 2 else {"ok": n}


def tasks() -> int:
    gc.collect()  # a client left in a reference cycle goes with its threads
    return len(os.listdir("/proc/self/task"))


def test_clients_opened_and_closed_leave_no_threads(bootstrap: str, topic_factory) -> None:
    topic = topic_factory(1)

    def client_round(name: str) -> None:
        with Client(name) as client:
            client.connect(f"kafka://{bootstrap}")
            client.logon()
            client.publish(topic, {"n": 1})
            client.publish_flush(30)
            assert isinstance(client._transport.publisher._producer, CompiledProducer)

    client_round(f"warm-{uuid.uuid4().hex[:6]}")  # threads that live for good start here
    before = tasks()
    for round_ in range(5):
        client_round(f"leak-{round_}-{uuid.uuid4().hex[:6]}")
    until(lambda: tasks() <= before)  # librdkafka's threads of every handle gone
    assert len(records_of(bootstrap, topic)) == 6


def test_many_publishes_keep_memory_flat(bootstrap: str, topic_factory) -> None:
    """100,000 numbered publishes after a warm-up: a report, callback or record kept
    per publish would hold at least 10 MB (100 bytes each)."""
    topic = topic_factory(1)
    publisher = made(bootstrap, "compiled", first=0)

    def publish_round() -> None:
        publish = publisher.publish_document
        for n in range(20_000):
            publish(topic, {"n": n})
        publisher.flush(30)
        assert len(publisher._producer) == 0

    try:
        for _ in range(2):
            publish_round()
        gc.collect()
        before = _rss_kib()
        for _ in range(5):
            publish_round()
        gc.collect()
        assert _rss_kib() - before < 10_000  # KiB
    finally:
        publisher.close(30)


def test_a_setting_that_is_not_text_keeps_confluent_kafkas_producer() -> None:
    """own_producer falls back as the gateway's does (native_producer); its compiled one
    reports every record to librdkafka's callback whatever the settings say, so no
    record's callback waits for a report that never comes."""
    fallback = own_producer("127.0.0.1:1", {"error_cb": lambda error: None})
    compiled = own_producer("127.0.0.1:1", {"delivery.report.only.error": True})
    try:
        assert type(fallback) is Producer
        assert isinstance(compiled, CompiledProducer)
    finally:
        compiled.close()
