"""A failed publish is reported to the application, never dropped silently."""

from __future__ import annotations

import base64
import os
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from amps_on_kafka.errors import MessageError, PublishError
from tests.polling import until

NOISE = base64.b64encode(os.urandom(12_000)).decode()  # incompressible, unlike "x" * n


def small_topic(bootstrap: str) -> str:
    """A topic whose broker-side limit refuses records over 2 KB."""
    name = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"max.message.bytes": "2048", "message.timestamp.type": "LogAppendTime"}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    # usable once Kafka's metadata lists it (the creation answers before): a publish
    # asked sooner is refused as an unknown topic (docs/operations.md)
    until(lambda: name in admin.list_topics(timeout=10).topics, "the topic in metadata", 10.0)
    return name


def test_a_record_the_broker_refuses_fails_publish_flush(client, bootstrap):
    topic = small_topic(bootstrap)
    client.publish(topic, {"ok": 1})
    client.publish(topic, {"big": NOISE})
    with pytest.raises(PublishError, match="not persisted"):
        client.publish_flush(30)


def test_the_failed_write_handler_sees_each_failure(client, bootstrap):
    topic = small_topic(bootstrap)
    failures = []
    client.set_failed_write_handler(failures.append)
    sequence = client.publish(topic, {"big": NOISE})
    client.publish_flush(30)
    assert [(f.topic, f.sequence) for f in failures] == [(topic, sequence)]
    assert "too large" in failures[0].reason.lower() or "size" in failures[0].reason.lower()


def test_bad_payloads_are_refused_before_kafka(client, topic_factory):
    topic = topic_factory(partitions=1, key=("/id",))
    with pytest.raises(MessageError, match="not valid JSON"):
        client.publish(topic, "{broken")
    with pytest.raises(MessageError, match="SOW key field /id"):
        client.publish(topic, {"no": "id"})
    with pytest.raises(MessageError, match="expiration"):
        client.publish(topic, {"id": 1}, expiration=-1)
