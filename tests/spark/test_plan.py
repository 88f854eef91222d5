"""Bookmarks to offsets, and the errors a job reports before Spark starts (no Spark here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Producer

from amps_on_kafka.errors import InvalidBookmark, UnknownTopic
from amps_on_kafka.log.kafka import client_config
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.spark.plan import plan_as_of, plan_range
from tests.spark.conftest import wait_until


def test_an_unknown_topic(bootstrap):
    with pytest.raises(UnknownTopic):
        plan_as_of(bootstrap, "no-such-topic-for-spark", "0|1|")


def test_bookmarks_outside_the_log(bootstrap, history):
    end = history.points[1].end
    with pytest.raises(InvalidBookmark, match="past the end of the log"):
        plan_as_of(bootstrap, history.topic, f"{history.topic}|0|{end[0] + 5}|")
    with pytest.raises(InvalidBookmark, match="does not exist"):
        plan_as_of(bootstrap, history.topic, f"{history.topic}|7|0|")
    with pytest.raises(InvalidBookmark, match="in the future"):
        plan_as_of(bootstrap, history.topic, "29990101T000000Z")
    first, second = history.points
    with pytest.raises(InvalidBookmark, match="is after --to"):
        plan_range(bootstrap, history.topic, second.bookmark, first.bookmark)


def test_as_of_a_list_stops_after_each_bookmark(bootstrap, history):
    point = history.points[0]
    as_of = plan_as_of(bootstrap, history.topic, point.bookmark)
    assert as_of.range.stops == point.end
    assert as_of.range.starts == dict.fromkeys(point.end, 0)


def test_one_bookmark_cuts_the_other_partitions_at_its_moment(bootstrap, topic_factory):
    topic = topic_factory(partitions=2, key=("/id",))
    producer = Producer(client_config(bootstrap))  # its log through Python logging

    def produce(partition: int) -> int:
        producer.produce(topic, b'{"id": 1}', partition=partition)
        assert producer.flush(10) == 0
        return now_ms()

    produce(1)
    wait_until(produce(0))  # partition 0's record is stamped before anything after this
    produce(1)
    as_of = plan_as_of(bootstrap, topic, f"{topic}|0|0|")
    assert as_of.range.stops == {0: 1, 1: 1}
    assert plan_range(bootstrap, topic, f"{topic}|0|0|").starts == {0: 1, 1: 1}


def test_the_cli_reports_errors_before_starting_spark(bootstrap, history, tmp_path):
    script = (
        "import sys\n"
        "from pyspark import SparkContext\n"
        "from amps_on_kafka.cli.spark import spark\n"
        "for args in (sys.argv[1:4], sys.argv[4:7]):\n"
        "    try:\n"
        "        spark.main([*args, '--out', sys.argv[7], '--bootstrap', sys.argv[8]],\n"
        "                   standalone_mode=False)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
        "print('spark started:', SparkContext._active_spark_context is not None)\n"
    )
    bad = f"{history.topic}|0|{history.points[1].end[0] + 5}|"
    args = ["sow", "no-such-topic-for-spark", "--as-of=0|1|", "export", history.topic]
    args += [f"--to={bad}", str(tmp_path / "out"), bootstrap]
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ClickException topic 'no-such-topic-for-spark' does not exist")
    assert lines[1].startswith(f"ClickException bookmark {bad} is past the end of the log")
    assert lines[2] == "spark started: False"
