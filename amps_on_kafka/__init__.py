"""amps_on_kafka: AMPS-style State of the World, queues and bookmark replay on Apache Kafka.

`Client` is loaded on first use, so that the worker and the tools that import only the
lower layers (log, state, expr) don't pull the client in with them.
"""

from typing import Any

EPOCH = "0"
NOW = "0|1|"
MOST_RECENT = "recent"

__all__ = ["EPOCH", "MOST_RECENT", "NOW", "Client", "MessageStream"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "MessageStream"):
        from amps_on_kafka import client

        return getattr(client, name)
    raise AttributeError(f"module 'amps_on_kafka' has no attribute {name!r}")
