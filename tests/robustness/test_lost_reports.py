"""Delivery reports that never come (server/delivery.py, DeliveryPump._sweep).

librdkafka reports each record within PublishTimeout unless its handle is destroyed with
the record in it; the gateway counts a command's (or a batch's) reports down before it
answers the command and frees its budget share. A report lost on the way held that share
for good, and once the budget was full the session stopped reading its connection (a
publish storm through a broker restart stalled so in CI). Here one report of a command
is made never to come — the count expects a record more than was produced — on a real
broker: the command must still be answered, within PublishTimeout and REPORT_MARGIN, as
not known to be persisted, the flush after it answered, the budget emptied, and the loss
logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from amps_on_kafka.admin.view import gateway_view
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.server import delivery
from amps_on_kafka.server.writes import PendingWrite, PublishBatch, Writes
from tests.robustness.test_publish_outage import in_flight
from tests.server.test_publish_batches import flushed, logged_on, publishes

TIMEOUT = 2.0  # PublishTimeout
MARGIN = 2.0  # REPORT_MARGIN: a report later than both is taken as lost


def one_report_lost(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Make the next batch (or per-command publish) wait for one report more than Kafka
    will send, as when a report is lost."""
    if path == "batch":
        seal = Writes.seal

        def lossy_seal(self: Writes, batch: PublishBatch, unused_size: int) -> None:
            batch.publishes.append(batch.publishes[-1])  # one record more to hear from
            seal(self, batch, unused_size)

        monkeypatch.setattr(Writes, "seal", lossy_seal)
    else:
        written = Writes.written

        def lossy_written(self: Writes, pending: PendingWrite, records: int) -> None:
            written(self, pending, records + 1)

        monkeypatch.setattr(Writes, "written", lossy_written)


@pytest.mark.parametrize("path", ["batch", "command"])
def test_a_report_that_never_comes_is_answered_and_frees_the_budget(
    path, bootstrap, topic_factory, monkeypatch, caplog
):
    caplog.set_level(logging.ERROR, "amps_on_kafka.server.delivery")
    monkeypatch.setattr(delivery, "REPORT_MARGIN", MARGIN)
    topic = topic_factory(1)
    settings = GatewayConfig(publish_timeout=TIMEOUT)
    with logged_on(bootstrap, "lost-reports", settings) as (gateway, wire):
        wire.send_raw(publishes({0: topic}))  # the topic known: the next ones batch
        assert flushed(wire, "known") == []
        one_report_lost(monkeypatch, path)
        started = time.monotonic()
        if path == "batch":
            wire.send_raw(publishes({1: topic, 2: topic, 3: topic}))
        else:
            wire.send({"c": "publish", "t": topic, "cid": "1", "a": "persisted"}, b'{"id": 1}')
        answers = flushed(wire, "after")
        waited = time.monotonic() - started
        assert in_flight(gateway) == 0, "the budget share was not freed"
        view = gateway_view(gateway)["gateway"]

    limit = TIMEOUT + MARGIN
    assert limit <= waited < limit + 3 * delivery.SWEEP_EVERY + 5  # + the loaded host's slack
    sequences = [1, 2, 3] if path == "batch" else [1]
    named = [int(a["s"] if path == "batch" else a["cid"]) for a in answers]
    assert named == sequences, "each publish answered once"
    for answer in answers:
        assert answer["status"] == "failure"
        assert answer["reason"].startswith(f"no report from Kafka within {limit:g}s: not known")
    assert view["publishes_unreported"] == len(sequences)
    assert any("got no report" in r.getMessage() for r in caplog.records)


def test_a_verdict_whose_handler_raises_strands_none_after_it(caplog):
    """Kafka's verdicts are handed to the sessions on the loop in order; one whose
    handler raises (a bug) is logged, and those behind it are still handed on — left
    queued, they waited for a next report that a full budget would never let come."""
    loop = asyncio.new_event_loop()
    try:
        pump = delivery.DeliveryPump(loop, None, TIMEOUT)  # type: ignore[arg-type] # not served
        handed: list[int] = []

        def broken(_: int) -> None:
            raise RuntimeError("a bug in a handler")

        pump.post(broken, 1)
        pump.post(handed.append, 2)
        loop.run_until_complete(asyncio.sleep(0))  # one turn: the drain runs
    finally:
        loop.close()
    assert handed == [2]
    assert any("handing Kafka's verdict" in r.getMessage() for r in caplog.records)
