"""Our partitioners agree with librdkafka's own, key for key (defect 14).

A SOW topic written by other producers declares their partitioner, and every publisher
and the worker's placement check compute partitions with log/keys.py's partition_for.
If it disagreed with the partitioner the foreign producer runs, one SOW key would live
in two partitions. Each property produces keys with a real librdkafka producer set to
that partitioner and checks where the broker says each record went.
"""

from __future__ import annotations

import uuid
from typing import get_args

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_on_kafka.config.model import Partitioner
from amps_on_kafka.log.keys import PARTITIONERS, fnv1a, murmur2, partition_for
from amps_on_kafka.log.registry import TopicSpec
from tests.conftest import create_topic, delete_topics

# librdkafka's names for each of ours; for a non-empty key both variants hash alike.
LIBRDKAFKA = {
    "murmur2": ("murmur2", "murmur2_random"),
    "crc32": ("consistent", "consistent_random"),
    "fnv1a": ("fnv1a", "fnv1a_random"),
}
PARTITION_COUNTS = (3, 7)
keys = st.lists(st.binary(min_size=1, max_size=80), min_size=1, max_size=200, unique=True)


def test_every_partitioner_is_checked_against_librdkafka_and_can_be_configured():
    assert set(LIBRDKAFKA) == set(PARTITIONERS) == set(get_args(Partitioner))


@given(
    spec=st.builds(
        TopicSpec,
        name=st.from_regex(r"[a-z][a-z0-9._-]{0,20}", fullmatch=True),
        partitions=st.integers(1, 10_000),
        key=st.none()
        | st.lists(st.from_regex(r"/[a-z]{1,5}", fullmatch=True), min_size=1).map(tuple),
        key_from_publish=st.booleans(),
        partitioner=st.sampled_from(PARTITIONERS),
        repartition=st.booleans(),
    )
)
def test_a_registry_entry_reads_back_as_the_spec_written(spec):
    """`topics create` compares specs read back from the registry: nothing may drift."""
    assert TopicSpec.from_json(spec.to_json()) == spec


def test_known_hashes():
    """Reference values: Kafka's Java Utils.murmur2 and the FNV-1a test vectors."""
    assert murmur2(b"21") == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"") == 275646681
    assert fnv1a(b"") == 0x811C9DC5
    assert fnv1a(b"a") == 0xE40C292C
    assert fnv1a(b"foobar") == 0xBF9CF968


def test_an_unknown_partitioner_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown partitioner 'crc16' \(one of murmur2"):
        partition_for(b"k", 3, "crc16")


def placed_by_librdkafka(bootstrap: str, topic: str, setting: str, batch: list[bytes]):
    """Where a librdkafka producer with `partitioner=setting` puts each key."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": setting, "linger.ms": 1})
    placed: dict[bytes, int] = {}

    def delivered(error, message) -> None:
        assert error is None, error
        placed[message.key()] = message.partition()

    for key in batch:
        producer.produce(topic, b"", key, on_delivery=delivered)
    assert producer.flush(30) == 0
    return placed


@pytest.fixture(scope="module")
def topics(bootstrap):
    """One topic per partition count, shared by every example (made once per module)."""
    names = {n: f"partitioners-{n}-{uuid.uuid4().hex[:8]}" for n in PARTITION_COUNTS}
    for count, name in names.items():
        create_topic(bootstrap, TopicSpec(name, count))
    yield names
    delete_topics(bootstrap, list(names.values()))


@pytest.mark.parametrize("ours", PARTITIONERS)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=keys, count=st.sampled_from(PARTITION_COUNTS), variant=st.booleans())
def test_partition_for_agrees_with_librdkafka(bootstrap, topics, ours, batch, count, variant):
    """Defect 14: each partitioner places every key where librdkafka's does."""
    setting = LIBRDKAFKA[ours][variant]
    placed = placed_by_librdkafka(bootstrap, topics[count], setting, batch)
    assert placed == {key: partition_for(key, count, ours) for key in batch}
