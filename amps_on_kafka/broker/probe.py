"""Is a Kafka broker answering, and if not, why? Asked through the admin client (log.kafka
.await_answer), never by reading a log.

A metadata request that lists at least one broker means the listener is up, the client is
let in and the broker has caught up with the controller: exactly what a client needs
before it can work.
"""

from __future__ import annotations

import socket

from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import ConnectionErrors, await_answer


def refused(bootstrap: str, timeout: float = 1.0) -> bool:
    """Whether every address of ``bootstrap`` refuses a TCP connection: nothing listens
    there now, which a command can say at once instead of after librdkafka's retries.
    An address that can't be resolved, doesn't answer within ``timeout`` or isn't a
    plain HOST:PORT is not "refused": the metadata request has the last word.
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


def require_answer(bootstrap: str, timeout: float, *, hint: str = "") -> None:
    """Return once a broker at ``bootstrap`` answers; else a TransportError with one line
    saying why: the connection was refused, the broker refused the credentials, the TLS
    handshake failed (both at once, not after ``timeout``), or nothing answered within
    ``timeout`` (with the last error librdkafka reported, if any). ``hint`` ends it.
    """
    if refused(bootstrap):
        why = "connection refused"
    else:
        errors = ConnectionErrors(bootstrap)
        if await_answer(bootstrap, timeout, alive=lambda: True, errors=errors):
            return
        reason = errors.reason()
        if errors.decisive is not None:
            raise TransportError(f"Kafka at {bootstrap} {reason}")
        why = f"waited {timeout:.0f} s" + (f": {reason}" if reason else "")
    raise TransportError(f"no Kafka broker answers at {bootstrap} ({why}){hint}")
