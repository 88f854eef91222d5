"""Publish stores: publishers that lose nothing, and whose republished copies subscribers
drop (seed 003, "Publisher Failures and Duplicate Detection")."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from amps_on_kafka.client import FilePublishStore, MemoryBookmarkStore, MemoryPublishStore
from amps_on_kafka.client.publish_store import StoredPublish
from amps_on_kafka.log.bookmarks import watermarks
from amps_on_kafka.log.kafka import partitions_of, reader
from tests.subscribers.conftest import until_completed

CRASH_PUBLISHER = Path(__file__).with_name("crash_publisher.py")


def entry(sequence: int, data=None) -> StoredPublish:
    return StoredPublish(sequence, "publish", "orders", data or {"n": sequence})


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_store_keeps_what_kafka_has_not_acknowledged_in_order(kind, tmp_path):
    store = MemoryPublishStore() if kind == "memory" else FilePublishStore(tmp_path / "p")
    for sequence in (5, 3, 9, 7):
        store.store(entry(sequence))
    assert store.discard_up_to(5) == 2
    assert [e.sequence for e in store.unpersisted()] == [7, 9]
    assert store.last_sequence() == 9
    store.close()


def test_a_file_store_survives_the_publisher_and_is_compacted_on_open(tmp_path):
    path = tmp_path / "publishes"
    store = FilePublishStore(path)
    store.claim("feed")
    for sequence in range(1, 101):
        store.store(entry(sequence))
    store.store(StoredPublish(101, "sow_delete", "orders", None, None, {"keys": ["1", "2"]}))
    store.store(StoredPublish(102, "publish", "blobs", b"\x00\xffraw", 30.0))
    store.discard_up_to(98)
    grown = path.stat().st_size  # never closed: as after a crash
    reopened = FilePublishStore(path)
    assert [e.sequence for e in reopened.unpersisted()] == [99, 100, 101, 102]
    assert reopened.unpersisted()[2].options == {"keys": ["1", "2"]}
    assert reopened.unpersisted()[3].data == b"\x00\xffraw"
    assert reopened.unpersisted()[3].expiration == 30.0
    assert path.stat().st_size < grown / 10
    reopened.close()


def test_a_file_store_ignores_an_entry_torn_by_a_crash(tmp_path):
    path = tmp_path / "publishes"
    store = FilePublishStore(path)
    store.store(entry(1))
    store.close()
    with path.open("ab") as out:
        out.write(b'+ {"s":2,"c":"pub')
    assert [e.sequence for e in FilePublishStore(path).unpersisted()] == [1]


def test_a_publish_store_belongs_to_one_publisher(tmp_path):
    """Republishing under another name would defeat subscribers' duplicate detection."""
    path = tmp_path / "publishes"
    FilePublishStore(path).claim("feed-a")
    store = FilePublishStore(path)
    store.claim("feed-a")
    with pytest.raises(ValueError, match="belongs to publisher 'feed-a'"):
        store.claim("feed-b")


def wait_for_records(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> None:
    """Until the log holds `count` records (Kafka acknowledged them to their producer)."""
    consumer = reader(bootstrap)
    try:
        partitions = [(topic, p) for p in partitions_of(consumer, topic)]
        deadline = time.monotonic() + timeout
        while sum(m.high for m in watermarks(consumer, partitions).values()) < count:
            assert time.monotonic() < deadline, f"the log never reached {count} records"
    finally:
        consumer.close()


def publisher(bootstrap: str, topic: str, store: Path, first: int, flushed: int, last: int):
    command = [sys.executable, str(CRASH_PUBLISHER), bootstrap, topic, str(store)]
    return subprocess.Popen(
        [*command, str(first), str(flushed), str(last)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_publisher_killed_mid_stream_loses_nothing_and_duplicates_are_dropped(
    client, topic_factory, bootstrap, tmp_path
):
    """A publisher killed (SIGKILL) with publishes Kafka had not acknowledged to it
    restarts with its FilePublishStore: everything in the store is published again with
    its ORIGINAL publisher id and sequence, so nothing is lost, and the copies that did
    reach Kafka before the kill are duplicates the subscriber's bookmark store drops."""
    topic = topic_factory(2, key=("/id",))
    store = tmp_path / "publisher.store"
    first_run = publisher(bootstrap, topic, store, 0, 100, 200)
    assert first_run.stdout.readline().strip() == "published"
    wait_for_records(bootstrap, topic, 180)  # 100..179 are in Kafka, and still in the store
    first_run.communicate("go\n", timeout=60)
    assert first_run.returncode == -signal.SIGKILL
    with FilePublishStore(store) as kept:
        assert len(kept) == 100  # 100..199: produced, never acknowledged to the publisher
    second_run = publisher(bootstrap, topic, store, 200, 300, 300)
    second_run.communicate(timeout=60)
    assert second_run.returncode == 0

    with client.bookmark_subscribe(topic, "0", sub_id="raw") as stream:
        raw = until_completed(stream)
    copies = Counter((m.publisher_id, m.sequence, m.data["n"]) for m in raw)
    assert len(raw) > 300 and max(copies.values()) == 2  # republished with the same number
    assert {m.data["n"] for m in raw} == set(range(300))

    client.set_bookmark_store(MemoryBookmarkStore())
    with client.bookmark_subscribe(topic, "0", sub_id="deduped") as stream:
        delivered = [m.data["n"] for m in until_completed(stream)]
    assert sorted(delivered) == list(range(300))
    with FilePublishStore(store) as kept:
        assert len(kept) == 0
