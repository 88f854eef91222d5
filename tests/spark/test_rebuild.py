"""Cold rebuild: stores written by Spark feed a fresh worker that replays nothing."""

from __future__ import annotations

import uuid

from amps_on_kafka.processor.worker import Worker
from tests.spark.conftest import FILTER, run_cli, snapshot


def test_a_rebuilt_state_dir_serves_without_replaying(bootstrap, spark, history, tmp_path):
    state_dir = tmp_path / "state"
    args = ("rebuild", history.topic, "--state-dir", str(state_dir))
    args += ("--config", str(history.config_file))
    output = run_cli(bootstrap, *args)
    assert "1 log records were rejected" in output  # the bad envelope, skipped as the worker does
    point = history.points[1]
    worker = Worker(history.config, bootstrap, state_dir, group_id=f"g-{uuid.uuid4().hex[:8]}")
    worker.start()
    try:
        worker.wait_ready()
        assert worker.next_offsets(history.topic) == point.end  # resumes at the log end
        assert snapshot(worker, history.topic) == point.sow
        assert snapshot(worker, history.topic, FILTER) == point.filtered
        assert worker.applied == 0
        refused = run_cli(bootstrap, *args, exit_code=1)
        assert f"{state_dir} is in use by another worker or rebuild (PID " in refused
    finally:
        worker.stop()
    run_cli(bootstrap, *args)  # replaces the stores now that no worker holds them
    assert sorted(p.name for p in (state_dir / history.topic).iterdir()) == ["0", "1"]
