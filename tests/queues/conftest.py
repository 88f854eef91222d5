"""Fixtures for queue tests that run against the real broker: queues over fresh topics,
an engine per test, a publisher, subscribers that collect what they are pushed, and a
queue served by a gateway with clients connected to it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.queues import QueueEngine, QueueMessage
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import delete_topics


class Inbox:
    """A deliver callback that keeps what it is given and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[QueueMessage] = []
        self._changed = threading.Condition()

    def __call__(self, message: QueueMessage) -> None:
        with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 20.0) -> list[QueueMessage]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.messages) >= count, timeout):
                raise AssertionError(f"{len(self.messages)} of {count} messages after {timeout}s")
            return list(self.messages)

    def take(self) -> list[QueueMessage]:
        with self._changed:
            taken, self.messages = self.messages, []
            return taken

    @property
    def bookmarks(self) -> list[str]:
        return [m.bookmark for m in self.messages]


@pytest.fixture
def publisher(bootstrap: str) -> Iterator[LogPublisher]:
    pub = LogPublisher(bootstrap, f"qpub-{uuid.uuid4().hex[:6]}")
    yield pub
    pub.close()


@pytest.fixture
def queue_config(topic_factory, bootstrap: str) -> Iterator[Callable[..., Config]]:
    """``queue_config(**queue_options) -> Config``: a fresh topic and a queue of the same
    name over it (so a publish to the queue's name enqueues). Its events topic is removed
    when the test ends."""
    names: list[str] = []

    def make(partitions: int = 1, **options: Any) -> Config:
        topic = topic_factory(partitions)
        names.append(topic)
        return Config.model_validate(
            {
                "Topics": [{"Name": topic, "Partitions": partitions}],
                "Queues": [{"Name": topic, **options}],
            }
        )

    yield make
    if names:
        delete_topics(bootstrap, [events_topic(n) for n in names])


@pytest.fixture
def engines(bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., QueueEngine]]:
    """``engines(config, state_dir=None, clock=None) -> started, ready QueueEngine``;
    every engine a test starts is stopped when it ends."""
    started: list[QueueEngine] = []

    def start(config: Config, state_dir: Path | None = None, **kw: Any) -> QueueEngine:
        engine = QueueEngine(config, bootstrap, state_dir or tmp_path / "state", **kw)
        started.append(engine)
        engine.start()
        engine.wait_ready(60)
        return engine

    yield start
    for engine in started:
        engine.stop()


@dataclass
class Served:
    """A queue behind a gateway: its engine, and the address clients connect to."""

    queue: str
    engine: QueueEngine
    address: str

    def client(self, name: str | None = None) -> Client:
        client = Client(name or f"c-{uuid.uuid4().hex[:6]}")
        client.connect(f"tcp://{self.address}/amps/json")
        client.logon()
        return client


@pytest.fixture
def serve(bootstrap, engines) -> Iterator[Callable[[Config], Served]]:
    """``serve(config)``: the config's first queue behind a gateway (no SOW topics)."""
    opened: list[Gateway] = []

    def start(config: Config) -> Served:
        engine = engines(config)
        gateway = Gateway(
            SowEngine(Config(), {}, now_ms), bootstrap, listen="127.0.0.1:0", queues=engine
        )
        opened.append(gateway)
        return Served(config.queues[0].name, engine, gateway.start())

    yield start
    for gateway in opened:
        gateway.stop()


@pytest.fixture
def clients() -> Iterator[Callable[[Served], Client]]:
    """``clients(served) -> a logged-on Client``; each is closed when the test ends."""
    made: list[Client] = []

    def make(served: Served) -> Client:
        made.append(served.client())
        return made[-1]

    yield make
    for client in made:
        client.close()
