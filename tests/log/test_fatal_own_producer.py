"""A fatal error of a kafka:// client's own producer (log/publisher.py, LogPublisher._renew).

A Kafka user is told to close a producer that failed fatally and make a new one; the
client does that itself. The publish that meets the failed producer raises PublishError
naming the fatal error; what the failed producer still held is reported (to the
failed-write handler, or by the next publish_flush) once; the next publish goes to a new
producer. Nothing written before lands after what the new one writes. Both producers:
the compiled one and confluent-kafka's, on the real broker.
"""

from __future__ import annotations

import orjson
import pytest

import amps_on_kafka.log.native_producer as native_producer_module
from amps_on_kafka.client import Client
from amps_on_kafka.errors import PublishError
from amps_on_kafka.log.native_producer import CompiledProducer
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.native import core
from tests.kafka_faults import raise_fatal


@pytest.fixture(params=["compiled", "confluent"])
def producer_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "compiled" and (core is None or not hasattr(core, "RdProducer")):
        pytest.skip("needs the compiled core")
    if request.param == "confluent":
        monkeypatch.setattr(native_producer_module, "native_producer", lambda *args: None)
    return str(request.param)


def test_a_client_publishes_on_after_its_producer_failed_fatally(
    bootstrap, topic_factory, producer_kind
) -> None:
    topic = topic_factory(1, key=("/id",))
    refused: list[str] = []
    with Client("fatal-own") as client:
        client.connect(f"kafka://{bootstrap}")
        for n in range(300):
            client.publish(topic, {"id": n})
        publisher = client.transport.publisher  # type: ignore[union-attr]
        failed = publisher._producer
        assert isinstance(failed, CompiledProducer) == (producer_kind == "compiled")
        raise_fatal(failed, "fenced by the test")
        for n in range(300, 600):
            try:
                client.publish(topic, {"id": n})
            except PublishError as exc:
                refused.append(str(exc))
        assert publisher._producer is not failed, "the failed producer is still used"
        try:
            client.publish_flush(30)
        except PublishError as exc:  # what the failed producer had queued, purged
            assert "failed fatally" in str(exc)
        for n in range(600, 900):
            client.publish(topic, {"id": n})
        client.publish_flush(30)  # everything after the replacement is persisted

    assert all("failed fatally" in reason for reason in refused), refused
    with Replay(bootstrap, topic, "0", until="0|1|") as log:
        in_kafka = [orjson.loads(m.raw)["id"] for m in log if getattr(m, "raw", None)]
    assert in_kafka == sorted(set(in_kafka)), "the publishes' order did not hold"
    assert set(range(600, 900)) <= set(in_kafka)
