"""One worker per test module with everything an operator looks at switched on: a SOW
topic (2 partitions, expiration enabled), a queue with a dead-letter topic, the gateway
and the admin port; its stores flushed (and so its offsets committed) every 200 ms."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
from prometheus_client.parser import text_string_to_metric_families

from amps_on_kafka.admin import AdminServer, Sources
from amps_on_kafka.config import Config
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import create_topic, delete_topics
from tests.polling import until

__all__ = ["until"]  # the admin tests import it from here


@dataclass
class Operated:
    topic: str
    queue: str
    group: str
    worker: Worker
    gateway: Gateway
    admin: AdminServer

    @property
    def uri(self) -> str:
        return f"tcp://{self.gateway.address}/amps/json"

    @property
    def url(self) -> str:
        return f"http://{self.admin.address}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read()
        except HTTPError as error:
            return error.code, error.read()

    def json(self, path: str) -> tuple[int, dict]:
        status, body = self.get(path)
        return status, json.loads(body)

    def scrape(self) -> Metrics:
        status, body = self.get("/metrics")
        assert status == 200
        return Metrics(
            {
                (sample.name, frozenset(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(body.decode())
                for sample in family.samples
            }
        )


@dataclass
class Metrics:
    samples: dict[tuple[str, frozenset], float]

    def __call__(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a labelled one not there yet (nothing counted)."""
        if labels:
            return self.samples.get((name, frozenset(labels.items())), 0.0)
        return self.samples[(name, frozenset())]

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


@pytest.fixture(scope="module")
def operated(bootstrap: str, tmp_path_factory) -> Iterator[Operated]:
    suffix = uuid.uuid4().hex[:8]
    topic, queue = f"admin-sow-{suffix}", f"admin-queue-{suffix}"
    create_topic(bootstrap, TopicSpec(topic, 2, key=("/id",)))
    create_topic(bootstrap, TopicSpec(queue, 1))
    create_topic(bootstrap, TopicSpec(f"{queue}-dead", 1))
    config = Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": 2}, {"Name": queue}],
            "SOW": [{"Topic": topic, "Key": "/id", "Expiration": "enabled"}],
            "Queues": [{"Name": queue, "DeadLetterTopic": f"{queue}-dead"}],
            "State": {"FlushEvery": "200ms"},
            "Admin": {"Listen": "127.0.0.1:0", "ReadyMaxLag": 100},
        }
    )
    group = f"test-admin-{suffix}"
    worker = Worker(config, bootstrap, tmp_path_factory.mktemp("state"), group_id=group)
    worker.start()
    try:
        worker.wait_ready(60)
        gateway = Gateway(
            worker.engine,
            bootstrap,
            listen="127.0.0.1:0",
            settings=config.gateway,
            queues=worker.queues,
        )
        gateway.start()
        try:
            with AdminServer(Sources(worker, gateway), config.admin) as admin:
                yield Operated(topic, queue, group, worker, gateway, admin)
        finally:
            gateway.stop()
    finally:
        worker.stop()
        delete_topics(bootstrap, [topic, queue, f"{queue}-dead", events_topic(queue)])
