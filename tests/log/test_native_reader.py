"""A replay read through the compiled reader (librdkafka's C API, log/native_reader.py)
gives what the same replay gives through confluent-kafka: the same messages, COMPLETED at
the same place, the same errors, over a real broker; and the reader's handle is let go.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from itertools import takewhile
from typing import Any

import pytest
from confluent_kafka import Producer

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log import replay as replay_module
from amps_on_kafka.log.kafka import LIBRDKAFKA_LOG, reader_config
from amps_on_kafka.log.message import COMPLETED, RECORD_BUILDER
from amps_on_kafka.log.native_reader import native_reader, text_settings
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.native import core

# Skipped only without the core (tests/native/test_core.py fails when it was not turned
# off): with it, a reader that can't be made (librdkafka not found) fails these tests.
compiled = pytest.mark.skipif(core is None, reason="no compiled core (AMPS_NATIVE=0)")


def produce(bootstrap: str, topic: str, records: list[tuple[int, Any, Any, Any]]) -> None:
    """(partition, key, value, headers) as any producer may write them."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, key, value, headers in records:
        producer.produce(topic, value, key, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def produce_committed(bootstrap: str, topic: str, partition: int) -> None:
    """One record in a transaction: its commit marker takes an offset no record has, so
    the end of that partition is reached by position, not by a record."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b'{"in": "transaction"}', partition=partition)
    producer.commit_transaction(30)


def name_not_utf8(bootstrap: str, topic: str) -> None:
    """A record whose header name is not UTF-8 (kcat can write one; Python's client can't)."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/bootstrap.sh installs it)")
    command = [kcat.encode(), b"-b", bootstrap.encode(), b"-t", topic.encode(), b"-P", b"-p", b"1"]
    subprocess.run([*command, b"-H", b"\xff\xfe=v"], input=b'{"id": 9}\n', check=True, timeout=30)


@pytest.fixture
def mixed(bootstrap, client, topic_factory) -> str:
    """Three partitions of every kind of record: our envelope, no headers, empty and
    missing payloads, a header without a value, a bad envelope header, a header name that
    is not UTF-8, not JSON, and a transaction's marker at a partition's end."""
    topic = topic_factory(3, key=("/id",))
    for i in range(40):
        client.publish(topic, {"id": i, "v": "x" * i})
    client.publish_flush(30)
    produce(
        bootstrap,
        topic,
        [
            (0, None, b'{"id": 100}', None),
            (1, b"k", b"", [("p", b"raw")]),
            (2, None, None, [("h", None)]),
            (0, b"k2", b'{"id": 101', [("e", b"soon")]),
            (1, None, b'{"id": 102}', [("c", b"nonsense"), ("c", b"twice")]),
        ],
    )
    name_not_utf8(bootstrap, topic)
    produce_committed(bootstrap, topic, 2)
    return topic


def _outcome(read: Any) -> Any:
    """What reading something gives: its value, or its error's type and text."""
    try:
        return read()
    except (MessageError, UnicodeDecodeError) as exc:
        return (type(exc).__name__, str(exc))


def described(item: Any) -> Any:
    """Everything a reader can ask of a replayed message."""
    if item is COMPLETED:
        return "COMPLETED"
    return (
        item.topic,
        item.partition,
        item.offset,
        item.timestamp,
        item.raw,
        item.bookmark,
        type(item).__name__,
        _outcome(lambda: item.headers),
        _outcome(lambda: item.data),
        _outcome(lambda: item.command),
        _outcome(lambda: item.sow_key),
        _outcome(lambda: item.expiration),
        item._record.key(),
        item._record.timestamp(),
    )


def read_all(bootstrap: str, topic: str, monkeypatch, native: bool, **options) -> list:
    """The replay's items to its COMPLETED and a quiet second after, read either way."""
    if not native:
        monkeypatch.setattr(replay_module, "native_reader", lambda config: None)
    with Replay(bootstrap, topic, "0", max_idle=1.0, **options) as replay:
        assert (replay._native is not None) is native
        return [described(item) for item in replay]


def by_partition(items: list) -> dict:
    """The items of each partition in the order read (partitions interleave as fetched),
    and where COMPLETED came."""
    partitions: dict = {}
    for item in items:
        key = "COMPLETED" if item == "COMPLETED" else item[:2]
        partitions.setdefault(key, []).append(item)
    partitions["COMPLETED at"] = [i for i, item in enumerate(items) if item == "COMPLETED"]
    return partitions


@compiled
@pytest.mark.parametrize("batch_size", [500, 3])
def test_a_replay_reads_alike_through_either_reader(bootstrap, mixed, monkeypatch, batch_size):
    native = read_all(bootstrap, mixed, monkeypatch, True, batch_size=batch_size)
    twin = read_all(bootstrap, mixed, monkeypatch, False, batch_size=batch_size)
    assert by_partition(native) == by_partition(twin)
    assert len(native) == 40 + 5 + 1 + 1 + 1  # every record, and COMPLETED once
    assert native[-1] == "COMPLETED"  # after the transaction's marker too
    assert [d[7][0] for d in native if isinstance(d[7], tuple)] == ["EnvelopeError"]


@compiled
def test_a_replay_of_several_topics_reads_alike(
    bootstrap, client, mixed, topic_factory, monkeypatch
):
    """Several topics: no one codec, so the compiled reader's records are built one by one."""
    other = topic_factory(2)
    client.publish(other, {"id": "other"})
    client.publish_flush(30)
    pattern = f"({mixed}|{other})"
    native = read_all(bootstrap, pattern, monkeypatch, True)
    twin = read_all(bootstrap, pattern, monkeypatch, False)
    assert by_partition(native) == by_partition(twin)
    assert len(native) == 40 + 5 + 1 + 1 + 1 + 1
    assert native[-1] == "COMPLETED"


@compiled
def test_a_message_kept_after_its_replay_closed_still_reads(bootstrap, mixed):
    """A message keeps its record (and the handle) alive: its headers are read after."""
    with Replay(bootstrap, mixed, "0", max_idle=1.0) as replay:
        assert replay._native is not None
        kept = [item for item in replay if item is not COMPLETED]
    headers = [_outcome(lambda m=m: m.headers) for m in kept]
    assert sum(isinstance(h, list) for h in headers) == 40 + 4  # the others have none, or bad
    assert [h[0] for h in headers if isinstance(h, tuple)] == ["EnvelopeError"]
    assert len(kept) == 40 + 5 + 1 + 1


def tasks() -> int:
    """This process's threads, librdkafka's included."""
    return len(os.listdir("/proc/self/task"))


@compiled
def test_replays_leave_no_threads_behind(bootstrap, client, topic_factory):
    topic = topic_factory(2)
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    Replay(bootstrap, topic, "0", max_idle=0.1).close()  # librdkafka's own first-use threads
    before = tasks()
    for _ in range(15):  # each read to COMPLETED, right after the last record: no idle wait
        with Replay(bootstrap, topic, "0", max_idle=10) as replay:
            assert replay._native is not None
            kept = list(takewhile(lambda item: item is not COMPLETED, replay))
        assert len(kept) == 1
        del kept, replay  # the last record, and the reader, let the handle go
    assert tasks() <= before


@compiled
def test_a_replay_closed_while_another_thread_waits_in_it_ends_that_thread(
    bootstrap, client, topic_factory
):
    topic = topic_factory(1)
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    replay = Replay(bootstrap, topic, "0")  # no max_idle: waits for records for ever
    assert replay._native is not None
    items: list[Any] = []
    ended: list[BaseException] = []
    completed = threading.Event()  # its message and COMPLETED read: now it waits

    def follow() -> None:
        try:
            for item in replay:
                items.append(item)
                if item is COMPLETED:
                    completed.set()
        except RuntimeError as exc:  # as confluent-kafka's closed consumer raises
            ended.append(exc)

    follower = threading.Thread(target=follow)
    follower.start()
    completed.wait(30)
    replay.close()
    follower.join(10)
    assert not follower.is_alive()
    assert [str(e) for e in ended] == ["the reader is closed"]
    assert items[1] is COMPLETED


@compiled
def test_the_reader_of_an_unreachable_broker_waits_no_longer_than_asked():
    """No broker at all (as when it stopped): each read waits its timeout and gives
    nothing; closing does not hang."""
    reader = native_reader(reader_config("127.0.0.1:1"))
    assert reader is not None
    reader.assign([("t", 0, 0)])
    started = time.monotonic()
    for _ in range(3):
        assert len(reader.consume(500, 0.2, RECORD_BUILDER, None)) == 0
    assert time.monotonic() - started < 5
    reader.close()
    with pytest.raises(RuntimeError, match="the reader is closed"):
        reader.consume(500, 0.2, RECORD_BUILDER, None)


def test_settings_are_passed_as_confluent_kafka_passes_them(caplog):
    config = {"a": True, "b": False, "c": 100, "d": "x", "logger": LIBRDKAFKA_LOG}
    assert text_settings(config) == [("a", "true"), ("b", "false"), ("c", "100"), ("d", "x")]
    assert text_settings({**config, "error_cb": print}) is None  # a callback: confluent-kafka
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.logger.name)
    assert text_settings(config) is None  # its log lines are wanted: confluent-kafka's reader


@compiled
def test_a_setting_librdkafka_refuses_leaves_the_replay_to_confluent_kafka():
    assert native_reader({**reader_config("127.0.0.1:1"), "no.such.setting": "1"}) is None
