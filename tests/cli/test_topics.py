"""`amps-kafka topics create` reruns: the same spec is a no-op, another is refused (defect 3).

Before, a rerun without --key printed `exists` and re-registered the topic unkeyed with
one partition: later publishes went unkeyed to any partition and the SOW held keys twice.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import NewTopic

from amps_on_kafka.log.kafka import admin_client
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.topics import repartition_topic
from tests.conftest import delete_topics
from tests.log.test_placement import grow


@pytest.fixture
def name(bootstrap):
    made = f"cli-topics-{uuid.uuid4().hex[:8]}"
    yield made
    delete_topics(bootstrap, [made])


def test_a_rerun_with_the_same_spec_changes_nothing(run, name):
    args = ("topics", "create", name, "-p", "4", "--key", "/id", "--partitioner", "crc32")
    assert run(*args).output.endswith(f"{name}: created\n")
    again = run(*args)
    assert again.exit_code == 0 and again.output.endswith(f"{name}: exists\n")


def test_a_rerun_with_another_spec_is_refused_showing_both(run, name, bootstrap):
    assert run("topics", "create", name, "-p", "4", "--key", "/id").exit_code == 0
    refused = run("topics", "create", name)
    assert refused.exit_code != 0
    assert "registered: 4 partitions, key /id, json, partitioner murmur2" in refused.output
    assert "requested:  1 partition, no key, json, partitioner murmur2" in refused.output
    entry = TopicRegistry(bootstrap).entries()[name]
    assert (entry.partitions, entry.key) == (4, ("/id",))


@pytest.mark.parametrize("path", ["id", "[/id]", "/a b", "/id/", ""])
def test_a_key_path_the_config_would_refuse_is_refused_before_anything_is_made(
    run, name, bootstrap, path
):
    """`--key id` was registered as is: every record then lacked its key field."""
    refused = run("topics", "create", name, "--key", path)
    assert refused.exit_code == 1
    assert f"Key path {path!r} must look like /field or /a/b" in refused.output
    assert name not in TopicRegistry(bootstrap).entries()


def test_a_config_naming_a_topic_with_another_partitioner_is_refused(run, name, tmp_path):
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    config = tmp_path / "c.yaml"
    config.write_text(
        f"Topics: [{{Name: {name}, Partitions: 2, Partitioner: fnv1a}}]\n"
        f"SOW: [{{Topic: {name}, Key: /id}}]\n"
    )
    refused = run("topics", "create", "--config", str(config))
    assert refused.exit_code != 0
    assert "requested:  2 partitions, key /id, json, partitioner fnv1a" in refused.output


def test_a_topic_made_by_other_tools_is_registered_if_its_partition_count_matches(
    run, name, bootstrap
):
    admin = admin_client(bootstrap)  # held: the future fails if its client is freed
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    wrong = run("topics", "create", name, "-p", "4", "--key", "/id")
    assert wrong.exit_code != 0 and "has 3 partitions in Kafka, not the 4" in wrong.output
    right = run("topics", "create", name, "-p", "3", "--key", "/id", "--partitioner", "crc32")
    assert right.exit_code == 0 and right.output.endswith(f"{name}: exists, registered\n")
    assert TopicRegistry(bootstrap).entries()[name].partitioner == "crc32"


def test_a_rerun_on_a_topic_given_more_partitions_says_so(run, name, bootstrap):
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    grow(bootstrap, name, 3)
    refused = run("topics", "create", name, "-p", "2", "--key", "/id")
    assert refused.exit_code != 0
    assert f"topic '{name}' has 3 partitions in Kafka, not the 2 its spec says" in refused.output


def test_repartition_can_be_turned_on_for_a_topic_but_not_off(run, name, bootstrap, tmp_path):
    """On, the SOW moves to the internal topic: where the source holds keys stops
    mattering. Off, it would be kept from a source whose keys may be anywhere."""
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    config = tmp_path / "c.yaml"
    sow = f"SOW: [{{Topic: {name}, Key: /id, Repartition: %s}}]\n"
    topics = f"Topics: [{{Name: {name}, Partitions: 2}}]\n"
    try:
        config.write_text(topics + sow % "true")
        on = run("topics", "create", "--config", str(config))
        assert on.exit_code == 0 and on.output.endswith(f"{name}: exists, registered\n")
        assert TopicRegistry(bootstrap).entries()[name].repartition
        assert repartition_topic(name) in admin_client(bootstrap).list_topics(timeout=10).topics
        config.write_text(topics + sow % "false")
        off = run("topics", "create", "--config", str(config))
        assert off.exit_code != 0 and "registered: 2 partitions, key /id" in off.output
    finally:
        delete_topics(bootstrap, [repartition_topic(name)])
