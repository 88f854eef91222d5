"""The queue engine against a real broker and RocksDB: delivery, acks that are answered
only once durable, leases in real time, dead letters, browsing, and recovery."""

from __future__ import annotations

import gc
import threading
import time
import uuid
import weakref

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import Config
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor import queue_runtime
from amps_on_kafka.processor.queue_recovery import GROUP_PREFIX
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.queues import QueueEngine, messages_of
from amps_on_kafka.state.queue_store import encode_events
from amps_on_kafka.state.queue_types import Delivery, EventKind, Subscription
from tests.conftest import create_topic, delete_topics
from tests.queues.conftest import Inbox
from tests.queues.crash_child import crashing
from tests.queues.helpers import FakeClock, event_records, eventually
from tests.queues.helpers import message as entry_of


def publish(publisher, queue: str, numbers, **extra) -> None:
    for n in numbers:
        publisher.publish(queue, {"n": n, **extra})
    publisher.flush(10)


def test_subscription_is_pushed_messages_with_bookmark_and_lease_period_up_to_its_backlog(
    queue_config, engines, publisher
):
    config = queue_config(LeasePeriod="30s")
    queue = config.queues[0].name
    engine = engines(config)
    inbox = Inbox()
    handle = engine.subscribe(queue, inbox, session="s1", sub_id="sub1", max_backlog=3)
    assert handle.max_backlog == 3
    publish(publisher, queue, range(5))
    first = inbox.wait_for(3)
    eventually(engine, lambda: engine.runtimes[queue].state.depth == 5, what="all 5 read")
    assert len(inbox.messages) == 3  # the backlog is full
    assert [m.data["n"] for m in first] == [0, 1, 2]
    assert [m.bookmark for m in first] == [f"{queue}|0|{i}|" for i in range(3)]
    assert all(29_000 < m.lease_ms <= 30_000 for m in first)
    result = engine.ack(queue, ",".join(m.bookmark for m in first[:2]), "s1").result(10)
    assert result.acked == 2
    assert [m.data["n"] for m in inbox.wait_for(5)[3:]] == [3, 4]


def test_a_burst_subscription_gets_each_burst_as_one_list_in_order(
    queue_config, engines, publisher
):
    """subscribe(burst=True): the deliveries one ack frees come in one call, in delivery
    order, with the clock's reading they are leased from, beside a subscription that
    still gets its messages one at a time."""
    config = queue_config(LeasePeriod="30s")
    queue = config.queues[0].name
    engine = engines(config)
    calls: list[list] = []
    burst = Inbox()
    single = Inbox()

    def by_burst(name: str, deliveries: list, now: int) -> None:
        assert name == queue and all(d.subscription.sub_id == "b" for d in deliveries)
        messages = messages_of(name, deliveries, now)  # under the lock, as the gateway
        calls.append(messages)
        for message in messages:
            burst(message)

    engine.subscribe(queue, by_burst, session="s1", sub_id="b", max_backlog=4, burst=True)
    publish(publisher, queue, range(12))
    first = burst.wait_for(4)
    engine.subscribe(queue, single, session="s2", sub_id="o", max_backlog=2)
    single.wait_for(2)
    eventually(engine, lambda: engine.runtimes[queue].state.depth == 12, what="all 12 read")
    calls.clear()
    engine.ack(queue, ",".join(m.bookmark for m in first), "s1").result(10)
    burst.wait_for(8)
    assert [len(c) for c in calls] == [4]  # the 4 freed slots filled by one call
    delivered = [m.data["n"] for m in burst.messages] + [m.data["n"] for m in single.messages]
    assert sorted(delivered) == list(range(10))
    assert [m.data["n"] for m in calls[0]] == sorted(m.data["n"] for m in calls[0])
    assert all(isinstance(m.lease_ms, int) and m.sub_id == "b" for m in calls[0])


def test_acks_of_several_sessions_are_applied_as_one_record_each_with_its_result(
    queue_config, engines, publisher
):
    """ack_many (the gateway's acks nobody waits for): one events record for the batch,
    and each ack's own result once it is durable; a refused one names its bookmark."""
    config = queue_config(LeasePeriod="30s")
    queue = config.queues[0].name
    engine = engines(config)
    first, second = Inbox(), Inbox()
    engine.subscribe(queue, first, session="s1", sub_id="a", max_backlog=2)
    engine.subscribe(queue, second, session="s2", sub_id="b", max_backlog=2)
    publish(publisher, queue, range(4))
    mine, theirs = first.wait_for(2), second.wait_for(2)
    results: list = []
    done = threading.Event()

    def collect(outcome) -> None:
        results.append(outcome)
        if len(results) == 3:
            done.set()

    ids = [m.id for m in mine]
    engine.ack_many(
        [
            ("ack", queue, ids, "s1", collect),
            ("ack", queue, [theirs[0].id], "s2", collect),
            ("ack", queue, [theirs[1].id], "s1", collect),  # not its lease (Leasing strict)
        ]
    )
    assert done.wait(20)
    assert [r.acked for r in results] == [2, 1, 0]
    assert results[2].refused == (theirs[1].bookmark,)
    removals = [r for r in event_records(engine, queue) if r]
    assert [sorted(e.id[2] for e in r) for r in removals] == [
        sorted([*(i[2] for i in ids), theirs[0].id[2]])
    ]
    assert engine.runtimes[queue].state.depth == 1


def test_an_ack_is_answered_only_once_it_is_durable_in_the_queue_events_topic(
    queue_config, engines, publisher
):
    config = queue_config()
    queue = config.queues[0].name
    engine = engines(config)
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="sub1", max_backlog=2)
    publish(publisher, queue, range(2))
    bookmarks = [m.bookmark for m in inbox.wait_for(2)]
    future = engine.ack(queue, bookmarks, "s1")
    assert future.result(10).acked == 2
    removed = {
        "{}|{}|{}|".format(*e.id)
        for record in event_records(engine, queue)
        for e in record
        if e.kind is EventKind.REMOVE
    }
    assert set(bookmarks) <= removed


def test_event_records_reads_what_the_engine_committed_past_the_last_stable_offset(
    queue_config, engines, publisher, bootstrap
):
    """Kafka writes a transaction's commit markers after commit_transaction returns, so
    a read_committed reader's end (the last stable offset) can still stop before an ack
    already answered: loaded runs read the events topic empty so. Another transaction
    left open before the ack's holds that end back here for as long as the test wants;
    event_records must wait to read the ack's record, not return without it."""
    config = queue_config()
    queue = config.queues[0].name
    engine = engines(config)
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="sub1")
    publish(publisher, queue, [1])
    [message] = inbox.wait_for(1)
    other = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(events_topic(queue), encode_events([]), partition=0)
    other.flush(10)
    assert engine.ack(queue, [message.bookmark], "s1").result(10).acked == 1
    with pytest.raises(AssertionError, match="not readable to"):
        event_records(engine, queue, timeout=1)  # the ack's record is behind the open one
    other.commit_transaction(10)
    removed = ["{}|{}|{}|".format(*e.id) for r in event_records(engine, queue) for e in r]
    assert removed == [message.bookmark]


@pytest.mark.parametrize("semantics", ["at-least-once", "at-most-once"])
def test_a_stopped_engine_is_freed_with_messages_leased(
    queue_config, bootstrap, tmp_path, publisher, semantics
):
    """A leased message holds its subscription, whose callback here reaches the engine:
    a cycle through entries the collector does not track while the queue reads (the
    compiled reader's), which a closing queue gives back to it, so nothing is kept
    (at-most-once: the messages taken, held by their leases only)."""
    config = queue_config(Semantics=semantics)
    queue = config.queues[0].name
    engine = QueueEngine(config, bootstrap, tmp_path / "state")
    engine.start()
    engine.wait_ready(60)
    inbox = Inbox()
    inbox.engine = engine  # type: ignore[attr-defined]
    engine.subscribe(queue, inbox, session="s1", sub_id="sub1", max_backlog=5)
    publish(publisher, queue, [1, 2, 3])
    inbox.wait_for(3, timeout=10)
    engine.stop()
    freed = weakref.ref(engine)
    del engine, inbox
    gc.collect()
    assert freed() is None


def test_a_lease_that_runs_out_returns_the_message_for_redelivery(queue_config, engines, publisher):
    config = queue_config(LeasePeriod="300ms")
    queue = config.queues[0].name
    engine = engines(config)
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="sub1")
    publish(publisher, queue, [7])
    first, again = inbox.wait_for(2, timeout=10)
    assert first.bookmark == again.bookmark
    assert (first.deliveries, again.deliveries) == (1, 2)
    assert 0 < again.lease_ms <= 300


def test_with_MaxDeliveries_a_message_goes_out_only_once_its_delivery_count_is_durable(
    queue_config, engines, publisher
):
    """Else a crash right after a delivery forgets it, and the message is delivered once
    more than MaxDeliveries allows."""
    config = queue_config(MaxDeliveries=2)
    queue = config.queues[0].name
    engine = engines(config)
    state = engine.runtimes[queue].state
    durable_when_sent = Inbox()
    engine.subscribe(
        queue, lambda m: durable_when_sent((m, state.ev_next)), session="s1", sub_id="a"
    )
    publish(publisher, queue, [1])
    [(message, events_durable)] = durable_when_sent.wait_for(1)
    assert events_durable >= 1
    [[event]] = event_records(engine, queue)
    assert (event.kind, event.deliveries) == (EventKind.DELIVER, 1)
    assert "{}|{}|{}|".format(*event.id) == message.bookmark


@pytest.mark.parametrize("ended", ["lease ran out", "unsubscribed"])
def test_a_delivery_held_for_its_commit_is_dropped_if_its_lease_ended_meanwhile(
    queue_config, engines, publisher, ended
):
    """A delivery that waits for its events commit (MaxDeliveries here; after a stall, any)
    must not go out once its lease has ended: the message is back in the queue, maybe
    leased to another subscriber, and two subscribers would hold it. The engine lock,
    held by the test, keeps the commit from sending it until the lease has ended."""
    config = queue_config(MaxDeliveries=5, LeasePeriod="1s", DeliveryFairness="round-robin")
    queue = config.queues[0].name
    clock = FakeClock()
    engine = engines(config, clock=clock)
    runtime = engine.runtimes[queue]
    publish(publisher, queue, [1])
    eventually(engine, lambda: runtime.state.depth == 1, what="the message read")
    first, second = Inbox(), Inbox()
    with engine.lock:
        handle = engine.subscribe(queue, first, session="s1", sub_id="a")
        engine.subscribe(queue, second, session="s2", sub_id="b")
        runtime.finish(None, None).result(10)  # committed; its deliveries wait for the lock
        if ended == "unsubscribed":
            engine.unsubscribe(handle)
        else:
            clock.advance(1_000)
            runtime.state.tick()
            engine.settle()
    [taken] = second.wait_for(1)  # sent after the first commit's deliveries
    assert taken.deliveries == 2 and taken.lease_ms == 1_000
    assert first.messages == []


def test_an_ack_for_an_offset_past_the_end_of_the_log_is_not_remembered(
    queue_config, engines, publisher
):
    """A stale or mistyped bookmark must not swallow the message published there later."""
    config = queue_config()
    queue = config.queues[0].name
    engine = engines(config)
    assert engine.ack(queue, f"{queue}|0|2|", "s1").result(10).acked == 0
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="a", max_backlog=10)
    publish(publisher, queue, range(3))
    assert [m.data["n"] for m in inbox.wait_for(3)] == [0, 1, 2]


def test_an_ack_for_a_message_in_the_log_but_not_read_yet_is_honoured_when_it_is(
    queue_config, engines, publisher
):
    """TargetQueueDepth stops the reading, so the queue has not read every message the
    log holds; an ack for one of those is remembered (seed 001)."""
    config = queue_config(TargetQueueDepth=100)
    queue = config.queues[0].name
    publish(publisher, queue, range(2500))
    engine = engines(config)
    state = engine.runtimes[queue].state
    with engine.lock:
        assert state.positions[(queue, 0)] <= 2400  # the engine stopped reading before it
    assert engine.ack(queue, f"{queue}|0|2400|", "s1").result(10).acked == 1
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="a", max_backlog=100)
    delivered: list = []
    while len(delivered) < 2499:
        inbox.wait_for(1)
        batch = inbox.take()
        delivered += batch
        engine.ack(queue, [m.bookmark for m in batch], "s1").result(10)
    eventually(engine, lambda: state.depth == 0 and state.positions[(queue, 0)] == 2500)
    assert f"{queue}|0|2400|" not in {m.bookmark for m in delivered}
    assert len(delivered) == 2499


def test_disconnect_returns_leases_to_another_subscriber_at_once(queue_config, engines, publisher):
    config = queue_config(LeasePeriod="1h")
    queue = config.queues[0].name
    engine = engines(config)
    first, second = Inbox(), Inbox()
    engine.subscribe(queue, first, session="s1", sub_id="a", max_backlog=10)
    publish(publisher, queue, range(3))
    first.wait_for(3)
    engine.subscribe(queue, second, session="s2", sub_id="b", max_backlog=10)
    engine.disconnect("s1")
    assert sorted(m.data["n"] for m in second.wait_for(3, timeout=5)) == [0, 1, 2]


def test_expired_message_goes_to_the_dead_letter_topic(
    queue_config, engines, publisher, topic_factory, bootstrap
):
    dead = topic_factory()
    config = queue_config(DeadLetterTopic=dead, MaxDeliveries=1)
    queue = config.queues[0].name
    engine = engines(config)
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s1", sub_id="a")
    publish(publisher, queue, [1])
    [message] = inbox.wait_for(1)
    engine.expire(queue, message.bookmark, "s1").result(10)
    consumer = reader(bootstrap)
    consumer.assign([TopicPartition(dead, 0, 0)])
    records = []
    deadline = time.monotonic() + 10
    while not records and time.monotonic() < deadline:
        records = consumer.consume(1, timeout=0.5)
    consumer.close()
    [record] = records
    assert orjson.loads(record.value()) == {"n": 1}
    assert dict(record.headers())["source"] == message.bookmark.encode()


def test_sow_on_a_queue_and_ack_by_filter(queue_config, engines, publisher):
    config = queue_config()
    queue = config.queues[0].name
    engine = engines(config)
    publish(publisher, queue, range(6))
    eventually(engine, lambda: len(engine.browse(queue)) == 6, what="6 messages in the queue")
    assert [m.data["n"] for m in engine.browse(queue, "/n > 3")] == [4, 5]
    assert engine.ack_by_filter(queue, "/n < 2", "s1").result(10).acked == 2
    assert [m.data["n"] for m in engine.browse(queue)] == [2, 3, 4, 5]


@pytest.mark.parametrize("semantics", ["at-least-once", "at-most-once"])
def test_sigkill_loses_no_unacknowledged_message_and_redelivers_no_acknowledged_one(
    semantics, queue_config, engines, publisher, bootstrap, tmp_path
):
    """After a SIGKILL of the worker and a restart: no acknowledged message is delivered
    again, no unacknowledged one is lost, and the leases held at the crash are returned.
    At-most-once, a message left the queue as it was delivered: none comes back."""
    config = queue_config(LeasePeriod="1h", Semantics=semantics)
    queue = config.queues[0].name
    state_dir = tmp_path / "crashing"
    with crashing(config, state_dir, bootstrap) as child:
        assert child.stdout.readline().strip() == "ready"
        publish(publisher, queue, range(20))
        seen: dict[str, set[str]] = {"acked": set(), "held": set()}
        while len(seen["acked"]) + len(seen["held"]) < 20:
            verb, bookmark = child.stdout.readline().split()
            seen[verb].add(bookmark)
    engine = engines(config, state_dir)
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s2", sub_id="after", max_backlog=1000)
    publish(publisher, queue, [20])  # a message after the crash, so there is one to wait for
    returned = seen["held"] if semantics == "at-least-once" else set()
    expected = returned | {f"{queue}|0|20|"}
    inbox.wait_for(len(expected))
    eventually(
        engine, lambda: engine.runtimes[queue].state.positions[(queue, 0)] == 21, what="all read"
    )
    assert set(inbox.bookmarks) == expected  # returned leases, and nothing acked
    assert len(inbox.messages) == len(expected)


def test_a_worker_without_the_store_rebuilds_the_queue_from_the_logs(
    queue_config, engines, publisher, bootstrap, tmp_path
):
    config = queue_config()
    queue = config.queues[0].name
    first = engines(config, tmp_path / "one")
    inbox = Inbox()
    handle = first.subscribe(queue, inbox, session="s1", sub_id="a", max_backlog=100)
    publish(publisher, queue, range(10))
    messages = inbox.wait_for(10)
    acked = [m.bookmark for m in messages if m.data["n"] in (0, 1, 2, 5)]
    first.ack(queue, acked, "s1").result(10)
    first.unsubscribe(handle)
    before = [m.bookmark for m in first.browse(queue)]
    first.stop()
    committed = _committed(bootstrap, queue)
    assert committed[(queue, 0)] == 3  # the recovery point: everything before it acked
    second = engines(config, tmp_path / "two")
    assert [m.bookmark for m in second.browse(queue)] == before
    assert second.runtimes[queue].state.recovery_point().offsets[(queue, 0)] == 3


def test_a_store_whose_events_retention_deleted_is_set_aside_for_the_recovery_point(
    queue_config, engines, publisher, bootstrap, tmp_path
):
    """A worker that owned the queue long ago has a store needing events retention has
    since deleted: replaying what is left would forget the acks of the owners since and
    deliver their messages again. The store is emptied and the queue rebuilt from the
    recovery point (docs/scaling.md, the retention queues need)."""
    config = queue_config()
    queue = config.queues[0].name
    publish(publisher, queue, range(10))
    for state_dir, acked in ((tmp_path / "old", range(3)), (tmp_path / "new", range(3, 6))):
        engine = engines(config, state_dir)
        inbox = Inbox()
        engine.subscribe(queue, inbox, session="s", sub_id="a", max_backlog=100)
        messages = inbox.wait_for(10 - acked.start)
        engine.ack(queue, [m.bookmark for m in messages if m.data["n"] in acked], "s").result(10)
        engine.stop()  # stores its state and commits the recovery point (offset 6)
    events = reader(bootstrap)
    _, high = events.get_watermark_offsets(TopicPartition(events_topic(queue), 0), timeout=10)
    events.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deleted = admin.delete_records([TopicPartition(events_topic(queue), 0, high)])
    assert next(iter(deleted.values())).result(10).low_watermark == high  # "retention"
    again = engines(config, tmp_path / "old")
    assert [m.data["n"] for m in again.browse(queue)] == list(range(6, 10))


def _committed(bootstrap: str, queue: str) -> dict:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{GROUP_PREFIX}{queue}"})
    try:
        found = consumer.committed([TopicPartition(queue, 0)], timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()


def test_a_queue_refuses_commands_until_it_has_recovered(queue_config, bootstrap, tmp_path):
    """Deliveries must wait for the events replay: an acked message could still be in it."""
    config = queue_config()
    queue = config.queues[0].name
    engine = QueueEngine(config, bootstrap, tmp_path)  # not started: still recovering
    assert engine.serves(queue)
    with pytest.raises(TransportError, match="recovering"):
        engine.subscribe(queue, Inbox(), session="s", sub_id="a")
    with pytest.raises(TransportError, match="recovering"):
        engine.ack(queue, f"{queue}|0|0|", "s")


def test_a_topic_created_later_that_underlying_topic_matches_joins_the_queue(
    bootstrap, topic_factory, engines, publisher, monkeypatch
):
    """UnderlyingTopic is a regular expression: the queue takes in a matching topic
    created while it runs, from the topic's first message, without a restart."""
    monkeypatch.setattr(queue_runtime, "DISCOVER_EVERY", 0.1)
    first = topic_factory(1)
    queue_options = {"UnderlyingTopic": f"^{first}(_later)?$", "DefaultPublishTarget": first}
    config = Config.model_validate(
        {"Topics": [{"Name": first}], "Queues": [{"Name": f"{first}_Q", **queue_options}]}
    )
    queue = config.queues[0].name
    engine = engines(config)
    later = f"{first}_later"
    create_topic(bootstrap, TopicSpec(later, 2))
    try:
        publisher.publish(later, {"n": 1})
        publisher.publish(first, {"n": 2})
        publisher.flush(10)
        eventually(engine, lambda: engine.runtimes[queue].state.depth == 2, what="both enqueued")
        assert sorted(m.data["n"] for m in engine.browse(queue)) == [1, 2]
    finally:
        delete_topics(bootstrap, [later, events_topic(queue)])


def test_send_hands_each_burst_subscription_its_deliveries_in_one_call(tmp_path):
    """QueueEngine.send, whatever the interleaving of a call's deliveries: a one-at-a-time
    subscription gets a message a delivery, in order, first; then each burst subscription
    its deliveries of the call in one call, in order, in the order they first appear (the
    contract a faster grouping of the deliveries must keep)."""
    engine = QueueEngine(Config(), "unused:9", tmp_path, clock=lambda: 1_000_000)
    calls: list[tuple] = []

    def burst(queue, deliveries, now):
        calls.append(("burst", queue, [d.entry.id for d in deliveries], now))

    def single(message):
        calls.append(("single", message.sub_id, message.id, message.lease_ms))

    subs = [
        Subscription(f"s{i}", i, deliver=burst if i < 2 else single, burst=i < 2) for i in range(4)
    ]

    @settings(max_examples=100, deadline=None)
    @given(picks=st.lists(st.integers(0, 3), max_size=40))
    def check(picks):
        deliveries = [Delivery(subs[i], entry_of(at), 1_000_100) for at, i in enumerate(picks)]
        calls.clear()
        engine.send("Q", deliveries)
        bursts: dict[Subscription, list] = {}
        for d in deliveries:
            if d.subscription.burst:
                bursts.setdefault(d.subscription, []).append(d.entry.id)
        singles = [d for d in deliveries if not d.subscription.burst]
        expected = [("single", d.subscription.sub_id, d.entry.id, 100) for d in singles]
        expected += [("burst", "Q", ids, 1_000_000) for ids in bursts.values()]
        assert calls == expected

    check()
