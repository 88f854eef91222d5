"""An Avro topic end to end, from a config file as a user writes one: topics created from
the config, publishes encoded with its schema by the kafka:// client, the worker's SOW
decoded and filtered, and the log replayed as documents."""

from __future__ import annotations

import uuid

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.client import Client
from amps_on_kafka.config import load_config
from amps_on_kafka.errors import MessageError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.topics import create_from_config
from tests.conftest import delete_topics
from tests.log.test_codecs import ORDER_SCHEMA
from tests.sow.conftest import wait_caught_up


@pytest.fixture
def avro_config(bootstrap, tmp_path):
    topic = f"avro-orders-{uuid.uuid4().hex[:8]}"
    (tmp_path / "order.avsc").write_bytes(orjson.dumps(ORDER_SCHEMA))
    path = tmp_path / "amps.yaml"
    path.write_text(
        f"Topics:\n"
        f"  - Name: {topic}\n"
        f"    Partitions: 2\n"
        f"    MessageType: avro\n"
        f"    Schema: order.avsc\n"
        f"SOW:\n"
        f"  - Topic: {topic}\n"
        f"    Key: /id\n"
    )
    config = load_config(path)
    create_from_config(
        AdminClient({"bootstrap.servers": bootstrap}), TopicRegistry(bootstrap), config
    )
    yield config
    delete_topics(bootstrap, [topic])


def test_an_avro_topic_from_publish_to_sow_and_replay(bootstrap, avro_config, start_worker):
    topic = avro_config.topics[0].name
    orders = [{"id": i, "sym": "IBM" if i % 2 else "MSFT", "qty": float(i)} for i in range(6)]
    with Client("avro-publisher") as client:
        client.connect(f"kafka://{bootstrap}")
        for order in orders:
            client.publish(topic, order)
        client.delta_publish(topic, {"id": 1, "sym": "IBM", "qty": 100.0})
        with pytest.raises(MessageError, match="does not fit the Avro schema"):
            client.publish(topic, {"id": "seven", "sym": "X", "qty": 1.0})
        client.publish_flush(10)

        worker = start_worker(avro_config)
        wait_caught_up(worker, bootstrap, topic, 2)
        ibm = worker.engine.query(topic, compile_filter("/sym = 'IBM' AND /qty > 2"))
        assert sorted((r.sow_key, r.data["qty"]) for r in ibm.records) == [
            ("1", 100.0),
            ("3", 3.0),
            ("5", 5.0),
        ]
        assert not worker.rejected

        with client.bookmark_subscribe(topic, "0") as log:
            replayed = []
            for message in log:
                if message is COMPLETED:
                    break
                replayed.append(message.data)
    assert sorted(replayed, key=lambda d: (d["id"], d["qty"])) == sorted(
        [*orders, {"id": 1, "sym": "IBM", "qty": 100.0}], key=lambda d: (d["id"], d["qty"])
    )
