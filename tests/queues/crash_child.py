"""A queue worker to SIGKILL: `python -m tests.queues.crash_child CONFIG_JSON STATE_DIR
[BACKLOG [BELOW]]`.

It subscribes to the queue with a large backlog (or BACKLOG), acknowledges every message
whose `n` is even (or, given BELOW, below it) and holds the others' leases. It prints
`acked <bookmark>` once an ack is durable (answered) and `held <bookmark>` for a lease
it keeps, so the test knows what the queue must look like after the crash.
"""

from __future__ import annotations

import os
import sys
import threading
from queue import SimpleQueue

import orjson

from amps_on_kafka.config import Config
from amps_on_kafka.processor.queues import QueueEngine, QueueMessage

_print_lock = threading.Lock()


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
