"""A queue worker to SIGKILL: `python -m tests.queues.crash_child CONFIG_JSON STATE_DIR
[BACKLOG [BELOW]]`.

It subscribes to the queue with a large backlog (or BACKLOG), acknowledges every message
whose `n` is even (or, given BELOW, below it) and holds the others' leases. It prints
`acked <bookmark>` once an ack is durable (answered) and `held <bookmark>` for a lease
it keeps, so the test knows what the queue must look like after the crash.

The tests start it with `crashing`, which SIGKILLs it however the test's block ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import SimpleQueue

import orjson

from amps_on_kafka.config import Config
from amps_on_kafka.processor.queues import QueueEngine, QueueMessage

_print_lock = threading.Lock()
ROOT = Path(__file__).parents[2]  # where `-m tests.queues.crash_child` is found


@contextmanager
def crashing(
    config: Config, state_dir: Path, bootstrap: str, *args: int
) -> Iterator[subprocess.Popen[str]]:
    """This module's worker for `config` (its state in `state_dir`, Kafka at `bootstrap`,
    BACKLOG and BELOW as `args`), its lines on the child's stdout; SIGKILLed when the
    block ends, as it raised or not, so no test leaves a worker behind."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.queues.crash_child",
            config.model_dump_json(by_alias=True),
            str(state_dir),
            *map(str, args),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
    )
    try:
        yield child
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    config = Config.model_validate(orjson.loads(sys.argv[1]))
    engine = QueueEngine(config, os.environ["KAFKA_BOOTSTRAP_SERVERS"], sys.argv[2])
    queue = config.queues[0].name
    backlog = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    below = int(sys.argv[4]) if len(sys.argv) > 4 else None
    to_ack: SimpleQueue[str] = SimpleQueue()

    def deliver(message: QueueMessage) -> None:
        n = message.data["n"]
        if n % 2 if below is None else n >= below:
            say(f"held {message.bookmark}")
        elif below is not None:  # from another thread: an ack's dispatch calls deliver
            to_ack.put(message.bookmark)
        else:
            ack(message.bookmark)

    def ack(bookmark: str) -> None:
        future = engine.ack(queue, bookmark, "child")
        future.add_done_callback(lambda f: say(f"acked {bookmark}"))

    def acker() -> None:
        while True:
            ack(to_ack.get())

    threading.Thread(target=acker, daemon=True).start()
    engine.start()
    engine.wait_ready()
    engine.subscribe(queue, deliver, session="child", sub_id="child", max_backlog=backlog)
    say("ready")
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
