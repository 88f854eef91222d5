"""LogPublisher.publish_document (the one-frame path Client.publish takes on kafka://)
writes the very record LogPublisher.publish writes: key, partition, value and headers
(docs/performance.md). Each document is published through both, numbered alike, and the
two topics read back must match record for record."""

from __future__ import annotations

import pytest

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.publisher import LogPublisher
from tests.log.conftest import records_of

DOCUMENTS = [
    {"id": 7, "n": 1},
    {"id": "k", "n": 2.5, "nested": {"a": [1, None]}},
    {"id": True, "n": False},
    {"id": 1.5, "n": "é"},
    {"id": [1, "x"], "n": 3},
]


def written(bootstrap: str, topic: str) -> list[tuple]:
    return [
        (r.partition(), r.key(), r.value(), r.headers())
        for r in sorted(records_of(bootstrap, topic), key=lambda r: (r.partition(), r.offset()))
    ]


@pytest.mark.parametrize(
    ("partitions", "spec"),
    [
        (3, {"key": ("/id",)}),  # keyed, the producer's partitioner
        (3, {"key": ("/id",), "partitioner": "fnv1a"}),  # placed in Python: the general path
        (3, {"key": ("/id", "/n")}),  # a composite key
        (1, {}),  # no key: the producer picks any partition
    ],
)
def test_both_paths_write_the_same_records(bootstrap, topic_factory, partitions, spec):
    general_topic = topic_factory(partitions, **spec)
    fast_topic = topic_factory(partitions, **spec)
    general = LogPublisher(bootstrap, "same", first_sequence=100)
    fast = LogPublisher(bootstrap, "same", first_sequence=100)
    try:
        for document in DOCUMENTS:
            assert general.publish(general_topic, document) == fast.publish_document(
                fast_topic, document
            )
            if "key" in spec:  # a refusal takes no sequence number on either path
                with pytest.raises(MessageError):
                    general.publish(general_topic, {"n": 0})
                with pytest.raises(MessageError):
                    fast.publish_document(fast_topic, {"n": 0})
    finally:
        general.close(30)
        fast.close(30)
    assert written(bootstrap, general_topic) == written(bootstrap, fast_topic)
    assert len(written(bootstrap, fast_topic)) == len(DOCUMENTS)


def test_the_fast_path_refuses_what_the_general_path_refuses(bootstrap, topic_factory):
    topic = topic_factory(1, key=("/id",))
    publisher = LogPublisher(bootstrap, "refused")
    try:
        for keyless in ({"no": "id"}, {"id": ""}, {"id": None}):
            with pytest.raises(MessageError, match="SOW key field /id"):
                publisher.publish_document(topic, keyless)
        with pytest.raises(MessageError, match="can't encode payload as JSON"):
            publisher.publish_document(topic, {"id": 1, "bad": object()})
        with pytest.raises(MessageError, match="expiration"):
            publisher.publish_document(topic, {"id": 1}, -1)
    finally:
        publisher.close(30)
    assert records_of(bootstrap, topic) == []
