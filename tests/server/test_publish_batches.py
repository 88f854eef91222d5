"""A read's plain publishes are written as one batch (publishing.publish_run): one budget
share, one outcome per batch. These hold it to the per-command path's answers: a record
Kafka fails is answered for its own command, a frame the batch can't take gets the error
it always got, and the budget's bounds hold for a batch as for one command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.protocol.frames import encode_frame
from amps_on_kafka.server.delivery import PublishBudget
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import delete_topics
from tests.server.helpers import Wire, is_ack


def publishes(topics: dict[int, str], payloads: dict[int, bytes] | None = None) -> bytes:
    """Plain publishes numbered by `s`, to the topic given for each, in one buffer (a
    client's burst, read by the gateway at once)."""
    payloads = payloads or {}
    return b"".join(
        encode_frame({"c": "publish", "t": topic, "s": s}, payloads.get(s, b'{"id": %d}' % s))
        for s, topic in topics.items()
    )


def flushed(wire: Wire, cid: str) -> list[dict]:
    """The replies up to the processed ack of a flush, which must succeed."""
    wire.send({"c": "flush", "cid": cid})
    frames = wire.until(lambda f: f.header.get("cid") == cid)
    assert is_ack(frames[-1], "processed") and frames[-1].header["status"] == "success"
    return [frame.header for frame in frames[:-1]]


@contextmanager
def logged_on(bootstrap: str, name: str, settings: GatewayConfig) -> Iterator[tuple[Gateway, Wire]]:
    """A gateway with these settings over an empty engine, and a connection logged on."""
    engine = SowEngine(Config(), {}, now_ms)
    with (
        Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings) as gateway,
        Wire(gateway.address) as wire,
    ):
        wire.logon(name)
        yield gateway, wire


def test_a_batch_answers_each_record_kafka_failed_for_its_own_command(bootstrap, topic_factory):
    kept, dropped = topic_factory(1), topic_factory(1)
    settings = GatewayConfig(publish_timeout=2.0)
    with logged_on(bootstrap, "batch-failures", settings) as (gateway, wire):
        wire.send_raw(publishes({1: kept, 2: dropped}))  # both topics known from here
        assert flushed(wire, "known") == []
        delete_topics(bootstrap, [dropped])
        wire.send_raw(publishes({s: dropped if s % 3 == 0 else kept for s in range(3, 40)}))
        failures = flushed(wire, "after")
    assert sorted(f["s"] for f in failures) == [s for s in range(3, 40) if s % 3 == 0]
    assert {(f["a"], f["status"], f["t"]) for f in failures} == {("persisted", "failure", dropped)}
    assert all(f["reason"].startswith("Kafka did not acknowledge within 2s") for f in failures)
    assert gateway.stats.publish_latency.counts and sum(
        gateway.stats.publish_latency.counts
    ) == 2 + len([s for s in range(3, 40) if s % 3])  # successes observed, once each


def test_a_frame_the_batch_cannot_take_gets_its_own_error_and_the_rest_go(
    bare_gateway, bootstrap, topic_factory
):
    topic = topic_factory(1, key=("/id",))
    with Wire(bare_gateway.address) as wire:
        wire.logon("batch-errors")
        wire.send_raw(publishes({1: topic}))
        assert flushed(wire, "known") == []
        bad = {3: b'{"id": 3', 5: b'{"qty": 5}'}  # not JSON; no value for the key
        wire.send_raw(publishes({s: topic for s in range(2, 8)}, bad))
        failures = flushed(wire, "after")
    assert [(f["s"], f["a"], f["status"]) for f in failures] == [
        (3, "processed", "failure"),
        (5, "processed", "failure"),
    ]
    assert failures[0]["reason"].startswith("payload is not valid JSON")
    assert failures[1]["reason"] == "message has no value for the SOW key field /id"
    with Replay(bootstrap, topic, "0", max_idle=2) as replay:
        records = [m for m in replay if isinstance(m, LogMessage)]
    assert [(r.sequence, r.sow_key, orjson.loads(r.raw)) for r in records] == [
        (s, str(s), {"id": s}) for s in (1, 2, 4, 6, 7)
    ]


def test_a_burst_past_the_budget_is_written_whole_and_in_order(bootstrap, topic_factory):
    """Runs are cut to the budget's room; the rest waits for it, command by command."""
    topic = topic_factory(1)
    settings = GatewayConfig(max_publishes_in_flight=7)
    with logged_on(bootstrap, "batch-budget", settings) as (gateway, wire):
        wire.send_raw(publishes({1: topic}))
        assert flushed(wire, "known") == []
        wire.send_raw(publishes({s: topic for s in range(2, 300)}))
        assert flushed(wire, "after") == []
        assert (gateway.budget.commands, gateway.budget.bytes) == (0, 0)  # all given back
    with Replay(bootstrap, topic, "0", max_idle=2) as replay:
        records = [m for m in replay if isinstance(m, LogMessage)]
    assert [r.sequence for r in records] == list(range(1, 300))


def test_a_batch_takes_the_budget_only_within_both_bounds():
    budget = PublishBudget(max_bytes=1000, max_commands=4)
    assert not budget.take_now(1001, 2)  # a batch never exceeds the bytes, even alone
    assert not budget.take_now(100, 5)
    assert budget.take_now(1000, 4)
    assert not budget.take_now(1, 1)
    budget.release(1000, 4)
    assert (budget.bytes, budget.commands) == (0, 0)
    assert budget.take_now(1001, 1)  # one command larger than the budget still goes alone
    assert budget.room() == (3, -1)
