"""`amps-kafka log`: what can still be replayed, and how long Kafka keeps it (seed 004,
"Managing Journal Files", in Kafka's terms)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from amps_on_kafka.cli.log import format_millis, log


def run(bootstrap: str, *args: str):
    return CliRunner().invoke(log, [*args, "-b", bootstrap])


def retention_ms(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(10)["retention.ms"].value


def test_log_info_shows_what_each_partition_can_still_replay(bootstrap, filled):
    topic, empty = filled(12), filled(0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 2)])[TopicPartition(topic, 0, 2)].result(10)
    result = run(bootstrap, "info", f"({re.escape(topic)}|{re.escape(empty)})")
    assert result.exit_code == 0, result.output
    sections = dict(re.findall(r"^(\S+)  (.*)$", result.output, re.MULTILINE))
    assert "retention.ms=7d (604800000)" in sections[topic]
    assert "cleanup.policy=delete" in sections[topic]
    rows = [line.split() for line in result.output.splitlines() if re.match(r"\s+\d", line)]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    filled_row = next(row for row in rows if row[1] != "(empty)")
    assert filled_row[:2] == ["0", "2"]  # retention (here delete_records) moved the start
    assert filled_row[3] == "11"
    assert re.fullmatch(stamp, filled_row[2]) and re.fullmatch(stamp, filled_row[4])
    assert filled_row[2] <= filled_row[4]
    assert ["0", "(empty)", "next", "offset", "0"] in rows


def test_log_retention_sets_the_topics_retention_ms(bootstrap, filled):
    topic = filled(1)
    result = run(bootstrap, "retention", topic, "12h")
    assert result.exit_code == 0, result.output
    assert retention_ms(bootstrap, topic) == str(12 * 3600 * 1000)
    assert run(bootstrap, "retention", topic, "forever").exit_code == 0
    assert retention_ms(bootstrap, topic) == "-1"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [(("soon",), "not a duration"), (("0s",), "longer than 0")],
)
def test_log_retention_refuses_what_is_not_a_duration(bootstrap, filled, args, complaint):
    topic = filled(1)
    result = run(bootstrap, "retention", topic, *args)
    assert result.exit_code != 0 and complaint in result.output
    assert retention_ms(bootstrap, topic) == "604800000"  # unchanged


def test_log_retention_of_an_unknown_topic_is_a_clear_error(bootstrap):
    result = run(bootstrap, "retention", "no-such-topic-anywhere", "7d")
    assert result.exit_code != 0 and "does not exist" in result.output


def test_retention_is_shown_in_amps_durations():
    assert [format_millis(ms) for ms in (604_800_000, 43_200_000, 90_000, 1500, -1)] == [
        "7d",
        "12h",
        "90s",
        "1500ms",
        "forever",
    ]
