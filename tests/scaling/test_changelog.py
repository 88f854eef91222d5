"""Issue 15 item 3: a partition's SOW restored from its changelog on an empty state
directory, after the log's beginning was deleted (processor/changelog.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from amps_on_kafka.admin.view import worker_view
from amps_on_kafka.config import Config, load_config
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.log.kafka import admin_client, end_offsets, reader
from amps_on_kafka.processor.changelog import (
    TURN_TIMEOUT,
    Changelog,
    ChangelogFailed,
    changelog_topic,
    ensure_changelog_topics,
    restore,
)
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.state.record import NEVER, pack_record
from amps_on_kafka.state.store import PartitionStore
from tests import polling
from tests.conftest import delete_topics
from tests.scaling.helpers import session_timeout
from tests.sow.test_poison import set_max_message_bytes
from tests.sow.test_worker import reference_sow
from tests.sow.worker_process import spawn

WAIT = 60.0  # seconds any step may take


def config_of(topic: str, bootstrap: str, **sow) -> dict:
    return {
        "Topics": [{"Name": topic, "Partitions": 2}],
        "SOW": [{"Topic": topic, "Key": "/id", "Changelog": True, **sow}],
        "Worker": {"SessionTimeout": session_timeout(bootstrap)},
    }


@pytest.fixture
def sow_topic(topic_factory):
    return topic_factory(partitions=2, key=("/id",))


@pytest.fixture
def run_worker(bootstrap):
    """run_worker(config, state_dir, group, clock=None) -> a started, ready Worker that
    the test may stop itself; the fixture stops every one at the end."""
    running: list[Worker] = []

    def run(config: dict, state: Path, group: str, clock=None) -> Worker:
        extra = {} if clock is None else {"clock": clock}
        worker = Worker(Config.model_validate(config), bootstrap, state, group_id=group, **extra)
        worker.start()
        worker.wait_ready(WAIT)
        running.append(worker)
        return worker

    yield run
    for worker in running:
        worker.stop()  # again for those the test stopped: it does nothing then


def caught_up(worker: Worker, bootstrap: str, topic: str) -> None:
    worker.wait_caught_up(topic, end_offsets(bootstrap, topic), WAIT)


def held(worker: Worker, topic: str) -> dict:
    return {r.sow_key: (r.data, r.offset, r.deadline) for r in worker.engine.query(topic).records}


def delete_log(bootstrap: str, topic: str) -> None:
    """Delete every record of the topic (as retention would), and check it is gone."""
    admin = admin_client(bootstrap)
    gone = [TopicPartition(topic, p, OFFSET_END) for p in (0, 1)]
    for future in admin.delete_records(gone).values():
        future.result(WAIT)
    consumer = reader(bootstrap)
    try:
        for p in (0, 1):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert low == high
    finally:
        consumer.close()


def until(condition, what: str) -> object:
    return polling.until(condition, what, WAIT)


def test_an_empty_state_dir_restores_records_and_deadlines_without_the_log(
    bootstrap, sow_topic, client, run_worker, tmp_path
):
    """Upserts, a delta, deletes by key and by filter and an expired record; then the
    log is deleted and a worker on an empty state directory serves the same SOW, with the
    same stored deadlines (seed 000), from the changelog: it applied no log record, and
    goes on from the right offset."""
    for i in range(30):
        client.publish(sow_topic, {"id": i, "v": i})
    client.delta_publish(sow_topic, {"id": 3, "extra": True})
    client.sow_delete(sow_topic, keys=["4", "5"])
    client.sow_delete(sow_topic, "/v >= 28")
    client.publish(sow_topic, {"id": 7, "v": -7}, expiration=0.001)  # expires at once
    client.publish_flush(10)
    config, group = config_of(sow_topic, bootstrap, Expiration="1h"), f"g-{uuid.uuid4().hex[:8]}"
    first = run_worker(config, tmp_path / "first", group)
    caught_up(first, bootstrap, sow_topic)
    until(lambda: first.expired >= 1, "record 7 never expired")
    before = held(first, sow_topic)
    assert sorted(before, key=int) == [str(i) for i in range(28) if i not in (4, 5, 7)]
    assert before["3"][0] == {"id": 3, "v": 3, "extra": True}
    assert all(deadline > 0 for _, _, deadline in before.values())
    first.stop()
    delete_log(bootstrap, sow_topic)

    now = [time.time_ns() // 1_000_000]
    second = run_worker(config, tmp_path / "second", group, clock=lambda: now[0])
    caught_up(second, bootstrap, sow_topic)
    assert held(second, sow_topic) == before
    assert second.applied == 0  # nothing came from the log: it holds nothing
    client.publish(sow_topic, {"id": 99, "v": 99})
    client.publish_flush(10)
    caught_up(second, bootstrap, sow_topic)
    assert held(second, sow_topic)["99"][0] == {"id": 99, "v": 99}
    now[0] += 2 * 3_600_000  # past every 1h deadline: the restored expiry index sweeps all
    until(lambda: not held(second, sow_topic), "restored deadlines never fell due")


def test_sigkill_loses_the_store_flush_and_the_changelog_keeps_it_exact(
    bootstrap, sow_topic, client, run_worker, tmp_path
):
    """A worker applies deltas whose order matters and is SIGKILLed before its store
    flushed them: the restart on its state directory applies them again from the log
    (re-writing the changelog). Killed so again, with the log then deleted, a restart
    finds its stores behind the log's start and restores them from the changelog (as on
    an empty directory). Both hold the replayed SOW: nothing lost or doubled. About 11 s
    here: two worker processes are started to be killed (a SIGKILL needs a process)."""
    config = config_of(sow_topic, bootstrap)
    config["State"] = {"FlushEvery": "1h"}  # the killed worker's writes stay in memory
    group, state = f"g-{uuid.uuid4().hex[:8]}", tmp_path / "state"
    publish_deltas(client, sow_topic, 0, 1000)
    first = run_worker(config, state, group)  # a clean stop: its stores are on disk
    caught_up(first, bootstrap, sow_topic)
    first.stop()
    publish_deltas(client, sow_topic, 1000, 2000)
    kill_when_changelogged(config, bootstrap, state, group, tmp_path)
    restarted = run_worker(config, state, group)
    caught_up(restarted, bootstrap, sow_topic)
    assert restarted.applied == 1000  # the killed run's work was lost with its memtables
    assert held_sow(restarted, sow_topic) == reference_sow(bootstrap, restarted, sow_topic)
    restarted.stop()
    publish_deltas(client, sow_topic, 2000, 2400)
    expected = reference_sow(bootstrap, restarted, sow_topic)
    kill_when_changelogged(config, bootstrap, state, group, tmp_path)  # those not flushed
    delete_log(bootstrap, sow_topic)

    again = run_worker(config, state, group)  # its stores are behind the log's start
    caught_up(again, bootstrap, sow_topic)
    assert again.applied == 0
    assert held_sow(again, sow_topic) == expected
    changelog = end_offsets(bootstrap, changelog_topic(group, sow_topic))
    assert sum(changelog.values()) > 0  # what it restored from is where the docs say


def held_sow(worker: Worker, topic: str) -> dict:
    """As reference_sow gives it: data and bookmark offset by key."""
    return {key: (data, offset) for key, (data, offset, _) in held(worker, topic).items()}


def publish_deltas(client, topic: str, start: int, end: int) -> None:
    for i in range(start, end):
        if i % 4 == 0:
            client.publish(topic, {"id": i % 40, "base": i})
        else:
            client.delta_publish(topic, {"id": i % 40, f"f{i % 5}": i, "last": i})
    client.publish_flush(30)


def kill_when_changelogged(
    config: dict, bootstrap: str, state: Path, group: str, tmp_path: Path
) -> None:
    """Run a worker in a process of its own until its changelog holds the whole log,
    then SIGKILL it."""
    config_file = tmp_path / "worker.yaml"
    config_file.write_text(yaml.safe_dump(config))
    load_config(config_file)  # the file reads as the dict did
    process = spawn(config_file, bootstrap, state, group, stdout=subprocess.DEVNULL)
    try:
        until(lambda: changelogged(bootstrap, group, config, tmp_path), "never changelogged")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()


def changelogged(bootstrap: str, group: str, config: dict, tmp_path: Path) -> bool:
    """Whether a restore from the changelog now reaches the log's end (what a worker on
    an empty directory would do, into a scratch store)."""
    topic = config["SOW"][0]["Topic"]
    ends = end_offsets(bootstrap, topic)
    scratch = tmp_path / f"scratch-{uuid.uuid4().hex[:6]}"
    for partition, end in ends.items():
        store = PartitionStore(scratch / str(partition), topic, partition)
        try:
            if restore(bootstrap, group, [store])[0] != end:
                return False
        finally:
            store.close()
    return True


class Member:
    """A group member as Changelog.send sees it, holding the metadata it was given."""

    def __init__(self, metadata) -> None:
        self.metadata = metadata

    def consumer_group_metadata(self):
        return self.metadata


def joined(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    consumer.subscribe([topic])
    until(lambda: consumer.poll(0.1) is None and bool(consumer.assignment()), "never assigned")
    return consumer


def test_a_member_the_group_dropped_commits_no_batch(bootstrap, sow_topic, tmp_path):
    """Zombie fencing: a loop turn's batches (both partitions, one transaction) sent with
    the group metadata of a member that left (a worker the group took for dead) are
    refused and invisible, and counted; the same from the member of the current
    generation commit, both."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = Config.model_validate(config_of(sow_topic, bootstrap))
    ensure_changelog_topics(bootstrap, config, group)
    old = joined(bootstrap, group, sow_topic)
    stale = Member(old.consumer_group_metadata())
    old.close()
    current = joined(bootstrap, group, sow_topic)
    changelog = Changelog(bootstrap, group, None)
    stores = [PartitionStore(tmp_path / f"store{p}", sow_topic, p) for p in (0, 1)]
    turn = [(s, [(b"k", pack_record(3, 1, NEVER, b'{"id":"k"}'))], 4, sow_topic) for s in stores]
    try:
        with pytest.raises(ChangelogFailed, match="UNKNOWN_MEMBER_ID"):
            changelog.send_all(turn, stale)  # type: ignore[arg-type]
        assert changelog.failures == 1  # Worker.changelog_failures, in the admin metrics
        changelog.send_all(turn, current)
        assert changelog.failures == 1
    finally:
        changelog.close()
        current.close()
        for store in stores:
            store.close()
    restored = [PartitionStore(tmp_path / f"restored{p}", sow_topic, p) for p in (0, 1)]
    try:
        assert restore(bootstrap, group, restored) == {0: 4, 1: 4}
        assert [[r.sow_key for r in store.scan()] for store in restored] == [["k"], ["k"]]
    finally:
        for store in restored:
            store.close()


def test_a_changelog_with_other_partitions_than_its_log_stops_the_start(
    bootstrap, sow_topic, topic_factory
):
    group = f"g-{uuid.uuid4().hex[:8]}"
    topic_factory(partitions=1, name=changelog_topic(group, sow_topic))
    config = Config.model_validate(config_of(sow_topic, bootstrap))
    with pytest.raises(ConfigError, match="has 1 partitions, its log 2"):
        ensure_changelog_topics(bootstrap, config, group)


def test_a_changelog_turned_off_and_on_again_is_brought_into_step(
    bootstrap, sow_topic, client, run_worker, tmp_path
):
    """Changes made while the changelog is off (a delete, a new key) are copied into it
    when it is turned on again over the same stores, tombstones included: a worker on an
    empty directory, with the log deleted, then restores the same SOW."""
    group, state = f"g-{uuid.uuid4().hex[:8]}", tmp_path / "state"
    on, off = config_of(sow_topic, bootstrap), config_of(sow_topic, bootstrap, Changelog=False)
    for i in range(20):
        client.publish(sow_topic, {"id": i, "v": i})
    client.publish_flush(10)
    for config, records in ((on, None), (off, ["4", "5"]), (on, None)):
        if records:  # what only the stores see
            client.sow_delete(sow_topic, keys=records)
            client.publish(sow_topic, {"id": 30, "v": 30})
            client.publish_flush(10)
        worker = run_worker(config, state, group)
        caught_up(worker, bootstrap, sow_topic)
        expected = held(worker, sow_topic)
        worker.stop()
    assert sorted(expected, key=int) == [str(i) for i in [*range(20), 30] if i not in (4, 5)]
    delete_log(bootstrap, sow_topic)
    fresh = run_worker(on, tmp_path / "fresh", group)
    caught_up(fresh, bootstrap, sow_topic)
    assert fresh.applied == 0
    assert held(fresh, sow_topic) == expected


def test_records_deleted_before_any_worker_applied_them_are_reported_not_lost_silently(
    bootstrap, sow_topic, client, run_worker, tmp_path, caplog
):
    """The changelog only has what a worker applied: records that retention deleted before
    any worker read them are gone from both. The worker says which, and counts them; with
    nothing left to consume, it is caught up at the log's end and has no lag (/ready)."""
    for i in range(10):
        client.publish(sow_topic, {"id": i, "v": i})
    client.publish_flush(10)
    delete_log(bootstrap, sow_topic)
    config, group = config_of(sow_topic, bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    worker = run_worker(config, tmp_path / "state", group)
    until(lambda: worker.rejected["lost_to_retention"] == 10, "the lost records not counted")
    lost = [r.getMessage() for r in caplog.records if "deleted from the log" in r.getMessage()]
    assert len(lost) == 2 and all("not in the SOW" in line for line in lost)
    worker.wait_caught_up(sow_topic, end_offsets(bootstrap, sow_topic), 10)
    assert worker.next_offsets(sow_topic) == end_offsets(bootstrap, sow_topic)
    until(lambda: worker.lag() == {(sow_topic, 0): 0, (sow_topic, 1): 0}, "a lag left")


def test_a_changelog_deleted_by_hand_is_noticed_and_filled_again(
    bootstrap, sow_topic, client, run_worker, tmp_path, caplog
):
    """The changelog topic deleted while a worker runs, then again while none runs (its
    stores on disk): each time the worker logs an error naming it, creates it again and
    copies its stores into it (counted, amps_changelog_lost_total), so a worker on an
    empty directory, with the log deleted, restores the whole SOW from it, not only
    what came after the deletion."""
    config, group = config_of(sow_topic, bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    name, state = changelog_topic(group, sow_topic), tmp_path / "state"
    publish_range(client, sow_topic, 0, 10)
    worker = run_worker(config, state, group)
    caught_up(worker, bootstrap, sow_topic)
    delete_topics(bootstrap, [name])
    until(lambda: worker_view(worker)["changelog_lost"] == 2, "a deletion not noticed")
    assert any(name in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    publish_range(client, sow_topic, 10, 20)
    caught_up(worker, bootstrap, sow_topic)
    worker.stop()
    delete_topics(bootstrap, [name])
    again = run_worker(config, state, group)
    assert again.changelog_lost == 2  # both stores, when they were assigned
    publish_range(client, sow_topic, 20, 25)
    caught_up(again, bootstrap, sow_topic)
    expected = held(again, sow_topic)
    again.stop()
    assert sorted(expected, key=int) == [str(i) for i in range(25)]
    delete_log(bootstrap, sow_topic)
    fresh = run_worker(config, tmp_path / "fresh", group)
    caught_up(fresh, bootstrap, sow_topic)
    assert fresh.applied == 0 and fresh.changelog_lost == 0
    assert held(fresh, sow_topic) == expected


@pytest.mark.timing
def test_a_changelog_deleted_under_open_transactions_holds_the_loop_a_turn_timeout_not_a_minute(
    bootstrap, sow_topic, client, run_worker, tmp_path
):
    """The changelog topic deleted while the loop commits batches to it: a commit Kafka
    can't finish held the worker's loop 30-60 s (no partition applied, a stop waiting);
    it now fails after TURN_TIMEOUT, the topic is created again, and every record goes in."""
    config, group = config_of(sow_topic, bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    worker = run_worker(config, tmp_path / "state", group)
    delete_topics(bootstrap, [changelog_topic(group, sow_topic)])
    deadline, sent = time.monotonic() + 1.5 * TURN_TIMEOUT, 0  # Kafka fails it at 20-60 s
    while worker_view(worker)["changelog_failures"] == 0:  # the loop turns again
        assert time.monotonic() < deadline, "a commit held the loop beyond TURN_TIMEOUT"
        client.publish(sow_topic, {"id": sent, "v": sent})
        client.publish_flush(10)
        sent += 1
        time.sleep(0.05)
    caught_up(worker, bootstrap, sow_topic)
    assert sorted(held(worker, sow_topic), key=int) == [str(i) for i in range(sent)]


def publish_range(client, topic: str, start: int, end: int) -> None:
    for i in range(start, end):
        client.publish(topic, {"id": i, "v": i})
    client.publish_flush(10)


def test_a_changelog_write_kafka_refuses_is_counted_and_its_batch_waits(
    bootstrap, sow_topic, client, run_worker, tmp_path
):
    """A changelog transaction Kafka refuses (a record over the changelog's
    max.message.bytes) leaves the store as it was and is counted in the admin view
    (amps_changelog_failures_total); once Kafka takes it again the batch goes in."""
    config, group = config_of(sow_topic, bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    worker = run_worker(config, tmp_path / "state", group)
    changelog = changelog_topic(group, sow_topic)
    set_max_message_bytes(bootstrap, changelog, 1000)  # room for transaction markers
    client.publish(sow_topic, {"id": 1, "blob": os.urandom(3000).hex()})  # lz4 can't fit it
    client.publish_flush(10)
    until(lambda: worker_view(worker)["changelog_failures"] >= 1, "no failure counted")
    assert held(worker, sow_topic) == {}  # not in the store before it is in the changelog
    set_max_message_bytes(bootstrap, changelog, 1_048_588)
    caught_up(worker, bootstrap, sow_topic)
    assert list(held(worker, sow_topic)) == ["1"]
