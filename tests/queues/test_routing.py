"""Seed 001, "Using Multiple Underlying Topics": the routing table of the ORDERS /
ORDERS_ANALYTICS / ORDERS_RISK example, with config/queues-example.yaml as the config."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.log.topics import create_from_config
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.server.queue_links import moving
from tests.conftest import create_topic, delete_topics
from tests.queues.helpers import eventually

EXAMPLE = Path(__file__).parents[2] / "config" / "queues-example.yaml"

# The seed's table: a publish to this topic is enqueued by exactly these queues.
SEED_TABLE = {
    "ORDERS": {"ORDERS_ANALYTICS", "ORDERS_RISK"},
    "ORDERS_ANALYTICS": {"ORDERS_ANALYTICS"},
    "ORDERS_RISK": {"ORDERS_RISK"},
    "ORDERS_ANALYTICS_DIRECT": {"ORDERS_ANALYTICS"},
    "ORDERS_RISK_DIRECT": {"ORDERS_RISK"},
}


def test_publish_to_a_queue_name_is_written_to_its_direct_topic():
    config = load_config(EXAMPLE)
    assert config.publish_target("ORDERS_ANALYTICS") == "ORDERS_ANALYTICS_DIRECT"  # default
    assert config.publish_target("ORDERS_RISK") == "ORDERS_RISK_DIRECT"  # configured
    assert config.publish_target("ORDERS") == "ORDERS"


@pytest.mark.parametrize(("published_to", "enqueued_by"), SEED_TABLE.items())
def test_the_seed_routing_table(published_to, enqueued_by):
    config = load_config(EXAMPLE)
    written_to = config.publish_target(published_to)
    assert {q.name for q in config.queues_viewing(written_to)} == enqueued_by


def test_the_seed_routing_table_end_to_end(bootstrap, publisher, engines):
    """Publish one message to each topic of the table through Kafka; each queue holds
    exactly the messages the seed says it enqueues, and acks in one leave the other."""
    prefix = f"R{uuid.uuid4().hex[:6]}_"
    config = _renamed(load_config(EXAMPLE), prefix)
    names = [t.name for t in config.topics]
    for name in names:
        create_topic(bootstrap, TopicSpec(name, 1))
    try:
        engine = engines(config)
        for topic in SEED_TABLE:
            publisher.publish(engine.publish_target(prefix + topic), {"row": topic})
        publisher.flush(10)
        expected = {
            queue: {row for row, queues in SEED_TABLE.items() if queue in queues}
            for queue in ("ORDERS_ANALYTICS", "ORDERS_RISK")
        }
        for queue, rows in expected.items():
            _wait_depth(engine, prefix + queue, len(rows))
            assert {m.data["row"] for m in engine.browse(prefix + queue)} == rows
        # each queue tracks the shared message on its own: an ack in one leaves the other
        analytics, risk = prefix + "ORDERS_ANALYTICS", prefix + "ORDERS_RISK"
        assert engine.ack_by_filter(analytics, "/row = 'ORDERS'", "s1").result(10).acked == 1
        assert "ORDERS" not in {m.data["row"] for m in engine.browse(analytics)}
        assert "ORDERS" in {m.data["row"] for m in engine.browse(risk)}
    finally:
        queues = [prefix + q for q in ("ORDERS_ANALYTICS", "ORDERS_RISK")]
        delete_topics(bootstrap, names + [events_topic(q) for q in queues])


def test_a_kafka_publish_to_a_queue_name_lands_in_its_publish_target(bootstrap):
    """Without a gateway, `topics create` leaves the queue's DefaultPublishTarget in the
    topic registry, so a kafka:// publish to ORDERS_ANALYTICS goes where seed 001 says."""
    prefix = f"K{uuid.uuid4().hex[:6]}_"
    config = _renamed(load_config(EXAMPLE), prefix)
    registry = TopicRegistry(bootstrap)
    create_from_config(AdminClient({"bootstrap.servers": bootstrap}), registry, config)
    queue, direct = prefix + "ORDERS_ANALYTICS", prefix + "ORDERS_ANALYTICS_DIRECT"
    try:
        with Client("queue-publisher") as client:
            client.connect(f"kafka://{bootstrap}")
            client.publish(queue, {"row": "to the queue's name"})
            client.publish_flush(10)
        with Replay(bootstrap, direct, "0", until="0|1|") as log:
            landed = [m.data for m in log if m is not COMPLETED]
        assert landed == [{"row": "to the queue's name"}]
        assert registry.spec(queue).name == direct
    finally:
        delete_topics(bootstrap, [t.name for t in config.topics])


def _renamed(config: Config, prefix: str) -> Config:
    """The example with every name prefixed, so runs sharing a broker don't collide."""
    raw = config.model_dump(by_alias=True, exclude_none=True)
    for topic in raw["Topics"]:
        topic["Name"] = prefix + topic["Name"]
    for queue in raw["Queues"]:
        queue["Name"] = prefix + queue["Name"]
        queue["UnderlyingTopic"] = queue["UnderlyingTopic"].replace("^", "^" + prefix)
        if "DefaultPublishTarget" in queue:
            queue["DefaultPublishTarget"] = prefix + queue["DefaultPublishTarget"]
        queue.pop("DeadLetterTopic", None)
    return Config.model_validate(raw)


def _wait_depth(engine, queue: str, depth: int) -> None:
    eventually(engine, lambda: engine.runtimes[queue].state.depth >= depth, what=f"{queue} depth")


def test_a_retry_reason_inside_a_queue_refusal_is_not_prefixed_twice() -> None:
    """qa15 saw `retry: queue moving (q: retry: partitions moving (...))` when the link to
    the owner could not open: one `retry:` says what the client does."""
    reason = moving(["q"], "retry: partitions moving (the worker at h:1: refused)").reason
    assert reason == "retry: queue moving (q: partitions moving (the worker at h:1: refused))"
    assert moving(["q"], "no worker owns it now").reason == (
        "retry: queue moving (q: no worker owns it now)"
    )
