"""The memory a burst of large records leaves free goes back to the system.

glibc kept what Python and librdkafka freed after a batch: a worker that applied 300 MB
of 200 KB records sat at about 1.4 GiB resident, idle, with 22 MiB of live Python
objects. The worker's loop now trims at an idle turn (processor/memory.py).
"""

from __future__ import annotations

import time

from amps_on_kafka.log.kafka import end_offsets
from amps_on_kafka.processor import memory
from amps_on_kafka.processor.memory import IdleTrim, resident_bytes
from tests.sow.conftest import sow_config

MIB = 1024 * 1024
# What may stay: the stores' memtables (the records are the state) and what glibc can't
# trim; 244 MiB stayed before the idle trim.
KEPT = 128 * MIB


def test_a_burst_of_large_records_leaves_no_resident_memory_behind(
    bootstrap, topic_factory, publisher, start_worker
):
    topic = topic_factory(2, key=("/id",))
    worker = start_worker(sow_config(topic, 2))
    before = resident_bytes()
    assert before is not None  # Linux: /proc/self/statm
    blob = "x" * 200_000
    for i in range(500):  # 100 MB, 50 keys: the SOW itself stays small
        publisher.publish(topic, {"id": i % 50, "blob": blob})
    publisher.publish_flush(30)
    worker.wait_caught_up(topic, end_offsets(bootstrap, topic))
    # Both wait for the worker's idle turn: in a long run the process may already sit
    # below the allowance before the worker has trimmed at all.
    deadline = time.monotonic() + 10
    while resident_bytes() > before + KEPT or worker.idle_trim.trims < 1:  # type: ignore[operator]
        grown = (resident_bytes() - before) // MIB  # type: ignore[operator]
        trims = worker.idle_trim.trims
        assert time.monotonic() < deadline, f"{grown} MiB kept after the burst, {trims} trims"
        time.sleep(0.1)


def test_the_idle_trim_follows_applied_records_and_waits_an_interval_unless_memory_grew(
    monkeypatch,
):
    resident = [100 * MIB]
    monkeypatch.setattr(memory, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(memory, "release_freed_memory", lambda: None)
    trim = IdleTrim(slack=10 * MIB, interval=3600)
    trim.idle()  # the first idle turn sets the low mark: 100 MiB
    resident[0] = 120 * MIB
    trim.idle()  # nothing applied since: nothing can have been freed by the loop
    assert trim.trims == 0
    trim.applied()
    trim.idle()
    assert trim.trims == 1  # 120 MiB after it: the trim freed nothing
    trim.applied()
    trim.idle()  # above the low mark, but within the interval and not grown since
    assert trim.trims == 1
    resident[0] = 131 * MIB  # grew more than the slack since the last trim: at once
    trim.idle()
    assert (trim.trims, trim.low) == (2, 100 * MIB)  # the low mark never rises


def test_the_low_mark_is_taken_at_assignment_so_a_burst_before_any_idle_turn_is_trimmed(
    monkeypatch,
):
    resident = [100 * MIB]
    monkeypatch.setattr(memory, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(memory, "release_freed_memory", lambda: None)
    trim = IdleTrim(slack=10 * MIB, interval=3600)
    trim.mark()  # partitions assigned: 100 MiB
    resident[0] = 300 * MIB  # a burst applied before the loop's first idle turn
    trim.mark()  # a later rebalance does not move the mark
    trim.applied()
    trim.idle()
    assert (trim.trims, trim.low) == (1, 100 * MIB)
