"""A publish to a topic the registry doesn't know (log/registry.py, TopicRegistry.spec).

A miss used to read the whole registry topic and ask Kafka for the name's metadata,
every time: a client cycling random names kept the gateway's pool and the brokers busy.
Now misses share one look at Kafka (its topic list and the registry's end; at most one
per TOPIC_LIST_INTERVAL), a name that is neither a topic nor registered is refused at
once for UNKNOWN_TOPIC_TTL (at most UNKNOWN_NAMES names remembered), and the registry is
read again only for a name Kafka has or once it grew, one read shared by the misses
waiting for it.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from amps_on_kafka.errors import UnknownTopic
from amps_on_kafka.log import registry as registry_module
from amps_on_kafka.log.registry import Covering, TopicRegistry, TopicSpec
from tests.polling import until


def _name() -> str:
    return f"nosuch-{uuid.uuid4().hex}"


def test_misses_asked_during_a_call_share_the_next_one_and_its_error() -> None:
    """Callers asking while a call runs get a call begun after they asked (they must see
    what happened before), all of them the same one; an error reaches every sharer."""
    started, release = threading.Event(), threading.Event()
    outcomes: list[object] = []

    def fetch() -> int:
        started.set()
        release.wait(10)
        if covering.calls == 2:
            raise RuntimeError("the second call failed")
        return covering.calls

    covering = Covering(fetch)

    def ask() -> None:
        try:
            outcomes.append(covering.get())
        except RuntimeError as exc:
            outcomes.append(str(exc))

    first = threading.Thread(target=ask)
    first.start()
    assert started.wait(10)
    later = [threading.Thread(target=ask) for _ in range(5)]
    for thread in later:
        thread.start()
    release.set()
    for thread in [first, *later]:
        thread.join(10)
    assert covering.calls == 2
    assert sorted(map(str, outcomes)) == ["1"] + ["the second call failed"] * 5


def test_a_name_kafka_lacks_is_refused_at_once_while_remembered(bootstrap, monkeypatch) -> None:
    """A misspelt topic published to in a loop: one look at Kafka, at most one registry
    read (the first miss of this registry reads it), then refused from memory."""
    monkeypatch.setattr(registry_module, "UNKNOWN_TOPIC_TTL", 60.0)
    registry = TopicRegistry(bootstrap)
    name = _name()
    for _ in range(50):
        with pytest.raises(UnknownTopic, match=f"topic '{name}' does not exist"):
            registry.spec(name)
    assert (registry.looks.calls, registry.reads.calls) == (1, 1)
    assert registry.unknown_names() == 1


def test_a_flood_of_random_names_is_bounded_in_memory_and_in_requests(
    bootstrap, monkeypatch
) -> None:
    """8 threads asking 160 names Kafka lacks: every one refused, at most UNKNOWN_NAMES
    remembered, and Kafka asked at most once per TOPIC_LIST_INTERVAL (the threads share
    each look), the registry read again only when it grew (other tests register topics
    on this broker meanwhile)."""
    monkeypatch.setattr(registry_module, "UNKNOWN_NAMES", 50)
    registry = TopicRegistry(bootstrap)
    refused: list[str] = []

    def flood() -> None:
        for _ in range(20):
            try:
                registry.spec(_name())
            except UnknownTopic as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=flood) for _ in range(8)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    elapsed = time.monotonic() - began
    assert len(refused) == 160
    assert registry.unknown_names() == 50
    assert registry.looks.calls < 160
    assert registry.reads.calls <= registry.looks.calls
    assert registry.looks.calls <= elapsed / registry_module.TOPIC_LIST_INTERVAL + 1


@pytest.mark.timing
def test_a_topic_created_after_a_miss_is_usable_within_the_bound(bootstrap, topic_factory) -> None:
    """Refused while unknown; once another process created it, its registered spec (not
    a foreign topic's) within UNKNOWN_TOPIC_TTL of the creation."""
    registry = TopicRegistry(bootstrap)
    name = _name()
    with pytest.raises(UnknownTopic):
        registry.spec(name)
    topic_factory(2, name=name, key=("/id",))  # registered by another registry
    created = time.monotonic()

    def spec() -> TopicSpec | None:
        try:
            return registry.spec(name)
        except UnknownTopic:
            return None

    found = until(spec, "the new topic's spec", 10.0, 0.01)
    assert time.monotonic() - created <= registry_module.UNKNOWN_TOPIC_TTL + 0.5
    assert (found.partitions, found.key) == (2, ("/id",))


def test_misses_on_a_new_topic_share_one_registry_read(bootstrap, topic_factory) -> None:
    """Eight threads asking a topic this registry never read: one read between them."""
    topic = topic_factory(1, key=("/id",))
    registry = TopicRegistry(bootstrap)
    barrier = threading.Barrier(8)
    specs: list[TopicSpec] = []

    def ask() -> None:
        barrier.wait(10)
        specs.append(registry.spec(topic))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [spec.key for spec in specs] == [("/id",)] * 8
    # shared: a read serves every miss that asked before it began (their topic list
    # reads, one per TOPIC_LIST_INTERVAL, may let them ask in two or three waves)
    assert registry.reads.calls <= 3
