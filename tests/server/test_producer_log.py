"""The gateway's producer log (log/kafka.py ProducerLog): librdkafka's warnings and
errors reach the `amps_on_kafka.librdkafka` logger at DEBUG, from the compiled producer
(its C callback keeps them for the next poll) as from confluent-kafka's, so `--log-level
debug` shows a broker that can't be reached while an outage is logged once by the worker
(tests/cli/test_failures); critical lines (a fatal error) at their level, coalesced."""

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
def test_a_broker_that_cannot_be_reached_is_logged_at_debug_only(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """confluent-kafka's producer (the one used when librdkafka's log is at DEBUG) shows
    the refused connections at DEBUG; the compiled one, at INFO as operators run, hands
    the lines it kept to the log at its polls and none of them rises above DEBUG."""
    kind = request.getfixturevalue("producer_kind")
    caplog.set_level(logging.DEBUG if kind == "confluent" else logging.INFO, LOGGER)
    (port,) = free_ports(1)  # nothing listens there
    producer = gateway_module._shared_producer(
        f"127.0.0.1:{port}", GatewayConfig(publish_timeout=1.0)
    )
    try:
        assert isinstance(producer, CompiledProducer) == (kind == "compiled")
        producer.produce("unreachable", b"{}")
        deadline = time.monotonic() + 30
        if kind == "confluent":
            while time.monotonic() < deadline and not any(
                "Connection refused" in text for _, text in logged(caplog)
            ):
                producer.poll(0.1)
        else:  # the record's report (timed out) served: the lines kept were handed over
            while producer.flush(0.1) and time.monotonic() < deadline:
                pass
            assert producer.flush(0) == 0, "the unreachable record was never reported"
    finally:
        producer.close()
    if kind == "confluent":
        refused = [(lv, text) for lv, text in logged(caplog) if "Connection refused" in text]
        assert refused, logged(caplog)
        assert all(lv == logging.DEBUG and f"127.0.0.1:{port}" in t for lv, t in refused)
    else:
        assert logged(caplog) == []


def test_alike_critical_lines_are_coalesced_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    now = [1000.0]
    log = ProducerLog(clock=lambda: now[0])
    fatal = "Fatal error: Broker: Producer fenced by epoch %d (after %dms)"
    refused = "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
    log.lines([(2, "FATAL", fatal % (4, 1)), (6, "STATE", "Broker changed state")], 0)
    log.lines([(2, "FATAL", fatal % (4, 3)), (3, "FAIL", refused)], 0)  # alike; an error
    now[0] += COALESCE_SECONDS / 2
    log.log(logging.CRITICAL, "%s %s", "FATAL", fatal % (5, 7))  # confluent-kafka's way
    log.lines([(4, "REQTMOUT", "Timed out 1 in-flight request")], 0)  # a warning
    now[0] += COALESCE_SECONDS
    log.lines([(2, "FATAL", fatal % (6, 2))], 2)
    above_debug = [(level, text) for level, text in logged(caplog) if level > logging.DEBUG]
    assert above_debug == [
        (logging.CRITICAL, "FATAL " + fatal % (4, 1)),
        (logging.CRITICAL, "FATAL " + fatal % (6, 2) + " (2 more like it since the last logged)"),
    ]
    debug = [text for level, text in logged(caplog) if level == logging.DEBUG]
    assert len(debug) == 8, "every line still goes to the debug log, as any client's"
    assert "2 librdkafka warning(s) dropped (too many at once to keep)" in debug
