"""What a worker checks before it starts: everything that would otherwise fail later,
deep in a thread, as a traceback or a timeout.

- The configuration serves something (a SOW topic or a queue).
- No other worker (or `amps-kafka spark rebuild`) uses the state directory: an
  exclusive lock held for the worker's life, so a second worker fails naming the
  directory and the holder's PID instead of meeting RocksDB's own LOCK error when a
  partition moves to it.
- The SOW topics exist, and each queue's UnderlyingTopic matches a topic, checked
  against one metadata request: a queue over nothing is named with its pattern within
  seconds, not after the 60 s wait for readiness.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from amps_on_kafka.config import Config
from amps_on_kafka.errors import AmpsError, ConfigError, UnknownTopic
from amps_on_kafka.log.kafka import admin_client, topic_names

LOCK_FILE = "worker.lock"


class StateDirBusy(AmpsError):
    """Another process holds the state directory's lock."""


def check_serves_something(config: Config, source: str = "the configuration") -> None:
    """`source` names the config in the message (the CLI gives the file)."""
    if not config.sow and not config.queues:
        raise ConfigError(
            f"{source} has no SOW topic and no queue, so a worker would serve nothing: "
            "declare a SOW: or a Queues: section"
        )


class StateDirLock:
    """An exclusive flock on ``<state dir>/worker.lock``, which holds the owner's PID.

    The kernel drops a flock when its process dies, so a crashed worker never leaves
    a stale lock behind.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            file = self.path.open("a+", encoding="ascii")
        except OSError as exc:
            raise ConfigError(
                f"can't use {self.path.parent} as a state directory: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(file)
            file.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise StateDirBusy(
                f"state directory {self.path.parent} is in use by another worker or "
                f"rebuild{f' (PID {holder})' if holder else ''}: stop it, or use another "
                "--state-dir"
            ) from None
        file.truncate(0)
        file.write(f"{os.getpid()}\n")
        file.flush()
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor drops the lock
            self._file = None

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(file: IO[str]) -> str:
    file.seek(0)
    text = file.read(32).strip()
    return text if text.isdigit() else ""


def check_topics(bootstrap: str, config: Config) -> None:
    """Every SOW topic exists and every queue's UnderlyingTopic matches a topic."""
    existing = topic_names(admin_client(bootstrap), internal=True)
    missing = [sow.topic for sow in config.sow if sow.topic not in existing]
    if missing:
        raise UnknownTopic(
            f"SOW topic {', '.join(map(repr, missing))} does not exist on Kafka "
            "(create it with amps-kafka topics create --config)"
        )
    for queue in config.queues:
        if not any(queue.views(name) for name in existing if not name.startswith("_")):
            raise UnknownTopic(
                f"queue {queue.name}: no topic matches {queue.underlying} "
                "(create one, or fix the pattern)"
            )
