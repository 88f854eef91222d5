"""A fatal error of the gateway's shared producer, under a publish storm, on the real broker.

librdkafka raises a fatal error when an idempotent producer can no longer keep its
guarantees; the producer then refuses every produce for good. The gateway must not go on
publishing into it (server/delivery.py, DeliveryPump._replace): every publish is answered
once (a persisted ack, or a failure naming the fatal error), a new producer takes the old
one's place once the old one's records are all answered (so the session's order holds:
the topic's records are in publish order), the replacement is logged and counted, and
publishing goes on. Both producers: the compiled one and confluent-kafka's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from amps_on_kafka.admin.view import gateway_view
from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.server import delivery
from amps_on_kafka.server.gateway import Gateway
from tests.kafka_faults import raise_fatal
from tests.polling import until
from tests.robustness.test_publish_outage import WAIT, Storm, in_flight
from tests.server.helpers import Wire
from tests.server.test_native_producer import producer_kind  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("producer_kind")


def test_a_fatal_producer_error_is_answered_and_the_gateway_publishes_on(
    bootstrap, topic_factory, caplog
) -> None:
    caplog.set_level(logging.WARNING, "amps_on_kafka.server.delivery")
    topic = topic_factory(1, key=("/id",))
    engine = SowEngine(Config(), {}, now_ms)
    settings = GatewayConfig(publish_timeout=10.0)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings) as gateway:
        storm = Storm(gateway.address, topic=topic)  # type: ignore[arg-type]
        sender = threading.Thread(target=storm.run, daemon=True)
        sender.start()
        storm.wait_for("publishes persisted", lambda acks: len(acks) >= 500)
        failed = gateway.producer
        raise_fatal(failed, "fenced by the test")
        until(lambda: gateway.stats.producer_replacements == 1, "the producer replaced", WAIT)
        assert gateway.producer is not failed
        replaced_at = storm.sent
        storm.wait_for(
            "publishes persisted after the replacement",
            lambda acks: (
                sum(a["status"] == "success" and int(a["cid"]) >= replaced_at for a in acks) >= 500
            ),
        )
        storm.stop.set()
        assert storm.flushed.wait(WAIT), "the flush after the storm was not answered"
        sender.join(WAIT)
        assert in_flight(gateway) == 0

    answers = Counter(a["cid"] for a in storm.acks)
    assert sorted(int(cid) for cid in answers) == list(range(storm.sent)), "a publish got no ack"
    assert set(answers.values()) == {1}, "a publish was answered twice"
    # none when the old producer held nothing and no publish came before the replacement
    failures = [a for a in storm.acks if a["status"] == "failure"]
    for failure in failures:
        assert "Fatal error" in failure["reason"] or "failed fatally" in failure["reason"]
    persisted = [int(a["cid"]) for a in storm.acks if a["status"] == "success"]
    with Replay(bootstrap, topic, "0", until="0|1|") as log:
        in_kafka = [orjson.loads(m.raw)["id"] for m in log if getattr(m, "raw", None)]
    assert set(persisted) <= set(in_kafka), "an acknowledged publish is not in Kafka"
    assert in_kafka == sorted(set(in_kafka)), "the session's order did not hold"
    logged = [r.getMessage() for r in caplog.records]
    assert any("failed fatally (test_fatal_error: fenced by the test)" in m for m in logged)
    assert any("was replaced" in m for m in logged)


def test_a_replacement_that_cannot_be_built_is_retried_with_backoff(
    bootstrap, topic_factory, monkeypatch, caplog
) -> None:
    """The replacement's build fails twice (as when librdkafka can't get a thread or a
    file): the gateway refuses publishes meanwhile, naming the fatal error, says so in its
    log and admin view, tries again after RENEW_FIRST and then twice that, and publishes
    on once the third build succeeds — no restart."""
    caplog.set_level(logging.WARNING, "amps_on_kafka.server.delivery")
    monkeypatch.setattr(delivery, "RENEW_FIRST", 0.5)
    topic = topic_factory(1)
    engine = SowEngine(Config(), {}, now_ms)
    with (
        Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway,
        Wire(gateway.address) as wire,
    ):
        wire.logon("renewed")
        pump, attempts = gateway.pump, []
        build = pump._renew
        assert build is not None

        def failing_twice() -> Any:
            attempts.append(time.monotonic())
            if len(attempts) <= 2:
                raise OSError(24, "Too many open files (the test's)")
            return build()

        pump._renew = failing_twice
        raise_fatal(gateway.producer, "fenced by the test")
        until(lambda: len(attempts) >= 1, "a replacement tried", WAIT)
        refused = wire.request(publish(topic, "refused"), b"{}")
        assert refused.header["status"] == "failure"
        assert "failed fatally" in refused.header["reason"]
        assert gateway_view(gateway)["gateway"]["producer_failed"]
        until(lambda: gateway.stats.producer_replacements == 1, "the producer replaced", WAIT)
        view = gateway_view(gateway)["gateway"]
        persisted = wire.request(publish(topic, "after"), b"{}")
    assert persisted.header["status"] == "success"
    assert len(attempts) == 3
    first, second = attempts[1] - attempts[0], attempts[2] - attempts[1]
    assert first >= 0.5 and second >= 1.0, (first, second)  # RENEW_FIRST, then doubled
    assert not view["producer_failed"] and view["producer_replacement_failures"] == 2
    failed = [r.getMessage() for r in caplog.records if "replacement" in r.getMessage()]
    assert len(failed) == 2 and all("Too many open files (the test's)" in m for m in failed)
    assert "next attempt in 0.5s" in failed[0] and "next attempt in 1s" in failed[1]


def publish(topic: str, cid: str) -> dict[str, Any]:
    return {"c": "publish", "t": topic, "cid": cid, "a": "persisted"}
