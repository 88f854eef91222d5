"""amps_on_kafka: AMPS-style State of the World, queues and bookmark replay on Apache Kafka.

The client API is loaded on first use (`from amps_on_kafka import Client` works), so that
the worker and the tools that import only the lower layers (log, state, expr) don't pull
the client in with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

EPOCH = "0"
NOW = "0|1|"
MOST_RECENT = "recent"

__all__ = [
    "COMPLETED",
    "EPOCH",
    "MOST_RECENT",
    "NOW",
    "AsyncClient",
    "Client",
    "Command",
    "HAClient",
    "Message",
    "MessageStream",
]

if TYPE_CHECKING:
    from amps_on_kafka.client import (
        COMPLETED,
        AsyncClient,
        Client,
        Command,
        HAClient,
        Message,
        MessageStream,
    )

_LAZY = frozenset(__all__) - {"EPOCH", "MOST_RECENT", "NOW"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from amps_on_kafka import client

        return getattr(client, name)
    raise AttributeError(f"module 'amps_on_kafka' has no attribute {name!r}")
