"""Bookmark subscriptions against the real broker: every bookmark form of seed 004."""

import gc
import time
from collections import defaultdict
from datetime import UTC, datetime

import pytest

from amps_on_kafka import NOW
from amps_on_kafka.errors import InvalidBookmark, UnknownTopic
from amps_on_kafka.log import replay as replay_module
from amps_on_kafka.log.controls import TICK
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.replay import BATCH_SIZE, Replay
from amps_on_kafka.native import core

COUNT = 200


def drain(stream):
    """Messages up to the completed marker; the stream is closed afterwards."""
    messages = []
    with stream:
        for message in stream:
            if message is COMPLETED:
                return messages
            messages.append(message)
    raise AssertionError("stream ended without a completed marker")


@pytest.fixture
def orders(client, topic_factory):
    """A 4-partition topic keyed by /id, with COUNT published and persisted messages."""
    topic = topic_factory(partitions=4, key=("/id",))
    for i in range(COUNT):
        client.publish(topic, {"id": i % 50, "n": i})
    client.publish_flush(30)
    return topic


def test_epoch_replays_every_message_once_in_per_partition_order(client, orders):
    messages = drain(client.bookmark_subscribe(orders, "0"))
    assert sorted(m.data["n"] for m in messages) == list(range(COUNT))
    by_partition = defaultdict(list)
    for m in messages:
        by_partition[m.partition].append(m)
    assert len(by_partition) == 4
    for items in by_partition.values():
        assert [m.offset for m in items] == list(range(len(items)))
        assert [m.data["n"] for m in items] == sorted(m.data["n"] for m in items)


def test_messages_carry_bookmark_timestamp_sow_key_and_publisher(client, orders):
    first = drain(client.bookmark_subscribe(orders, "0"))[0]
    assert first.bookmark == f"{orders}|{first.partition}|{first.offset}|"
    assert first.sow_key == str(first.data["id"])
    assert first.publisher_id == client.name
    assert first.sequence > 0
    assert abs(first.timestamp / 1000 - time.time()) < 120
    assert first.expiration is None


def test_the_same_sow_key_always_lands_in_the_same_partition(client, orders):
    partitions = defaultdict(set)
    for m in drain(client.bookmark_subscribe(orders, "0")):
        partitions[m.sow_key].add(m.partition)
    assert all(len(p) == 1 for p in partitions.values())


def test_sequences_rise_per_publisher(client, orders):
    messages = sorted(drain(client.bookmark_subscribe(orders, "0")), key=lambda m: m.data["n"])
    sequences = [m.sequence for m in messages]
    assert sequences == sorted(sequences) and len(set(sequences)) == COUNT


def test_now_delivers_only_what_is_published_after_the_subscription(client, orders):
    with client.bookmark_subscribe(orders, "0|1|", timeout=10) as stream:
        assert next(stream) is COMPLETED
        client.publish(orders, {"id": 1, "n": "after"})
        client.publish_flush(10)
        live = next(stream)
    assert live.data == {"id": 1, "n": "after"}


def test_a_message_bookmark_starts_after_that_message_in_its_partition(client, orders):
    everything = drain(client.bookmark_subscribe(orders, "0"))
    pick = next(m for m in everything if m.partition == 2 and m.offset == 3)
    replayed = drain(client.bookmark_subscribe(orders, pick.bookmark))
    in_partition_2 = [m.offset for m in replayed if m.partition == 2]
    assert in_partition_2[0] == 4
    others = [m for m in replayed if m.partition != 2]
    expected_others = [m for m in everything if m.partition != 2]
    assert len(others) == len(expected_others)  # unnamed partitions start at EPOCH


def test_a_list_names_one_position_per_partition(client, orders):
    everything = drain(client.bookmark_subscribe(orders, "0"))
    last = {}
    for m in everything:
        if m.offset == 1:
            last[m.partition] = m.bookmark
    replayed = drain(client.bookmark_subscribe(orders, ",".join(last.values())))
    assert len(replayed) == len(everything) - 2 * 4
    assert all(m.offset >= 2 for m in replayed)


def test_in_a_list_the_oldest_bookmark_of_a_partition_wins(client, orders):
    newer, older = f"{orders}|0|5|", f"{orders}|0|2|"
    replayed = drain(client.bookmark_subscribe(orders, f"{newer},{older}"))
    assert min(m.offset for m in replayed if m.partition == 0) == 3


def test_a_timestamp_replays_what_came_at_or_after_that_second(client, orders):
    client.publish(orders, {"id": 7, "n": "late"})
    client.publish_flush(10)
    everything = drain(client.bookmark_subscribe(orders, "0"))
    late = next(m for m in everything if m.data["n"] == "late")
    second = late.timestamp // 1000
    bookmark = datetime.fromtimestamp(second, UTC).strftime("%Y%m%dT%H%M%SZ")
    replayed = drain(client.bookmark_subscribe(orders, bookmark))
    expected = {m.bookmark for m in everything if m.timestamp >= second * 1000}
    assert {m.bookmark for m in replayed} == expected
    assert late.bookmark in expected


def test_a_timestamp_after_the_last_message_means_the_end(client, orders):
    assert drain(client.bookmark_subscribe(orders, "29991231T000000Z")) == []


def test_until_stops_at_a_bookmark(client, orders):
    everything = drain(client.bookmark_subscribe(orders, "0"))
    stop = next(m for m in everything if m.partition == 1 and m.offset == 4)
    with client.bookmark_subscribe(orders, "0", until=stop.bookmark) as stream:
        got = [m for m in stream if m is not COMPLETED]
    assert max(m.offset for m in got if m.partition == 1) == 4
    assert len(got) == len(everything) - (sum(1 for m in everything if m.partition == 1) - 5)


def test_a_filter_selects_messages_on_replay(client, orders):
    replayed = drain(client.bookmark_subscribe(orders, "0", "/id = 7"))
    assert {m.data["id"] for m in replayed} == {7}
    assert len(replayed) == COUNT // 50


def test_a_topic_regex_replays_several_topics(client, topic_factory):
    prefix = f"rx{int(time.time() * 1000)}"
    a = topic_factory(name=f"{prefix}.a")
    b = topic_factory(name=f"{prefix}.b")
    client.publish(a, {"t": "a"})
    client.publish(b, {"t": "b"})
    client.publish_flush(10)
    replayed = drain(client.bookmark_subscribe(f"{prefix}\\..*", "0"))
    assert sorted(m.topic for m in replayed) == [a, b]


@pytest.mark.parametrize(
    ("make_bookmark", "complaint"),
    [
        (lambda t: "garbage", "malformed bookmark"),
        (lambda t: f"{t}|9|0|", "partition 9"),
        (lambda t: "someothertopic|0|0|", "does not cover"),
        (lambda t: f"{t}|0|999999|", "past the end"),
        (lambda t: "20150102T123500+01", "malformed bookmark"),
    ],
)
def test_bad_bookmarks_are_clear_errors_before_any_message(
    client, orders, make_bookmark, complaint
):
    with pytest.raises(InvalidBookmark, match=complaint):
        client.bookmark_subscribe(orders, make_bookmark(orders))


def test_a_bookmark_that_retention_removed_is_an_error(client, bootstrap, topic_factory):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = topic_factory(partitions=1)
    for i in range(10):
        client.publish(topic, {"n": i})
    client.publish_flush(10)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, 0, 6)])
    for future in futures.values():
        future.result(10)
    with pytest.raises(InvalidBookmark, match="retention removed"):
        client.bookmark_subscribe(topic, f"{topic}|0|2|")
    assert [m.offset for m in drain(client.bookmark_subscribe(topic, f"{topic}|0|5|"))] == [
        6,
        7,
        8,
        9,
    ]
    assert [m.offset for m in drain(client.bookmark_subscribe(topic, "0"))] == [6, 7, 8, 9]


def test_unknown_topics_are_errors_for_publish_and_replay(client):
    with pytest.raises(UnknownTopic, match="does not exist"):
        client.publish("no-such-topic-here", {"id": 1})
    with pytest.raises(UnknownTopic):
        client.bookmark_subscribe("no-such-topic-here", "0")


def test_a_filtered_replay_wakes_its_follower_and_ticks_end_at_until(bootstrap, orders):
    """max_idle counts what is yielded: a batch the filter drops entirely ends an iteration
    (Replay.ticking() then ticks, so a next(timeout) wakes), and a replay bounded by
    `until` ends its ticks once it is finished instead of ticking for ever."""
    replay = Replay(
        bootstrap, orders, "0", predicate=lambda data: False, until=NOW, max_idle=0, batch_size=1
    )
    with replay:
        items = list(replay.ticking())
    assert TICK in items
    assert [item for item in items if item is not TICK] == [COMPLETED]
    assert replay.finished


@pytest.mark.parametrize("predicate", [None, lambda data: data["id"] % 3 == 0])
def test_small_batches_deliver_what_one_read_delivers(bootstrap, orders, predicate):
    """A batch that holds no end of the replay is built in one call (with or without a
    filter); one that does is read record by record. Either way: every (matching) record
    once, in partition order, and COMPLETED once, after the last of them."""

    def replayed(batch_size: int) -> list:
        with Replay(
            bootstrap, orders, "0", predicate=predicate, max_idle=30, batch_size=batch_size
        ) as replay:
            items = []
            for item in replay:
                items.append(item)
                if item is COMPLETED:
                    break
        assert items[-1] is COMPLETED and COMPLETED not in items[:-1]
        return [(m.partition, m.offset, m.data["n"]) for m in items[:-1]]

    small, whole = replayed(7), replayed(10_000)
    assert len(small) == (COUNT if predicate is None else 68)
    assert sorted(small) == sorted(whole)
    for partition in range(4):
        offsets = [offset for p, offset, _ in small if p == partition]
        assert offsets == sorted(offsets)


@pytest.mark.parametrize("compiled", [False, True], ids=["confluent-kafka", "compiled"])
def test_a_replay_reads_in_batches_the_collector_does_not_see(
    client, bootstrap, topic_factory, monkeypatch, compiled
):
    """confluent-kafka's consumed records are objects the cyclic collector tracks: read 500
    at a time (BATCH_SIZE), each batch is freed before the collector's count reaches its
    first threshold, so a replay starts next to no collections; 5,000 at a time start
    several a batch (docs/performance.md, the replay's fourth round). The compiled
    reader's records become Python objects one at a time, as they are read: neither size
    starts collections."""
    if not compiled:
        monkeypatch.setattr(replay_module, "native_reader", lambda config: None)
    elif core is None:
        pytest.skip("no compiled core (AMPS_NATIVE=0)")
    topic = topic_factory(partitions=1)
    for i in range(5_000):
        client.publish(topic, {"n": i})
    client.publish_flush(30)

    def collections_while_read(batch_size: int) -> int:
        started = []

        def count(phase: str, info: dict) -> None:
            if phase == "start":
                started.append(info["generation"])

        with Replay(bootstrap, topic, "0", max_idle=30, batch_size=batch_size) as replay:
            assert (replay._native is not None) is compiled
            gc.callbacks.append(count)
            try:
                read = 0
                for item in replay:
                    if item is COMPLETED:
                        break
                    read += bool(item.data)
            finally:
                gc.callbacks.remove(count)
        assert read == 5_000
        return len(started)

    assert gc.get_threshold()[0] * 3 // 4 >= BATCH_SIZE  # room for what else a batch makes
    default, large = collections_while_read(BATCH_SIZE), collections_while_read(5_000)
    if compiled:
        assert default <= 2 and large <= 2, (default, large)
    else:
        assert default <= 2 < large, (default, large)
