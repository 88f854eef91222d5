"""Fixtures for the Spark pipeline: one small local SparkSession, and one log with history.

`history` publishes a SOW topic in two phases with a worker following it, and keeps the
worker's SOW after each phase with the bookmark and a time at which it stood. Those are
what every job here is compared with: the worker is the reference, the job must agree.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra (.[test,spark])")
from click.testing import CliRunner
from confluent_kafka import Producer

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.kafka import client_config, end_offsets
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor.worker import Worker, now_ms
from tests.conftest import create_topic, delete_topics
from tests.sow.conftest import wait_caught_up

PARTITIONS = 2
SHORT = 0.05  # seconds: an expiration that has certainly passed before the phase ends
FILTER = "/qty > 50"

Snapshot = dict[str, tuple[bytes, str]]  # sow key -> (payload, bookmark)


@pytest.fixture(scope="session")
def spark():
    """One session for the whole run: local[2], 2 shuffle partitions, no UI, no progress."""
    from amps_on_kafka.spark.session import spark_session

    with spark_session(
        "local[2]", app_name="amps-kafka-tests", shuffle_partitions=2, progress=False
    ) as session:
        yield session


@dataclass
class Point:
    """The worker's SOW as it stood at a bookmark (list) and at a time just after it."""

    bookmark: str
    time: str
    end: dict[int, int]
    sow: Snapshot
    filtered: Snapshot  # the SOW restricted to FILTER


@dataclass
class History:
    topic: str
    config_file: Path
    config: Config
    points: list[Point] = field(default_factory=list)


def write_config(topic: str, path: Path) -> Path:
    """The configuration the worker and the jobs share: Key /id, one hour by default."""
    path.write_text(
        f"Topics:\n  - Name: {topic}\n    Partitions: {PARTITIONS}\n"
        f"SOW:\n  - Topic: {topic}\n    Key: /id\n    Expiration: 1h\n"
    )
    return path


def run_cli(bootstrap: str, *args: str, exit_code: int = 0) -> str:
    """`amps-kafka spark ...` in this process, on the test session; its output."""
    from amps_on_kafka.cli.spark import spark as spark_cli

    result = CliRunner().invoke(
        spark_cli, [*args, "--bootstrap", bootstrap], catch_exceptions=False
    )
    assert result.exit_code == exit_code, result.output
    return result.output


def snapshot(worker: Worker, topic: str, filter_text: str | None = None) -> Snapshot:
    result = worker.engine.query(topic, compile_filter(filter_text) if filter_text else None)
    return {r.sow_key: (r.payload, r.bookmark) for r in result.records}


def wait_until(millis: int) -> None:
    """Let the clock pass a moment (expiration is about time; this synchronises nothing)."""
    while now_ms() <= millis:
        time.sleep(0.005)


@pytest.fixture(scope="session")
def history(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    """Shared by the Spark tests, which only read it (publishing more would move NOW)."""
    topic = f"spark-history-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, TopicSpec(topic, PARTITIONS, key=("/id",)))
    path = write_config(topic, tmp_path_factory.mktemp("config") / "config.yaml")
    result = History(topic, path, load_config(path))
    worker = Worker(
        result.config,
        bootstrap,
        tmp_path_factory.mktemp("history-worker"),
        group_id=f"g-{uuid.uuid4().hex[:8]}",
    )
    worker.start()
    try:
        worker.wait_ready()
        with Client(f"history-{uuid.uuid4().hex[:6]}") as client:
            client.connect(f"kafka://{bootstrap}")
            for phase in (_phase_one, _phase_two):
                phase(client, bootstrap, topic)
                result.points.append(_point(worker, bootstrap, topic))
        yield result
    finally:
        worker.stop()
        delete_topics(bootstrap, [topic])


def _point(worker: Worker, bootstrap: str, topic: str) -> Point:
    """Where the worker stands once caught up; the time is the next whole second."""
    wait_caught_up(worker, bootstrap, topic, PARTITIONS)
    end = end_offsets(bootstrap, topic)
    bookmark = ",".join(f"{topic}|{p}|{o - 1}|" for p, o in end.items() if o > 0)
    point = Point(bookmark, "", end, snapshot(worker, topic), snapshot(worker, topic, FILTER))
    second = (now_ms() // 1000 + 1) * 1000
    wait_until(second)  # the next phase is stamped after this time; this one before it
    point.time = datetime.fromtimestamp(second / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    return point


def _finish(client: Client, topic: str, tail: list[dict]) -> None:
    """Let the short expirations pass, then publish the records the phase ends with."""
    client.publish_flush(10)
    wait_until(now_ms() + round(SHORT * 1000) + 5)
    for doc in tail:
        if doc.pop("delta", False):
            client.delta_publish(topic, doc)
        else:
            client.publish(topic, doc)
    client.publish_flush(10)


def _phase_one(client: Client, bootstrap: str, topic: str) -> None:
    for i in range(40):
        client.publish(topic, {"id": i, "qty": i * 7 % 100, "sym": f"S{i % 4}"})
    for i in range(40, 45):
        client.publish(topic, {"id": i, "qty": 60}, expiration=SHORT)
    client.publish(topic, {"id": 45, "qty": 70}, expiration=0)  # never expires
    client.delta_publish(topic, {"id": 1, "qty": 99})
    client.delta_publish(topic, {"id": 13, "note": "merged"})
    client.delta_publish(topic, {"id": 46, "qty": 1})  # a delta with nothing to merge into
    client.sow_delete(topic, keys=["3", "4"])
    client.sow_delete(topic, "/sym = 'S2' AND /id < 20")
    client.publish(topic, {"id": 5, "qty": 55}, expiration=SHORT)  # an update, short-lived
    _finish(
        client,
        topic,
        [{"id": 40, "qty": 1, "delta": True}]  # a delta after expiry starts afresh
        + [{"id": i, "qty": 51, "sym": "S1"} for i in range(47, 53)],
    )


def _phase_two(client: Client, bootstrap: str, topic: str) -> None:
    client.delta_publish(topic, {"id": 1, "qty": 5})  # merges over the first delta
    client.delta_publish(topic, {"id": 7, "sym": "S9"})
    client.sow_delete(topic, "/qty > 90")
    client.sow_delete(topic, keys=["8"])
    for i in range(53, 56):
        client.publish(topic, {"id": i, "qty": 80}, expiration=SHORT)
    client.publish(topic, {"id": 9, "qty": 75}, expiration=0)
    client.publish(topic, {"id": 41, "qty": 65})  # back after it expired
    _bad_record(bootstrap, topic)
    _finish(
        client,
        topic,
        [{"id": 10, "qty": 52, "delta": True}] + [{"id": i, "qty": 30} for i in range(56, 62)],
    )


def _bad_record(bootstrap: str, topic: str) -> None:
    """A record whose envelope doesn't decode: the worker and the job must both skip it."""
    producer = Producer(client_config(bootstrap))  # its log through Python logging
    producer.produce(topic, b'{"id": 0}', partition=0, headers=[("c", b"bogus")])
    assert producer.flush(10) == 0
