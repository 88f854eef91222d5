"""Is a Kafka broker answering? Asked through the admin client, never by reading a log.

A metadata request that lists at least one broker means the listener is up and the broker
has caught up with the controller: exactly what a client needs before it can work.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from amps_on_kafka.log.kafka import admin_client

_PROBE_CONFIG = {
    # Retry a refused connection quickly instead of librdkafka's backoff of up to 10 s.
    "reconnect.backoff.ms": 100,
    "reconnect.backoff.max.ms": 500,
}


def refused(bootstrap: str, timeout: float = 1.0) -> bool:
    """Whether every address of ``bootstrap`` refuses a TCP connection: nothing listens
    there now, which a command can say at once instead of after librdkafka's retries.
    An address that can't be resolved, doesn't answer within ``timeout`` or isn't a
    plain HOST:PORT is not "refused": the metadata request (answers) has the last word.
    """
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return False
        except ConnectionRefusedError:
            continue
        except (OSError, ValueError):
            return False
    return True


def answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """Whether a broker at ``bootstrap`` answers a metadata request within ``timeout``."""
    return await_answer(bootstrap, timeout, alive=lambda: True)


def await_answer(bootstrap: str, timeout: float, *, alive: Callable[[], bool]) -> bool:
    """Ask for metadata until the broker answers (True), ``alive()`` is False or time is up.

    Each request waits at most one second, so a broker process that dies is noticed
    within about a second. "Connection refused" is expected while a broker starts: its
    log lines go to the librdkafka logger at DEBUG (log/kafka.py), never to stderr.
    """
    admin = admin_client(bootstrap, **_PROBE_CONFIG)
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0 and alive():
        try:
            if admin.list_topics(timeout=min(1.0, remaining)).brokers:
                return True
        except KafkaException:
            continue
    return False
