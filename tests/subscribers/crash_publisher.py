"""A publisher with a FilePublishStore that can kill itself mid-stream (SIGKILL).

python crash_publisher.py BOOTSTRAP TOPIC STORE FIRST FLUSHED LAST

Publishes {"id": n % 5, "n": n} for n in [FIRST, LAST) through an HAClient named
"crash-publisher" with a FilePublishStore at STORE. After n = FLUSHED - 1 it waits for
Kafka's acknowledgement (publish_flush): those leave the store; the rest stay in it.
With FLUSHED < LAST it then prints "published", waits for a line on stdin (the test
checks the log meanwhile), publishes one more burst and sends itself SIGKILL without
flushing. Otherwise it flushes at the end and exits.
"""

from __future__ import annotations

import os
import signal
import sys

from amps_on_kafka.client import FilePublishStore, HAClient

BURST = 20


def main(bootstrap: str, topic: str, store: str, first: int, flushed: int, last: int) -> None:
    with HAClient(
        "crash-publisher",
        [f"kafka://{bootstrap}"],
        publish_store=FilePublishStore(store),
        flush_every=None,
    ) as ha:
        ha.connect_and_logon()  # republishes what the store kept from a previous run
        for n in range(first, min(flushed, last)):
            ha.publish(topic, {"id": n % 5, "n": n})
        ha.publish_flush(30)
        if flushed >= last:
            return
        for n in range(flushed, last - BURST):
            ha.publish(topic, {"id": n % 5, "n": n})
        print("published", flush=True)
        sys.stdin.readline()
        for n in range(last - BURST, last):
            ha.publish(topic, {"id": n % 5, "n": n})
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    bootstrap, topic, store = sys.argv[1:4]
    first, flushed, last = (int(arg) for arg in sys.argv[4:7])
    main(bootstrap, topic, store, first, flushed, last)
