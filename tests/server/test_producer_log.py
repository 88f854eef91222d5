"""The gateway's producer log (log/kafka.py ProducerLog): librdkafka's warnings and
errors reach the `amps_on_kafka.librdkafka` logger at their level, from the compiled
producer (its C callback keeps them for the next poll) as from confluent-kafka's, so an
operator sees a broker that can't be reached; alike lines are coalesced."""

from __future__ import annotations

import logging
import time

import pytest

from amps_on_kafka.broker.testing import free_ports
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.kafka import COALESCE_SECONDS, ProducerLog
from amps_on_kafka.log.native_producer import CompiledProducer
from amps_on_kafka.server import gateway as gateway_module
from tests.server.test_native_producer import producer_kind  # noqa: F401 (a fixture)

LOGGER = "amps_on_kafka.librdkafka"


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


@pytest.mark.usefixtures("producer_kind")
def test_a_broker_that_cannot_be_reached_is_logged_at_its_level(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    kind = request.getfixturevalue("producer_kind")
    caplog.set_level(logging.WARNING, LOGGER)
    (port,) = free_ports(1)  # nothing listens there
    producer = gateway_module._shared_producer(
        f"127.0.0.1:{port}", GatewayConfig(publish_timeout=1.0)
    )
    try:
        assert isinstance(producer, CompiledProducer) == (kind == "compiled")
        producer.produce("unreachable", b"{}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            "Connection refused" in text for _, text in logged(caplog)
        ):
            producer.poll(0.1)  # the pump's poll hands the lines over
    finally:
        producer.close()
    refused = [(level, text) for level, text in logged(caplog) if "Connection refused" in text]
    assert refused, logged(caplog)
    assert all(level >= logging.WARNING and f"127.0.0.1:{port}" in t for level, t in refused)


def test_alike_lines_are_coalesced_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    now = [1000.0]
    log = ProducerLog(clock=lambda: now[0])
    refused = "Connect to ipv4#127.0.0.1:%d failed: Connection refused (after %dms)"
    log.lines([(3, "FAIL", refused % (9092, 1)), (6, "STATE", "Broker changed state")], 0)
    log.lines([(3, "FAIL", refused % (9092, 3))], 0)  # alike: its figures aside
    now[0] += COALESCE_SECONDS / 2
    log.log(logging.ERROR, "%s %s", "FAIL", refused % (9093, 7))  # confluent-kafka's way
    log.lines([(4, "REQTMOUT", "Timed out 1 in-flight request")], 0)  # another line
    now[0] += COALESCE_SECONDS
    log.lines([(3, "FAIL", refused % (9092, 2))], 2)
    above_debug = [(level, text) for level, text in logged(caplog) if level > logging.DEBUG]
    assert above_debug == [
        (logging.ERROR, "FAIL " + refused % (9092, 1)),
        (logging.WARNING, "REQTMOUT Timed out 1 in-flight request"),
        (logging.ERROR, "FAIL " + refused % (9092, 2) + " (2 more like it since the last logged)"),
        (logging.WARNING, "2 librdkafka warning(s) dropped (too many at once to keep)"),
    ]
    debug = [text for level, text in logged(caplog) if level == logging.DEBUG]
    assert len(debug) == 6, "every line still goes to the debug log, as any client's"
