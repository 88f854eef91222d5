"""Exactly-once state: SIGKILL the worker mid-storm, restart, compare with a replay (item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import yaml

from amps_on_kafka.config import load_config
from amps_on_kafka.log.kafka import end_offsets
from tests.sow.conftest import wait_caught_up
from tests.sow.test_worker import reference_sow
from tests.sow.worker_process import spawn

MAX_STORM = 200_000


def storm(publisher, topic: str, stop: threading.Event, worker: subprocess.Popen) -> None:
    """Publishes and deltas whose order matters, until told to stop: a doubled or lost
    delta changes the end. If the storm runs its course without being stopped, it kills
    the worker itself, so the test fails instead of waiting forever for another line."""
    for i in range(MAX_STORM):
        if stop.is_set():
            break
        if i % 4 == 0:
            publisher.publish(topic, {"id": i % 40, "base": i})
        else:
            publisher.delta_publish(topic, {"id": i % 40, f"f{i % 5}": i, "last": i})
        if i % 500 == 499:
            publisher.publish_flush(30)
    else:
        worker.kill()
    publisher.publish_flush(30)


def flushed(state: Path) -> bool:
    """Whether every partition's store has finished a flush, so some state and its
    offsets survive a kill. RocksDB's LOG records `flush_finished` once the table is in
    the manifest; a table file alone can be there before that (a kill then loses it)."""
    stores = [path for path in state.glob("*/*") if path.is_dir()]
    return len(stores) == 2 and all(_flush_finished(store) for store in stores)


def _flush_finished(store: Path) -> bool:
    log = store / "LOG"
    return log.exists() and '"event": "flush_finished"' in log.read_text(errors="replace")


def test_sigkill_mid_storm_then_restart_gives_the_replayed_sow(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    """The stores keep no write-ahead log: the kill loses what was applied since their
    last flush, state and offsets alike, and the restart re-applies it from the log. A
    short FlushEvery makes them flush during the storm, so the restart resumes from
    stored offsets mid-storm rather than rebuilding."""
    config = {
        "Topics": [{"Name": sow_topic, "Partitions": 2}],
        "SOW": [{"Topic": sow_topic, "Key": "/id"}],
        "State": {"FlushEvery": "100ms"},
    }
    config_file = tmp_path / "worker.yaml"
    config_file.write_text(yaml.safe_dump(config))
    state = tmp_path / "state"
    process = spawn(config_file, bootstrap, state, "crash-a")
    stop = threading.Event()
    publishing = threading.Thread(target=storm, args=(publisher, sow_topic, stop, process))
    publishing.start()
    applied = 0
    try:
        for line in process.stdout:  # the worker is applying the storm as it arrives
            applied = int(line.split()[1])
            if applied > 4000 and flushed(state):
                break
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        stop.set()
        publishing.join(120)
        if process.poll() is None:
            process.kill()
    assert applied > 4000
    restarted = start_worker(load_config(config_file), state, group="crash-b")
    wait_caught_up(restarted, bootstrap, sow_topic, 2)
    got = {r.sow_key: (r.data, r.offset) for r in restarted.engine.query(sow_topic).records}
    assert got == reference_sow(bootstrap, restarted, sow_topic)
    in_log = sum(end_offsets(bootstrap, sow_topic).values())
    assert restarted.applied < in_log  # resumed from its stored offsets, not from EPOCH
