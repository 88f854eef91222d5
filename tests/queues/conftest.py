"""Fixtures for queue tests that run against the real broker: queues over fresh topics,
an engine per test, a publisher, and subscribers that collect what they are pushed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amps_on_kafka.config import Config
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.processor.queues import QueueEngine, QueueMessage, events_topic
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
