"""Exactly-once state: SIGKILL the worker mid-storm, restart, compare with a replay (item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from amps_on_kafka.config import load_config
from tests.sow.conftest import wait_caught_up
from tests.sow.test_worker import reference_sow

ROOT = Path(__file__).parents[2]


def storm(publisher, topic: str, count: int, halfway: threading.Event) -> None:
    """Publishes and deltas whose order matters: a doubled or lost delta changes the end."""
    for i in range(count):
        if i % 4 == 0:
            publisher.publish(topic, {"id": i % 40, "base": i})
        else:
            publisher.delta_publish(topic, {"id": i % 40, f"f{i % 5}": i, "last": i})
        if i % 500 == 499:
            publisher.publish_flush(30)
        if i == count // 2:
            halfway.set()
    publisher.publish_flush(30)


def test_sigkill_mid_storm_then_restart_gives_the_replayed_sow(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    config = {
        "Topics": [{"Name": sow_topic, "Partitions": 2}],
        "SOW": [{"Topic": sow_topic, "Key": "/id"}],
    }
    config_file = tmp_path / "worker.yaml"
    config_file.write_text(yaml.safe_dump(config))
    state = tmp_path / "state"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.sow.worker_process",
            str(config_file),
            bootstrap,
            str(state),
            "crash-a",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    halfway = threading.Event()
    publishing = threading.Thread(target=storm, args=(publisher, sow_topic, 8000, halfway))
    publishing.start()
    try:
        assert halfway.wait(60)
        applied = 0
        for line in process.stdout:  # the worker is applying the storm as it arrives
            applied = int(line.split()[1])
            if applied > 1000:
                break
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        publishing.join(120)
        if process.poll() is None:
            process.kill()
    assert applied > 1000
    restarted = start_worker(load_config(config_file), state, group="crash-b")
    wait_caught_up(restarted, bootstrap, sow_topic, 2)
    got = {r.sow_key: (r.data, r.offset) for r in restarted.engine.query(sow_topic).records}
    assert got == reference_sow(bootstrap, restarted, sow_topic)
    assert restarted.applied < 8000  # resumed from its stored offsets, not from EPOCH
