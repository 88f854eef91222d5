"""The compiled publish_document (native/src/publish.rs, DocumentPublisher) against its
twin (log/one_frame_publishers.py, LogPublisher._document_twin).

Two publishers numbered alike publish the same calls — documents whose key is an int,
a big or negative one, a bool, text (empty, non-ASCII, a lone surrogate), a float, a
list or missing; payloads that do not encode; other types of data; topics keyed by one
field, by two, unkeyed, placed by another partitioner, and topics of a wrong type;
expirations and options — through a real producer whose `produce` is watched: each call
must return or raise alike, and hand `produce` the same record (topic, value, key,
partition, headers, the delivery report's sequence).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.log.publisher import FailedWrite, LogPublisher

ids = (
    st.integers(-(2**70), 2**70)
    | st.booleans()
    | st.text(max_size=4)
    | st.sampled_from(["", "é", "\ud800", None])
    | st.floats(allow_nan=False)
    | st.lists(st.integers(0, 3), max_size=2)
)
values = st.integers(-5, 5) | st.text(max_size=3) | st.none() | st.just(object())
documents = st.builds(
    lambda id_, n, has_id: {"id": id_, "n": n} if has_id else {"n": n},
    ids,
    values,
    st.booleans(),
)
data = documents | st.sampled_from([[1, 2], "text", 3, None])
options = st.sampled_from(
    [{}, {}, {}, {"expiration": 5.0}, {"expiration": -1.0}, {"correlation_id": "c"}]
)
SPECS = {
    "keyed": (3, {"key": ("/id",)}),
    "composite": (3, {"key": ("/id", "/n")}),
    "unkeyed": (1, {}),
    "placed": (3, {"key": ("/id",), "partitioner": "fnv1a"}),  # the general path
}
calls = st.lists(
    st.tuples(st.sampled_from([*SPECS, None, "list"]), data, options), min_size=1, max_size=6
)


def watched(publisher: LogPublisher, compiled: bool) -> list[tuple]:
    """The records `publisher.publish_document` hands to produce, in order, each with its
    delivery report callback last; they are produced too. Not numbered on the publisher's
    compiled producer (tests/log/test_own_producer.py holds those records to these)."""
    produce, seen = publisher._produce_call, []
    publisher._numbered = None

    def spy(topic, value=None, key=None, partition=-1, callback=None, on_delivery=None,
            timestamp=0, headers=None):  # fmt: skip
        report = callback if callback is not None else on_delivery
        seen.append((topic, value, key, partition, headers, report))
        produce(topic, value, key, partition, callback=report, headers=headers)

    publisher._produce_call = spy
    publisher.publish_document = (
        publisher._document_publisher() if compiled else publisher._document_twin()
    )
    return seen


def outcome(publish: Any, topic: Any, document: Any, kw: dict) -> tuple:
    try:
        return ("returned", publish(topic, document, **kw))
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))


@pytest.fixture
def publishers(bootstrap, topic_factory):
    topics = {label: topic_factory(n, **spec) for label, (n, spec) in SPECS.items()}
    topics["list"] = ["not", "a", "topic"]
    made = [LogPublisher(bootstrap, "same", first_sequence=7) for _ in range(2)]
    seen = [watched(made[0], compiled=True), watched(made[1], compiled=False)]
    yield topics, made, seen
    for publisher in made:
        publisher.close(30)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls)
@example([("keyed", {"id": 2**64, "n": 1}, {}), ("keyed", {"id": -3}, {})])
@example([("keyed", {"id": True}, {}), ("keyed", {"id": ""}, {}), ("keyed", {"n": 1}, {})])
@example([("unkeyed", {"a": object()}, {}), ("keyed", {"id": "\ud800"}, {})])
@example([("list", {"id": 1}, {}), (None, {"id": 1}, {})])
def test_the_compiled_path_publishes_what_its_twin_does(publishers, calls):
    topics, (compiled, twin), (compiled_seen, twin_seen) = publishers
    del compiled_seen[:], twin_seen[:]
    for label, document, kw in calls:
        topic = topics.get(label) if label is not None else None
        assert outcome(compiled.publish_document, topic, document, kw) == outcome(
            twin.publish_document, topic, document, kw
        )
    assert numbered(compiled_seen) == numbered(twin_seen)


def numbered(seen: list[tuple]) -> list[tuple]:
    """The records seen, each report callback as the sequence it reports."""
    return [(*record[:-1], int(record[-1])) for record in seen]


def test_a_refused_count_is_refused_alike(bootstrap, topic_factory):
    """A keyed topic whose partition count Kafka no longer has as created: both refuse,
    having numbered the publish (the check comes after the sequence, as publish()'s)."""
    topic = topic_factory(2, key=("/id",))
    made = [LogPublisher(bootstrap, "count", first_sequence=1) for _ in range(2)]
    try:
        for publisher, compiled in zip(made, (True, False), strict=True):
            watched(publisher, compiled)
            publisher._counts[topic] = (3, float("inf"))  # as if Kafka had 3 now
        compiled, twin = (p.publish_document for p in made)
        refused = outcome(compiled, topic, {"id": 1}, {})
        assert refused == outcome(twin, topic, {"id": 1}, {})
        assert refused[0] == "raised" and "has 3 partitions in Kafka" in refused[2]
        for publisher in made:
            publisher._counts.clear()  # read from Kafka again: 2, as created
        assert compiled(topic, {"id": 1}) == twin(topic, {"id": 1}) == 3
    finally:
        for publisher in made:
            publisher.close(30)


def test_a_delivery_report_names_its_publish_and_is_not_tracked(bootstrap, topic_factory):
    """The compiled report callback carries the sequence to _delivered, as the twin's
    int does, and the collector does not track it (the point of it)."""
    topic = topic_factory(1)
    failures: list[FailedWrite] = []
    publisher = LogPublisher(
        bootstrap, "reports", first_sequence=1, on_failed_write=failures.append
    )
    seen = watched(publisher, compiled=True)
    try:
        assert publisher.publish_document(topic, {"a": 1}) == 2
    finally:
        publisher.close(30)
    delivery = seen[0][-1]
    assert int(delivery) == 2
    assert not gc.is_tracked(delivery)

    class Record:  # what _delivered reads of a failed record
        def topic(self) -> str:
            return topic

    delivery(None, Record())  # a success is no failure
    delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Record())
    assert [(f.topic, f.sequence) for f in failures] == [(topic, 2)]
    assert "timed out" in failures[0].reason.lower()
