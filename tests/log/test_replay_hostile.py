"""A replay through the compiled reader (log/native_reader.py) under what an operator or an
attacker can do to it: its topic deleted while it reads, a replay dropped without close,
many at once in threads, records with huge or very many headers, a start past the end,
and many replays one after another: the same answers as confluent-kafka's reader, and no
handle, thread or memory left behind.
"""

from __future__ import annotations

import gc
import threading
from itertools import takewhile
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.errors import UnknownTopic
from amps_on_kafka.log import replay as replay_module
from amps_on_kafka.log.kafka import reader_config
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.native_reader import loaded_library, native_reader, text_settings
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.native import core
from tests.log.test_native_reader import compiled, described, produce, tasks


def _both(monkeypatch, read) -> tuple[Any, Any]:
    """`read()` through the compiled reader, then through confluent-kafka's."""
    native = read()
    with monkeypatch.context() as patched:
        patched.setattr(replay_module, "native_reader", lambda config: None)
        twin = read()
    return native, twin


def _outcome(bootstrap: str, topic: str, bookmark: str = "0") -> Any:
    try:
        with Replay(bootstrap, topic, bookmark, max_idle=0.5) as replay:
            return [described(item) for item in replay]
    except Exception as exc:
        return (type(exc).__name__, str(exc))


@compiled
def test_huge_and_very_many_headers_read_alike(bootstrap, topic_factory, monkeypatch):
    topic = topic_factory(1)
    many = [(f"h{i}", str(i).encode()) for i in range(10_000)]
    produce(
        bootstrap,
        topic,
        [(0, None, b'{"id": 1}', [("big", b"x" * 900_000)]), (0, None, b'{"id": 2}', many)],
    )
    native, twin = _both(monkeypatch, lambda: _outcome(bootstrap, topic))
    assert native == twin
    assert len(native) == 3 and native[-1] == "COMPLETED"


@compiled
def test_a_start_past_the_end_reads_alike(bootstrap, client, topic_factory, monkeypatch):
    topic = topic_factory(1)
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    for bookmark in (f"{topic}|0|5|", "29991231T000000Z", "0|1|"):
        native, twin = _both(monkeypatch, lambda b=bookmark: _outcome(bootstrap, topic, b))
        assert native == twin, bookmark


@compiled
def test_a_topic_deleted_while_it_is_followed_ends_the_stream_naming_it(
    bootstrap, client, topic_factory, monkeypatch
):
    """librdkafka waits for good on a deleted topic's partitions: the replay asks Kafka
    while its polls are empty (log/replay_watch.py) and ends with UnknownTopic, long
    before the stream's own idle timeout, through either reader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def read() -> list:
        topic = topic_factory(1)
        client.publish(topic, {"id": 1})
        client.publish_flush(30)
        items: list = []
        stream = client.bookmark_subscribe(topic, "0", timeout=30)
        with stream, pytest.raises(UnknownTopic) as raised:  # not the end of a quiet stream
            for item in stream:
                items.append("COMPLETED" if item is COMPLETED else item.data)
                if item is COMPLETED:
                    admin.delete_topics([topic])[topic].result(30)
        assert f"topic {topic!r} was deleted while it was replayed" in str(raised.value)
        return items

    for items in _both(monkeypatch, read):
        assert items == [{"id": 1}, "COMPLETED"]


@compiled
def test_a_replay_dropped_without_close_lets_its_threads_go(bootstrap, client, topic_factory):
    topic = topic_factory(1)
    client.publish(topic, {"id": 1})
    client.publish_flush(30)
    Replay(bootstrap, topic, "0", max_idle=0.1).close()
    gc.collect()
    before = tasks()
    for _ in range(5):
        replay = Replay(bootstrap, topic, "0", max_idle=0.1)
        assert replay._native is not None
        first = next(iter(replay))
        assert first is not COMPLETED
        del replay, first  # never closed
    gc.collect()
    assert tasks() <= before


@compiled
def test_many_replays_in_threads_at_once(bootstrap, client, topic_factory):
    topic = topic_factory(3)
    for i in range(300):
        client.publish(topic, {"id": i})
    client.publish_flush(30)
    counts: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with Replay(bootstrap, topic, "0", max_idle=0.5) as replay:
                assert replay._native is not None
                counts.append(sum(item is not COMPLETED for item in replay))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert counts == [300] * 12


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@compiled
def test_repeated_replays_keep_memory_flat(bootstrap, topic_factory):
    """Each replay reads 2 MB: a record or a handle kept would show at once."""
    topic = topic_factory(1)
    produce(bootstrap, topic, [(0, None, b'{"pad": "%s"}' % (b"p" * 2000), None)] * 1000)

    def replay_once() -> None:  # to COMPLETED, right after the last record: no idle wait
        with Replay(bootstrap, topic, "0", max_idle=10) as replay:
            assert sum(1 for _ in takewhile(lambda item: item is not COMPLETED, replay)) == 1000

    for _ in range(3):
        replay_once()
    gc.collect()
    before = _rss_kib()
    for _ in range(10):
        replay_once()
    gc.collect()
    assert _rss_kib() - before < 10_000  # KiB: half of what the records read would hold


@compiled
def test_a_reader_without_a_group_id_is_refused_not_a_crash():
    """librdkafka's consumer without a group.id has no consumer queue: the reader is
    refused (the replay would read through confluent-kafka), not made to crash later."""
    settings = [(k, v) for k, v in text_settings(reader_config("127.0.0.1:1")) if k != "group.id"]
    with pytest.raises(ValueError, match=r"group\.id"):
        core.RdReader(loaded_library(), confluent_kafka.libversion()[1], settings)
    assert native_reader({"bootstrap.servers": "127.0.0.1:1"}) is None
