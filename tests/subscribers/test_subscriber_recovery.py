"""Subscribers that never lose their place, against the real broker (seeds 003, 004)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from amps_on_kafka import MOST_RECENT, NOW
from amps_on_kafka.client import LoggedBookmarkStore, MemoryBookmarkStore
from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.log.publisher import LogPublisher
from tests.subscribers.conftest import until_completed

CRASH_SUBSCRIBER = Path(__file__).with_name("crash_subscriber.py")


def numbers(messages) -> list[int]:
    return [m.data["n"] for m in messages]


def test_most_recent_with_nothing_stored_replays_from_epoch(client, filled):
    """Seed 004: "If there is no record of a subscription, the AMPS clients will start
    with EPOCH"."""
    topic = filled(20)
    client.set_bookmark_store(MemoryBookmarkStore())
    with client.bookmark_subscribe(topic, MOST_RECENT) as stream:
        assert numbers(until_completed(stream)) == list(range(20))


def test_most_recent_needs_a_bookmark_store(client, filled):
    """Seed 004: MOST_RECENT is the client library's to resolve; the log never sees it."""
    topic = filled(1)
    with pytest.raises(InvalidBookmark, match="bookmark store"):
        client.bookmark_subscribe(topic, MOST_RECENT)


def test_most_recent_resumes_after_the_last_discarded_message(client, filled, tmp_path):
    """Seed 004: the subscription "begins at the last processed message, and the
    application receives the next unprocessed message"."""
    topic = filled(30, partitions=2)
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="resume") as stream:
            for message in until_completed(stream):
                if message.data["n"] < 12:
                    client.discard(message)
        recovery = store.get_most_recent("resume")
    assert recovery.count(",") == 1  # one bookmark per partition
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="resume") as stream:
            assert sorted(numbers(until_completed(stream))) == list(range(12, 30))


def test_message_discard_and_client_discard_move_the_same_recovery_point(client, filled):
    topic = filled(4)
    store = MemoryBookmarkStore()
    client.set_bookmark_store(store)
    with client.bookmark_subscribe(topic, "0", sub_id="both") as stream:
        first, second, *_ = until_completed(stream)
    assert first.sub_id == "both"
    first.discard()
    assert store.get_most_recent("both") == first.bookmark
    client.discard(second)
    assert store.get_most_recent("both") == second.bookmark


def test_a_sub_id_can_be_open_once(client, filled):
    topic = filled(1)
    with client.bookmark_subscribe(topic, "0") as stream:
        assert stream.sub_id == topic  # the default: the topic (and the filter, if any)
        with pytest.raises(ValueError, match="open already"):
            client.bookmark_subscribe(topic, "0")
    client.bookmark_subscribe(topic, "0").close()  # closed: the name is free again


def test_a_now_subscription_recovers_at_its_start_not_at_epoch(client, filled, tmp_path):
    """A subscriber that started at NOW and died before its first message must not come
    back with MOST_RECENT at EPOCH (the store keeps where it started)."""
    topic = filled(10)
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        client.bookmark_subscribe(topic, NOW, sub_id="late").close()
    client.publish(topic, {"id": 1, "n": 10})
    client.publish_flush(10)
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="late") as stream:
            assert numbers(until_completed(stream)) == [10]


def test_moving_windows_resume_with_only_the_windows_still_open(client, topic_factory, tmp_path):
    """Seed 003's moving windows: after a restart the subscriber gets the messages of the
    windows that were open, and none of a closed window, even those that arrived after
    open ones; messages published while it was down come too."""
    topic = topic_factory(2, key=("/id",))
    trades = [{"id": n, "n": n, "window": n % 3} for n in range(30)]  # windows interleave
    for trade in trades:
        client.publish(topic, trade)
    client.publish_flush(10)
    path = tmp_path / "windows.log"
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="windows") as stream:
            received = until_completed(stream)
        for message in received:
            if message.data["window"] == 1:  # window 1 fills and is computed first
                message.discard()
    # the subscriber dies here with windows 0 and 2 open
    for n in range(30, 33):
        client.publish(topic, {"id": n, "n": n, "window": 3})
    client.publish_flush(10)
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="windows") as stream:
            again = until_completed(stream)
    windows = sorted(m.data["window"] for m in again)
    assert windows == [0] * 10 + [2] * 10 + [3] * 3
    assert len({m.bookmark for m in again}) == len(again)


def test_duplicate_publishes_are_dropped_seed_example(client, topic_factory, bootstrap):
    """Seed 003: sequence numbers 1000 and 1002 followed by 999 from one publisher: the
    subscriber must discard 999 (Kafka delivers all three)."""
    topic = topic_factory(1)
    publisher = LogPublisher(bootstrap, "failed-over-publisher")
    for sequence in (1000, 1002, 999, 1002, 1003):
        publisher.publish(topic, {"s": sequence}, sequence=sequence)
    publisher.flush(10)
    with client.bookmark_subscribe(topic, "0", sub_id="raw") as stream:
        assert len(until_completed(stream)) == 5
    client.set_bookmark_store(MemoryBookmarkStore())
    with client.bookmark_subscribe(topic, "0", sub_id="deduped") as stream:
        delivered = until_completed(stream)
    assert [m.sequence for m in delivered] == [1000, 1002, 1003]
    assert {m.publisher_id for m in delivered} == {"failed-over-publisher"}


def test_duplicate_detection_holds_across_a_restart_with_the_logged_store(
    client, topic_factory, bootstrap, tmp_path
):
    topic = topic_factory(1)
    publisher = LogPublisher(bootstrap, "restarting-publisher")
    publisher.publish(topic, {"s": 1000}, sequence=1000)
    publisher.flush(10)
    path = tmp_path / "dedupe.log"
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="d") as stream:
            (first,) = until_completed(stream)
            first.discard()
    publisher.publish(topic, {"s": 1000}, sequence=1000)  # republished after a failover
    publisher.publish(topic, {"s": 1001}, sequence=1001)
    publisher.flush(10)
    with LoggedBookmarkStore(path) as store:
        client.set_bookmark_store(store)
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="d") as stream:
            assert [m.sequence for m in until_completed(stream)] == [1001]


def run_subscriber(bootstrap: str, topic: str, folder: Path, kill_after: int) -> int:
    command = [
        sys.executable,
        str(CRASH_SUBSCRIBER),
        bootstrap,
        topic,
        str(folder / "subscriber.log"),
        str(folder / "processed.txt"),
        "10",
        str(kill_after),
    ]
    return subprocess.run(command, timeout=120, capture_output=True).returncode


def test_a_subscriber_killed_mid_stream_gets_every_message_exactly_once(
    client, filled, bootstrap, tmp_path
):
    """Seed 003: with a disk-backed store, a subscriber killed (SIGKILL) in the middle of
    out-of-order processing and restarted with MOST_RECENT loses nothing and processes
    nothing twice - including what was published while it was down."""
    topic = filled(100, partitions=2)
    assert run_subscriber(bootstrap, topic, tmp_path, kill_after=37) == -signal.SIGKILL
    before = [int(line) for line in (tmp_path / "processed.txt").read_text().split()]
    assert len(before) == 37 and before != sorted(before)  # killed mid-window
    for n in range(100, 120):
        client.publish(topic, {"id": n % 10, "n": n})
    client.publish_flush(10)
    assert run_subscriber(bootstrap, topic, tmp_path, kill_after=-1) == 0
    processed = [int(line) for line in (tmp_path / "processed.txt").read_text().split()]
    assert sorted(processed) == list(range(120))


def test_a_stream_without_a_store_delivers_everything_again(client, filled):
    """The stores are opt-in: without one, a bookmark replay is exactly the log."""
    topic = filled(5)
    for _ in range(2):
        with client.bookmark_subscribe(topic, "0") as stream:
            assert numbers(until_completed(stream)) == list(range(5))
    assert client.bookmark_store is None
