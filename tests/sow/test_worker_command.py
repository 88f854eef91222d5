"""`amps-kafka worker` as its own process: SIGTERM stops it cleanly (issue 4, item 1).

The stores run without RocksDB's write-ahead log, so a clean stop is what puts every
applied record on disk: after SIGTERM the stores must hold the whole SOW and the offset
after it, and a restart then has nothing to re-apply.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import yaml

from amps_on_kafka.client import Client
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.state.store import PartitionStore, store_path

ROOT = Path(__file__).parents[2]


def test_sigterm_stops_the_worker_with_every_applied_record_on_disk(
    bootstrap, sow_topic, publisher, tmp_path
):
    config = tmp_path / "worker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "Topics": [{"Name": sow_topic, "Partitions": 2}],
                "SOW": [{"Topic": sow_topic, "Key": "/id"}],
                "Authentication": {"Anonymous": True},
            }
        )
    )
    state = tmp_path / "state"
    command = [sys.executable, "-m", "amps_on_kafka.cli", "worker", "--config", str(config)]
    command += ["--state-dir", str(state), "--listen", "127.0.0.1:0", "-b", bootstrap]
    command += ["--log-level", "WARNING"]  # the test stops reading stderr once ready
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        address = next(
            line.split("tcp://")[1].split("/")[0]
            for line in process.stderr  # type: ignore[union-attr]
            if "worker ready" in line
        )
        with Client("watcher") as watcher:
            watcher.connect(f"tcp://{address}/amps/json")
            watcher.logon()
            with watcher.subscribe(sow_topic, timeout=30) as stream:
                for i in range(300):
                    publisher.publish(sow_topic, {"id": i % 30, "v": i})
                publisher.publish_flush(10)
                delivered = [message for _, message in zip(range(300), stream, strict=False)]
        assert len(delivered) == 300  # each one delivered after its batch was written
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    on_disk = {}
    next_offsets = 0
    for partition in (0, 1):
        store = PartitionStore(store_path(state, sow_topic, partition), sow_topic, partition, JSON)
        on_disk.update({r.sow_key: r.data["v"] for r in store.scan()})
        next_offsets += store.next_offset() or 0
        store.close()
    assert next_offsets == 300
    assert on_disk == {str(k): 270 + k for k in range(30)}
