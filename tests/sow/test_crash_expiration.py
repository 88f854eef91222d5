"""Defect 8: a crash must not recompute stored deadlines (seed 000).

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
from pathlib import Path

import pytest
import yaml

from amps_on_kafka.config import load_config
from amps_on_kafka.state.sow import DefaultSchedule
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


def kill_once_applied(config: Path, bootstrap: str, state: Path, records: int) -> int:
    """Run a worker in its own process until it has applied `records`, then SIGKILL it.
    Returns what it had applied; a worker that never gets there is killed after 60 s."""
    args = [str(config), bootstrap, str(state), "crash-expiration"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sow.worker_process", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    applied = 0
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            applied = int(line.split()[1])
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
    assert kill_once_applied(old, bootstrap, state, 1) == 1
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


def test_a_default_change_is_on_disk_before_anything_is_applied_with_it(tmp_path):
    """The store records each change durably at once (it has no write-ahead log): the
    entries survive a close without flush elsewhere, the boundaries only rise, and a
    change at the same boundary replaces the one before it."""
    store = PartitionStore(tmp_path / "s", "t", 0)
    assert store.expiration_defaults() == []
    store.record_default(30_000, 0)
    store.record_default(2_000, 10)
    assert store.record_default(None, 10) == [(0, 30_000), (10, None)]
    store.close()
    reopened = PartitionStore(tmp_path / "s", "t", 0)
    try:
        assert reopened.expiration_defaults() == [(0, 30_000), (10, None)]
    finally:
        reopened.close()


def test_defaults_no_record_will_be_applied_with_again_are_dropped(tmp_path):
    """A crash resumes at the stored next offset at the earliest: entries that end
    before it are never read again, so the list stays as short as the changes since."""
    store = PartitionStore(tmp_path / "s", "t", 0)
    try:
        store.record_default(1_000, 0)
        store.record_default(2_000, 5)
        batch_end = store.replacements()
        store.write_replacements(batch_end, 8)  # the store holds everything before 8
        assert store.record_default(3_000, 9) == [(5, 2_000), (9, 3_000)]
    finally:
        store.close()


def test_a_record_takes_the_default_of_the_last_boundary_at_or_before_it():
    schedule = DefaultSchedule(((0, 30_000), (10, None), (20, 5_000)))
    assert [schedule.at(o) for o in (0, 9, 10, 19, 20, 99)] == [
        30_000,
        30_000,
        None,
        None,
        5_000,
        5_000,
    ]
    assert schedule.has_default_from(10)  # the records from 20 on take one
    assert not DefaultSchedule(((0, 30_000), (10, None))).has_default_from(10)
