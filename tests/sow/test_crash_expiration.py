"""Defect 8: a crash must not recompute stored deadlines, nor change how expiration applies.

Seed 000: a record's deadline is stored and "not recalculated when the instance is
restarted or when the defaults on the SOW topic change". The stores keep no write-ahead
log, so after a SIGKILL the worker applies again what it applied since its last flush:
those records must get the default they got the first time, whatever the config of the
restarted worker says. The rule: a changed default applies to records that reach Kafka
after the worker restarts with it; records already in the log, including those written
while the worker was down, keep the default in force before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from amps_on_kafka.config import load_config
from amps_on_kafka.state.sow import ExpirySchedule
from amps_on_kafka.state.store import PartitionStore
from tests.sow.conftest import wait_caught_up

ROOT = Path(__file__).parents[2]


def write_config(path: Path, topic: str, expiration: str) -> Path:
    config = {
        "Topics": [{"Name": topic, "Partitions": 1}],
        "SOW": [{"Topic": topic, "Key": "/id", "Expiration": expiration}],
        "State": {"FlushEvery": "3600s"},  # nothing applied reaches disk before the kill
    }
    path.write_text(yaml.safe_dump(config))
    return path


# A worker in its own process that prints, after each batch it writes, how many records
# its stores hold the effect of (their next offsets: the stores start empty).
CHILD = """
import sys
from amps_on_kafka.config import load_config
from amps_on_kafka.processor.worker import Worker
config, bootstrap, state, topic = sys.argv[1:5]
worker = Worker(load_config(config), bootstrap, state, group_id="crash-expiration")
done = lambda _: print(sum(o or 0 for o in worker.next_offsets(topic).values()), flush=True)
worker.engine.add_listener(done)
worker.run()
"""


def kill_once_applied(config: Path, bootstrap: str, state: Path, topic: str, records: int) -> int:
    """Run a worker in its own process until it has applied `records`, then SIGKILL it.
    Returns what it had applied; a worker that never gets there is killed after 60 s."""
    args = [str(config), bootstrap, str(state), topic]
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    applied = 0
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            applied = int(line)
            if applied >= records:
                break
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
    return applied


@pytest.mark.parametrize(
    ("before", "after"),
    [("30s", "2s"), ("3s", "60s")],
    ids=["a 30s record is not cut to 2s", "a 3s record does not live on for 60s"],
)
def test_sigkill_then_a_changed_default_keeps_the_deadlines_of_records_already_in_the_log(
    bootstrap, topic_factory, publisher, start_worker, tmp_path, before, after
):
    topic = topic_factory(1, key=("/id",))
    state = tmp_path / "state"
    publisher.publish(topic, {"id": 1})
    publisher.publish_flush(30)
    old = write_config(tmp_path / "old.yaml", topic, before)
    assert kill_once_applied(old, bootstrap, state, topic, 1) == 1
    publisher.publish(topic, {"id": 2})  # reaches Kafka while no worker runs
    publisher.publish_flush(30)

    new = load_config(write_config(tmp_path / "new.yaml", topic, after))
    restarted = start_worker(new, state, clock=lambda: 0)  # nothing falls due meanwhile
    wait_caught_up(restarted, bootstrap, topic, 1)
    publisher.publish(topic, {"id": 3})  # after the restart: the new default
    publisher.publish_flush(30)
    wait_caught_up(restarted, bootstrap, topic, 1)

    store = restarted.engine.store(topic, 0)
    lifetimes = {r.sow_key: r.deadline - r.timestamp for r in store.scan()}
    seconds = {"30s": 30_000, "2s": 2_000, "3s": 3_000, "60s": 60_000}
    assert lifetimes == {"1": seconds[before], "2": seconds[before], "3": seconds[after]}
    assert restarted.applied == 3  # record 1 was applied again: the kill lost it


def test_sigkill_then_expiration_disabled_keeps_how_records_already_in_the_log_apply(
    bootstrap, topic_factory, publisher, start_worker, tmp_path
):
    """The same for the mode: with expiration enabled, a delta after its record's
    deadline starts a new record; applied again after a kill under `disabled`, it must
    still find that record expired rather than merge into it. Records that reach Kafka
    after the restart are applied with expiration off (seed 000: not processed)."""
    topic = topic_factory(1, key=("/id",))
    state = tmp_path / "state"

    def expired_then_delta(key: int) -> None:
        publisher.publish(topic, {"id": key, "a": 1}, expiration=0.001)
        publisher.publish_flush(30)
        time.sleep(0.01)  # not a wait for an event: the delta's LogAppendTime comes later
        publisher.delta_publish(topic, {"id": key, "b": 2})
        publisher.publish_flush(30)

    expired_then_delta(1)
    old = write_config(tmp_path / "old.yaml", topic, "enabled")
    assert kill_once_applied(old, bootstrap, state, topic, 2) == 2

    new = load_config(write_config(tmp_path / "new.yaml", topic, "disabled"))
    restarted = start_worker(new, state, clock=lambda: 0)
    wait_caught_up(restarted, bootstrap, topic, 1)
    expired_then_delta(2)
    wait_caught_up(restarted, bootstrap, topic, 1)

    store = restarted.engine.store(topic, 0)
    assert {r.sow_key: r.data for r in store.scan()} == {
        "1": {"id": 1, "b": 2},  # as the killed worker applied it: a new record
        "2": {"id": 2, "a": 1, "b": 2},  # expiration off: merged
    }
    assert restarted.applied == 4  # records 1 and 2 were applied again


def test_an_expiration_change_is_on_disk_before_anything_is_applied_with_it(tmp_path):
    """The store records each change durably at once (it has no write-ahead log): the
    entries survive a close without flush elsewhere, the boundaries only rise, and a
    change at the same boundary replaces the one before it."""
    store = PartitionStore(tmp_path / "s", "t", 0)
    assert store.expiry_history() == []
    store.record_expiry(30_000, True, 0)
    store.record_expiry(2_000, True, 10)
    assert store.record_expiry(None, False, 10) == [(0, 30_000, True), (10, None, False)]
    store.close()
    reopened = PartitionStore(tmp_path / "s", "t", 0)
    try:
        assert reopened.expiry_history() == [(0, 30_000, True), (10, None, False)]
    finally:
        reopened.close()


def test_defaults_no_record_will_be_applied_with_again_are_dropped(tmp_path):
    """A crash resumes at the stored next offset at the earliest: entries that end
    before it are never read again, so the list stays as short as the changes since."""
    store = PartitionStore(tmp_path / "s", "t", 0)
    try:
        store.record_expiry(1_000, True, 0)
        store.record_expiry(2_000, True, 5)
        store.write_replacements(store.replacements(), 8)  # it holds everything before 8
        assert store.record_expiry(3_000, True, 9) == [(5, 2_000, True), (9, 3_000, True)]
    finally:
        store.close()


def test_a_record_is_applied_with_the_last_entry_at_or_before_it():
    schedule = ExpirySchedule(((0, 30_000, True), (10, None, False), (20, 5_000, True)))
    assert [schedule.at(o)[0] for o in (0, 9, 10, 19, 20, 99)] == [
        30_000,
        30_000,
        None,
        None,
        5_000,
        5_000,
    ]
    assert schedule.at(15) == (None, False)
    assert schedule.expires_from(10)  # the records from 20 on expire
    assert not ExpirySchedule(((0, 30_000, True), (10, None, False))).expires_from(10)
    assert ExpirySchedule(((0, None, True), (10, None, False))).expires_from(9)
