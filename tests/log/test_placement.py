"""Every publisher places a SOW key by its topic's partitioner and Kafka's partition count.

Defects 3 and 14: a key must live in one partition, whichever client wrote it, so the
SOW never holds it twice. The kafka:// client and the gateway publish through the same
LogPublisher; these tests drive it through the client and directly.
"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka.admin import NewPartitions

from amps_on_kafka.cli import main
from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.errors import PublishError
from amps_on_kafka.log.kafka import admin_client
from amps_on_kafka.log.keys import PARTITIONERS, partition_for
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.server.gateway import Gateway
from tests.log.conftest import records_of

PARTITIONS = 5


@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_publishes_and_deletes_by_key_go_where_the_topics_partitioner_puts_the_key(
    bootstrap, client, topic_factory, partitioner
):
    topic = topic_factory(PARTITIONS, key=("/id",), partitioner=partitioner)
    for i in range(60):
        client.publish(topic, {"id": f"k{i}", "n": i})
    client.delta_publish(topic, {"id": "k1", "n": -1})
    client.publish_flush(30)
    publisher = LogPublisher(bootstrap, "deleter")
    publisher.sow_delete(topic, keys=["k2", "k3", "k59"])
    publisher.sow_delete(topic, data={"id": "k4"})
    publisher.close(30)
    records = records_of(bootstrap, topic)
    assert len(records) == 65
    for record in records:
        home = partition_for(record.key(), PARTITIONS, partitioner)
        assert record.partition() == home, (record.key(), partitioner)


def test_a_delete_by_filter_reaches_every_partition_kafka_has(bootstrap, topic_factory):
    """Defect 3: the fan-out takes the partition count from Kafka, not the registry."""
    topic = topic_factory(2)  # unkeyed: adding partitions moves no key
    grow(bootstrap, topic, 3)
    publisher = LogPublisher(bootstrap, "deleter")
    assert len(publisher.sow_delete(topic, filter="/n > 1")) == 3
    publisher.close(30)
    assert sorted(r.partition() for r in records_of(bootstrap, topic)) == [0, 1, 2]


def test_a_keyed_publish_to_a_topic_given_more_partitions_is_refused_naming_both(
    bootstrap, client, topic_factory
):
    """Partitions added to a keyed topic would move its keys: say so, write nothing."""
    topic = topic_factory(2, key=("/id",))
    grow(bootstrap, topic, 3)
    with pytest.raises(PublishError, match="has 3 partitions in Kafka but was created with 2"):
        client.publish(topic, {"id": 7})
    client.publish_flush(30)
    assert records_of(bootstrap, topic) == []


def grow(bootstrap: str, topic: str, count: int) -> None:
    admin = admin_client(bootstrap)
    admin.create_partitions([NewPartitions(topic, count)])[topic].result(30)


def test_the_gateway_and_the_cli_place_keys_by_the_topics_partitioner(bootstrap, topic_factory):
    """The other two publishers: a tcp:// client through a gateway, and `amps-kafka
    publish`; both go through LogPublisher and so by the topic's Partitioner."""
    topic = topic_factory(PARTITIONS, key=("/id",), partitioner="fnv1a")
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway, Client("gw") as client:
        client.connect(f"tcp://{gateway.address}/amps/json")
        client.logon()
        for i in range(20):
            client.publish(topic, {"id": f"g{i}"})
        client.publish_flush(30)
    lines = "\n".join(orjson.dumps({"id": f"c{i}"}).decode() for i in range(20))
    result = CliRunner().invoke(main, ["publish", topic, "-b", bootstrap], input=lines)
    assert result.exit_code == 0, result.output
    records = records_of(bootstrap, topic)
    assert len(records) == 40
    for record in records:
        assert record.partition() == partition_for(record.key(), PARTITIONS, "fnv1a")
