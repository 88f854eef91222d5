"""Fixtures for the subscriber-resilience tests (issue 6, seeds 003 and 004)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.message import COMPLETED, LogMessage


@pytest.fixture
def filled(client, topic_factory) -> Callable[..., str]:
    """`filled(count, partitions=1)`: a topic keyed by /id holding `count` persisted
    messages {"id": n % 10, "n": n}."""

    def make(count: int, partitions: int = 1) -> str:
        topic = topic_factory(partitions, key=("/id",))
        for n in range(count):
            client.publish(topic, {"id": n % 10, "n": n})
        client.publish_flush(30)
        return topic

    return make


def until_completed(stream: Iterable) -> list:
    """The messages before the completed marker."""
    messages = []
    for message in stream:
        if message is COMPLETED:
            return messages
        messages.append(message)
    raise AssertionError("the stream ended before its completed marker")


def record(
    offset: int,
    sequence: int | None = None,
    *,
    publisher: bytes = b"pub-a",
    partition: int = 0,
    topic: str = "orders",
) -> LogMessage:
    """A log message as a replay would deliver it, for the stores' own tests."""
    headers = None if sequence is None else [("p", publisher), ("s", b"%d" % sequence)]
    return LogMessage(topic, partition, offset, 0, b"{}", headers, JSON)
