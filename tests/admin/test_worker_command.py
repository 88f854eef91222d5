"""`amps-kafka worker` with `Admin: Listen:` serves the admin port and names it."""

from __future__ import annotations

import json
import signal
import uuid
from urllib.error import HTTPError
from urllib.request import urlopen

import orjson
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.processor.worker import Worker
from tests.admin.conftest import until
from tests.cli.test_failures import Running, sow_yaml, write_config


def test_the_worker_command_serves_the_admin_port(bootstrap, topic_factory, tmp_path):
    topic = topic_factory(2, key=("/id",))
    config = sow_yaml(topic) + "Admin:\n  Listen: 127.0.0.1:0\n"
    ready_file = tmp_path / "worker.json"
    running = Running(
        "worker", "--config", write_config(tmp_path, config),
        "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0",
        "--ready-file", str(ready_file), bootstrap=bootstrap,
    )  # fmt: skip
    try:
        line = running.wait_for("worker ready: ")
        info = orjson.loads(ready_file.read_bytes())
        admin = info["admin"]
        assert admin.startswith("http://127.0.0.1:") and f"admin={admin} " in line

        def ready() -> dict | None:
            try:
                with urlopen(f"{admin}/ready", timeout=10) as response:
                    return json.load(response)
            except HTTPError:
                return None  # 503 until the log ends are known

        assert until(ready, "/ready 200") == {"ready": True, "reasons": []}
        with urlopen(f"{admin}/metrics", timeout=10) as response:
            assert f'amps_sow_partitions{{topic="{topic}"}} 2.0' in response.read().decode()
        assert _subscriptions_seen(admin, info["gateway"], topic) == [
            {"client": "cmd-viewer", "sub_id": "watch", "kind": "sow", "topic": topic,
             "filter": "/n > 5"}
        ]  # fmt: skip
        code, _ = running.interrupt(signal.SIGTERM)
        assert code == 0
    finally:
        running.kill()


def _subscriptions_seen(admin: str, gateway: str, topic: str) -> list[dict]:
    """/admin's subscriptions while a client subscribes through the worker's gateway,
    which spreads each SOW subscription over the group (the view named that wrapper's
    class, with no topic and no filter)."""
    with Client("cmd-viewer") as client:
        client.connect(gateway)
        client.logon()
        with (
            client.subscribe(topic, "/n > 5", sub_id="watch", timeout=5),
            urlopen(f"{admin}/admin", timeout=10) as response,
        ):
            return json.load(response)["subscriptions"]


def test_a_lost_store_is_rebuilt_from_the_log_not_from_the_committed_offsets(
    bootstrap, topic_factory, tmp_path
):
    """The offsets a worker commits are for Kafka's lag tools only: a worker of the same
    group whose state directory is gone starts from the log's start, not where the
    group's committed offsets say (there it would have an empty SOW)."""
    topic = topic_factory(1, key=("/id",))
    config = Config.model_validate(
        {
            "Topics": [{"Name": topic}],
            "SOW": [{"Topic": topic, "Key": "/id"}],
            "State": {"FlushEvery": "200ms"},
        }
    )
    group = f"test-lost-store-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(5):
        producer.produce(topic, orjson.dumps({"id": n}), key=str(n).encode(), partition=0)
    assert producer.flush(10) == 0
    first = Worker(config, bootstrap, tmp_path / "first", group_id=group)
    first.start()
    try:
        first.wait_ready()
        until(lambda: _committed(bootstrap, group, topic) == 5, "offset 5 committed")
    finally:
        first.stop()
    second = Worker(config, bootstrap, tmp_path / "second", group_id=group)
    second.start()
    try:
        second.wait_ready()
        until(lambda: second.applied == 5, "the 5 records applied again")
    finally:
        second.stop()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
    [offset] = admin.list_consumer_group_offsets(request)[group].result(10).topic_partitions
    return offset.offset
