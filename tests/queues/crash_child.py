"""A queue worker to SIGKILL: `python -m tests.queues.crash_child CONFIG_JSON STATE_DIR`.

It subscribes to the queue with a large backlog, acknowledges every message whose `n`
is even and holds the others' leases. It prints `acked <bookmark>` once an ack is
durable (answered) and `held <bookmark>` for a lease it keeps, so the test knows what
the queue must look like after the crash.
"""

from __future__ import annotations

import os
import sys
import threading

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

    def deliver(message: QueueMessage) -> None:
        if message.data["n"] % 2:
            say(f"held {message.bookmark}")
            return
        future = engine.ack(queue, message.bookmark, "child")
        future.add_done_callback(lambda f, bm=message.bookmark: say(f"acked {bm}"))

    engine.start()
    engine.wait_ready()
    engine.subscribe(queue, deliver, session="child", sub_id="child", max_backlog=1000)
    say("ready")
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
