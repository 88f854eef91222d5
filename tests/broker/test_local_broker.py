"""LocalBroker against a real JVM, in its own data directory and on free ports so the
session's broker is untouched. The module starts one broker; the last test stops it."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from amps_on_kafka.broker import BrokerError, LocalBroker, fetch_jars
from amps_on_kafka.broker.jars import asset_text
from amps_on_kafka.broker.testing import free_ports
from amps_on_kafka.cli.broker import broker as broker_cli


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    port, controller_port = free_ports(2)
    data_dir = tmp_path_factory.mktemp("local-broker")
    broker = LocalBroker(data_dir, port=port, controller_port=controller_port)
    broker.start()
    yield broker
    broker.stop()


def _fake_complete_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A jar cache that looks fully fetched, and a PATH with neither java nor mvn."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "complete").write_text(hashlib.sha256(asset_text("pom.xml").encode()).hexdigest())
    monkeypatch.setenv("AMPS_KAFKA_CACHE", str(cache))
    monkeypatch.setenv("PATH", str(cache / "empty-bin"))


def test_complete_cache_is_reused_and_interrupted_fetch_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_complete_cache(tmp_path / "cache", monkeypatch)
    assert fetch_jars() == tmp_path / "cache" / "libs"  # no Maven needed
    (tmp_path / "cache" / "complete").unlink()
    with pytest.raises(BrokerError, match="mvn not found on PATH"):
        fetch_jars()


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_complete_cache(tmp_path / "cache", monkeypatch)
    with pytest.raises(BrokerError, match="java not found on PATH: install Java 17"):
        LocalBroker(tmp_path / "data", port=free_ports(1)[0]).start()


def test_start_is_idempotent(local: LocalBroker) -> None:
    first = local.status()
    assert first.running
    # A second instance (as in a second CLI call) finds the broker through the data dir,
    # whatever port it was given.
    again = LocalBroker(local.data_dir, port=free_ports(1)[0]).start()
    assert again == first.bootstrap
    assert local.start() == first.bootstrap
    assert local.status().pid == first.pid


def test_status_prints_bootstrap_last(local: LocalBroker) -> None:
    result = CliRunner().invoke(broker_cli, ["status", "--data-dir", str(local.data_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == local.status().bootstrap


def test_produce_consume_round_trip(local: LocalBroker) -> None:
    bootstrap = local.status().bootstrap
    topic = f"round-trip-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"message.timestamp.type": "LogAppendTime"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        message = consumer.poll(10)
    finally:
        consumer.close()
    assert message is not None and message.error() is None
    assert (message.key(), message.value()) == (b"k", b"hello")
    assert message.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME


def test_topics_are_not_auto_created(local: LocalBroker) -> None:
    bootstrap = local.status().bootstrap
    topic = f"never-created-{uuid.uuid4().hex[:8]}"
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "topic.metadata.propagation.max.ms": 1000,  # give up on an unknown topic quickly
            "message.timeout.ms": 5000,
        }
    )
    try:
        producer.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(15)
    except KafkaException as exc:
        errors.append(exc.args[0])
    assert errors and errors[0] is not None
    assert errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
    assert topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5).topics


def test_stop_is_clean_and_idempotent(local: LocalBroker) -> None:
    assert local.stop() is True
    assert not local.status().running
    result = CliRunner().invoke(broker_cli, ["status", "--data-dir", str(local.data_dir)])
    assert result.exit_code == 1
    assert result.output.strip() == "not running"
    assert not (local.data_dir / "broker.json").exists()
    assert local.stop() is False


def test_topic_factory_makes_log_append_time_topics(bootstrap: str, topic_factory) -> None:
    topic = topic_factory(3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result()
    assert configs["message.timestamp.type"].value == "LogAppendTime"
