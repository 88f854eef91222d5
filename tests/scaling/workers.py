"""Worker processes of one group, started with `amps-kafka worker`, for the multi-worker
test and the scaling benchmark (bench/scaling.py): each can be SIGKILLed and restarted
on its state directory with its instance id."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).parents[2]


def write_config(
    path: Path,
    topic: str,
    partitions: int,
    session_timeout: float,
    standby: bool = False,
    changelog: bool = False,
    queue: str | None = None,
) -> Path:
    """A config serving one SOW topic keyed by /id, anonymous logons (a test's); with
    `queue`, also a queue over a one-partition topic of that name."""
    config = {
        "Topics": [{"Name": topic, "Partitions": partitions}],
        "SOW": [{"Topic": topic, "Key": "/id", "Changelog": changelog}],
        "Worker": {"SessionTimeout": session_timeout, "Standby": standby},
        "Authentication": {"Anonymous": True},
    }
    if queue is not None:
        config["Topics"].append({"Name": queue, "Partitions": 1})
        config["Queues"] = [{"Name": queue, "LeasePeriod": "60s"}]
    path.write_text(yaml.safe_dump(config))
    return path


def start_all(workers: Iterable[WorkerProcess]) -> None:
    """Start every worker, then wait until each serves: they start side by side, not
    each after the last is ready."""
    workers = list(workers)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.wait_ready()


class WorkerProcess:
    """`amps-kafka worker` with instance id `name`, state in `base/name`."""

    def __init__(self, name: str, config: Path, bootstrap: str, group: str, base: Path) -> None:
        self.name = name
        self.config = config
        self.bootstrap = bootstrap
        self.group = group
        self.state = base / name
        self.ready_file = base / f"{name}.ready"
        self.log = base / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.address: str | None = None
        self.killed = False  # set before the signal: its sockets may close before it's reaped

    def start(self) -> WorkerProcess:
        command = [sys.executable, "-m", "amps_on_kafka.cli", "worker"]
        command += ["--config", str(self.config), "--state-dir", str(self.state)]
        command += ["--listen", "127.0.0.1:0", "-b", self.bootstrap, "--group", self.group]
        command += ["--instance-id", self.name, "--ready-file", str(self.ready_file)]
        command += ["--log-level", "INFO"]
        self.ready_file.unlink(missing_ok=True)
        self.address = None  # a new port: the old address answers no more
        self.killed = False
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stderr=log, stdout=log)
        return self

    def wait_ready(self, timeout: float = 90.0) -> str:
        """The gateway's URI once the ready file says it serves."""
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.process is None or self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker {self.name} not ready:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.address = orjson.loads(self.ready_file.read_bytes())["gateway"]
        return self.address

    def kill(self) -> None:
        """SIGKILL: no tombstone, no leaving the group, stores as the crash left them."""
        if self.process is not None and self.process.poll() is None:
            self.killed = True
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: alive but silent (a long pause); `thaw` resumes it."""
        self.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.process is not None and not self.killed and self.process.poll() is None
