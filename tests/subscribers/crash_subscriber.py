"""A subscriber that processes out of order and can kill itself mid-stream (SIGKILL).

python crash_subscriber.py BOOTSTRAP TOPIC STORE OUTPUT WINDOW KILL_AFTER

Bookmark-subscribes to TOPIC from MOST_RECENT with a LoggedBookmarkStore at STORE, holds
WINDOW messages at a time and processes each window newest first (seed 003's moving
windows): processing appends the message's "n" to OUTPUT, then discards it. After
KILL_AFTER messages processed (-1: never) it sends itself SIGKILL; otherwise it stops at
the completed marker, once every held message is processed.
"""

from __future__ import annotations

import os
import signal
import sys

from amps_on_kafka import MOST_RECENT
from amps_on_kafka.client import Client, LoggedBookmarkStore
from amps_on_kafka.log.message import COMPLETED


def main(bootstrap: str, topic: str, store_path: str, output: str, window: int, kill: int) -> None:
    out = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    processed = 0

    def process(held: list) -> None:
        nonlocal processed
        for message in reversed(held):
            os.write(out, b"%d\n" % message.data["n"])
            message.discard()
            processed += 1
            if processed == kill:
                os.kill(os.getpid(), signal.SIGKILL)
        held.clear()

    with Client("crash-subscriber") as client, LoggedBookmarkStore(store_path) as store:
        client.connect(f"kafka://{bootstrap}")
        client.set_bookmark_store(store)
        held: list = []
        with client.bookmark_subscribe(topic, MOST_RECENT, sub_id="windows") as stream:
            for message in stream:
                if message is COMPLETED:
                    process(held)
                    return
                held.append(message)
                if len(held) == window:
                    process(held)


if __name__ == "__main__":
    bootstrap, topic, store, output, window, kill = sys.argv[1:7]
    main(bootstrap, topic, store, output, int(window), int(kill))
