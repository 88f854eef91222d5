"""Fixtures for worker tests: SOW topics on the real broker and workers on real RocksDB."""

from __future__ import annotations

import uuid

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.processor.worker import Worker


def sow_config(topic: str, partitions: int = 2, **sow) -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": partitions}],
            "SOW": [{"Topic": topic, "Key": "/id", **sow}],
        }
    )


def wait_caught_up(
    worker: Worker, bootstrap: str, topic: str, partitions: int, timeout=60.0, owned_only=False
) -> None:
    """Until the worker's stores hold every record now in the log (see Worker.wait_caught_up)."""
    ends = end_offsets(bootstrap, topic)
    assert len(ends) == partitions
    worker.wait_caught_up(topic, ends, timeout, owned_only)


@pytest.fixture
def sow_topic(topic_factory):
    """A 2-partition log topic keyed by /id (the registry knows the key)."""
    return topic_factory(partitions=2, key=("/id",))


@pytest.fixture
def publisher(bootstrap):
    with Client(f"pub-{uuid.uuid4().hex[:6]}") as client:
        client.connect(f"kafka://{bootstrap}")
        yield client


@pytest.fixture
def start_worker(bootstrap, tmp_path):
    """start_worker(config, state_dir=None, group=None, clock=None) -> a running, ready
    Worker; all are stopped at the end."""
    started: list[Worker] = []

    def start(config: Config, state_dir=None, group=None, clock=None) -> Worker:
        worker = Worker(
            config,
            bootstrap,
            state_dir or tmp_path / "state",
            group_id=group or f"g-{uuid.uuid4().hex[:8]}",
            **({} if clock is None else {"clock": clock}),
        )
        worker.start()
        worker.wait_ready()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
