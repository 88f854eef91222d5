"""Gateways for the tests: over a bare engine (no SOW topic), or over a running worker.

The worker fixture gives each test its own SOW topic (2 partitions, Key /id, expiration
enabled), its own consumer group and state directory, and a gateway on a free port.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import Worker, now_ms
from amps_on_kafka.server.gateway import Gateway
from tests.server.helpers import Wire


@dataclass
class Served:
    topic: str
    address: str
    worker: Worker
    gateway: Gateway

    @property
    def uri(self) -> str:
        return f"tcp://{self.address}/amps/json"


def sow_config(topic: str, partitions: int = 2, expiration: str = "enabled") -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": partitions}],
            "SOW": [{"Topic": topic, "Key": "/id", "Expiration": expiration}],
        }
    )


@pytest.fixture
def bare_gateway(bootstrap: str) -> Iterator[Gateway]:
    """A gateway whose engine holds no SOW topic: protocol, publishing, log subscriptions."""
    with Gateway(SowEngine(Config(), {}, now_ms), bootstrap, listen="127.0.0.1:0") as gateway:
        yield gateway


@pytest.fixture
def served(bootstrap: str, topic_factory, tmp_path, request) -> Iterator[Served]:
    """A worker and its gateway; expiration enabled unless parametrized (indirect)."""
    topic = topic_factory(2, key=("/id",))
    config = sow_config(topic, expiration=getattr(request, "param", "enabled"))
    worker = Worker(config, bootstrap, tmp_path / "state", group_id=f"test-{uuid.uuid4().hex}")
    worker.start()
    try:
        worker.wait_ready(60)
        gateway = Gateway(worker.engine, bootstrap, listen="127.0.0.1:0")
        try:
            yield Served(topic, gateway.start(), worker, gateway)
        finally:
            gateway.stop()
    finally:
        worker.stop()


@pytest.fixture
def wire_to() -> Iterator[Callable[[str], Wire]]:
    """``wire_to(address)``: a raw connection, closed after the test."""
    opened: list[Wire] = []

    def connect(address: str) -> Wire:
        opened.append(Wire(address))
        return opened[-1]

    yield connect
    for wire in opened:
        wire.close()


@pytest.fixture
def client_to() -> Iterator[Callable[..., Client]]:
    """``client_to(address, name=None)``: a logged-on tcp:// Client, closed after the test."""
    opened: list[Client] = []

    def connect(address: str, name: str | None = None) -> Client:
        client = Client(name or f"test-{uuid.uuid4().hex[:8]}")
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()
