"""The worker against the real broker and real RocksDB (issue 4, items 1, 3, 7, 8)."""

from __future__ import annotations

import math
import threading
import time

import orjson
from confluent_kafka import Producer

from amps_on_kafka.admin.view import worker_view
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.processor.applying import MAX_IDLE_WAIT, STANDBY_WAIT
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.state.sow import Applied, DictState
from tests.sow.conftest import sow_config, wait_caught_up


def sow_of(worker, topic, filter=None):
    result = worker.engine.query(topic, compile_filter(filter) if filter else None)
    return {r.sow_key: r.data for r in result.records}


def reference_sow(bootstrap, worker, topic):
    """The SOW computed by replaying the topic from EPOCH with the same rules."""
    rules = worker.rules[topic]
    states: dict[int, DictState] = {}
    with Replay(bootstrap, topic, "0", until="0|1|") as log:
        for message in log:
            if getattr(message, "command", None) == "ack":
                continue
            rules.apply(states.setdefault(message.partition, DictState()), message, Applied())
    return {k: (r.data, r.offset) for s in states.values() for k, r in s.records.items()}


def test_publish_delta_and_delete_across_partitions(bootstrap, sow_topic, publisher, start_worker):
    for i in range(20):
        publisher.publish(sow_topic, {"id": i, "v": i})
    publisher.delta_publish(sow_topic, {"id": 3, "extra": True})
    publisher.sow_delete(sow_topic, keys=["4", "5"])
    publisher.sow_delete(sow_topic, "/v >= 18")
    publisher.publish_flush(10)
    worker = start_worker(sow_config(sow_topic))
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    sow = sow_of(worker, sow_topic)
    assert sorted(sow, key=int) == [str(i) for i in range(18) if i not in (4, 5)]
    assert sow["3"] == {"id": 3, "v": 3, "extra": True}
    assert set(worker.engine.partitions(sow_topic)) == {0, 1}


def test_a_filter_that_pins_the_key_is_a_point_lookup(
    bootstrap, sow_topic, publisher, start_worker
):
    for i in range(50):
        publisher.publish(sow_topic, {"id": i, "sym": "IBM" if i % 2 else "MSFT"})
    publisher.publish_flush(10)
    worker = start_worker(sow_config(sow_topic))
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    assert sow_of(worker, sow_topic, "/id = 7") == {"7": {"id": 7, "sym": "IBM"}}
    assert sow_of(worker, sow_topic, "/id IN (7, 8) AND /sym = 'IBM'") == {
        "7": {"id": 7, "sym": "IBM"}
    }
    assert len(sow_of(worker, sow_topic, "/sym = 'IBM'")) == 25


def test_order_by_and_top_n(bootstrap, sow_topic, publisher, start_worker):
    for i in range(10):
        publisher.publish(sow_topic, {"id": i, "px": (i * 7) % 10})
    publisher.publish_flush(10)
    worker = start_worker(sow_config(sow_topic))
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    result = worker.engine.query(sow_topic, None, order_by="/px DESC", top_n=3)
    assert [r.data["px"] for r in result.records] == [9, 8, 7]
    assert result.matches == 10


def test_a_restart_resumes_from_the_stored_offsets_without_replaying(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    for i in range(300):
        publisher.publish(sow_topic, {"id": i % 30, "v": i})
    publisher.publish_flush(10)
    config = sow_config(sow_topic)
    first = start_worker(config, tmp_path / "s", group="g-restart")
    wait_caught_up(first, bootstrap, sow_topic, 2)
    before = sow_of(first, sow_topic)
    first.stop()
    second = start_worker(config, tmp_path / "s", group="g-restart")
    wait_caught_up(second, bootstrap, sow_topic, 2)
    assert sow_of(second, sow_topic) == before
    assert second.applied == 0


def test_expired_records_are_removed_at_startup_before_queries(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    config = sow_config(sow_topic, Expiration="enabled")
    publisher.publish(sow_topic, {"id": 1}, expiration=2)
    publisher.publish(sow_topic, {"id": 2})
    publisher.publish_flush(10)
    first = start_worker(config, tmp_path / "s", group="g-exp")
    wait_caught_up(first, bootstrap, sow_topic, 2)
    (held,) = [r for s in first.engine.stores() if (r := s.get("1")) is not None]
    first.stop()  # the record is still alive when its worker stops
    threading.Event().wait(max(0.0, (held.deadline - now_ms()) / 1000 + 0.05))  # let it lapse
    second = start_worker(config, tmp_path / "s", group="g-exp")
    assert all(store.get("1") is None for store in second.engine.stores())  # gone at startup
    assert sow_of(second, sow_topic) == {"2": {"id": 2}}


def test_bad_records_on_the_log_are_skipped_counted_and_dead_lettered(
    bootstrap, topic_factory, publisher, start_worker
):
    topic = topic_factory(partitions=1, key=("/id",))
    dead = topic_factory(partitions=1)
    raw = Producer({"bootstrap.servers": bootstrap})
    raw.produce(topic, b"{not json", partition=0)
    raw.produce(topic, orjson.dumps({"no_id": 1}), partition=0)
    raw.flush(10)
    publisher.publish(topic, {"id": 1, "ok": True})
    publisher.publish_flush(10)
    worker = start_worker(sow_config(topic, partitions=1, DeadLetterTopic=dead))
    wait_caught_up(worker, bootstrap, topic, 1)
    assert sow_of(worker, topic) == {"1": {"id": 1, "ok": True}}
    assert worker.rejected == {"bad_record": 2}
    counted = worker_view(worker)  # what amps_records_rejected_total{outcome} shows
    assert (counted["dead_lettered"], counted["skipped"]) == ({"bad_record": 2}, {})
    with Replay(bootstrap, dead, "0", until="0|1|", max_idle=10) as log:
        letters = [m for m in log if getattr(m, "command", None) != "ack"]
    assert [m.raw for m in letters] == [b"{not json", orjson.dumps({"no_id": 1})]
    reasons = [dict(m.headers)["reason"].decode() for m in letters]
    assert "not valid JSON" in reasons[0] and "/id" in reasons[1]


def test_the_worker_state_equals_a_replay_from_epoch(bootstrap, sow_topic, publisher, start_worker):
    for i in range(400):
        if i % 3:
            publisher.delta_publish(sow_topic, {"id": i % 25, f"f{i % 7}": i})
        else:
            publisher.publish(sow_topic, {"id": i % 25, "base": i})
    publisher.sow_delete(sow_topic, "/base > 390")
    publisher.publish_flush(10)
    worker = start_worker(sow_config(sow_topic))
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    got = {r.sow_key: (r.data, r.offset) for r in worker.engine.query(sow_topic).records}
    assert got == reference_sow(bootstrap, worker, sow_topic)


def test_a_second_worker_in_the_group_takes_half_the_partitions(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    for i in range(40):
        publisher.publish(sow_topic, {"id": i})
    publisher.publish_flush(10)
    config = sow_config(sow_topic)
    first = start_worker(config, tmp_path / "a", group="g-split")
    wait_caught_up(first, bootstrap, sow_topic, 2)
    assert first.engine.partitions(sow_topic) == [0, 1]
    second = start_worker(config, tmp_path / "b", group="g-split")
    deadline = time.monotonic() + 60
    while True:  # the group rebalances: each worker ends with one partition
        first.engine.assignment_changed.clear()
        owned = first.engine.partitions(sow_topic), second.engine.partitions(sow_topic)
        if len(owned[0]) == 1 and len(owned[1]) == 1:
            break
        assert time.monotonic() < deadline, owned
        first.engine.assignment_changed.wait(1.0)
    wait_caught_up(second, bootstrap, sow_topic, 2, owned_only=True)
    both = sow_of(first, sow_topic) | sow_of(second, sow_topic)
    assert len(sow_of(first, sow_topic)) < 40 and len(both) == 40


def _voluntary_switches(thread: threading.Thread) -> int:
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


def test_an_idle_worker_wakes_a_few_times_a_second(bootstrap, sow_topic, publisher, start_worker):
    """With nothing to consume and nothing due, the loop's thread waits MAX_IDLE_WAIT a
    turn: each wake-up takes the GIL from a gateway answering in the same process
    (docs/performance.md, the look-up's ninth round). At the old 50 ms it woke 20 times a
    second (40 in these 2 s); now about 4."""
    worker = start_worker(sow_config(sow_topic))
    publisher.publish(sow_topic, {"id": 1})
    publisher.publish_flush(10)
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    thread = worker._thread
    assert thread is not None and thread.native_id is not None
    before = _voluntary_switches(thread)
    time.sleep(2)  # the idle span measured, not a synchronization
    woke = _voluntary_switches(thread) - before
    assert woke <= 20, f"the idle loop woke {woke} times in 2 s"


def test_the_idle_wait_ends_at_a_held_partitions_retry_and_is_short_with_standby(
    bootstrap, sow_topic, start_worker
):
    """A held partition's retry and a deadline shorten the idle wait; with standby
    copies (whose consumer is read once a turn) it is STANDBY_WAIT."""
    worker = start_worker(sow_config(sow_topic))
    assert worker._wait_time(None) == MAX_IDLE_WAIT
    assert worker._wait_time(now_ms() + 20) <= 0.02
    worker._held[("x", 0)] = (time.monotonic() + 0.1, 0.1)
    assert 0.05 < worker._wait_time(None) <= 0.1
    worker._held[("x", 0)] = (math.inf, 0.1)  # resumed: not due again
    assert worker._wait_time(None) == MAX_IDLE_WAIT
    worker._standby = object()  # as the loop reads it: standby copies are kept
    try:
        assert worker._wait_time(None) == STANDBY_WAIT
    finally:
        worker._standby = None


def test_a_passed_deadline_in_a_topic_without_expiration_does_not_wake_the_loop(
    bootstrap, sow_topic, publisher, start_worker
):
    """Disabled expiration keeps the message's deadline but never acts on it, so the
    worker's loop keeps its idle wait instead of spinning on a deadline long past."""
    worker = start_worker(sow_config(sow_topic))
    publisher.publish(sow_topic, {"id": 1}, expiration=0.001)
    publisher.publish_flush(10)
    wait_caught_up(worker, bootstrap, sow_topic, 2)
    assert sum(len(s.due(now_ms() + 1000)) for s in worker.engine.stores()) == 1
    due = worker._next_due()
    assert due is None and worker._wait_time(due) == MAX_IDLE_WAIT
