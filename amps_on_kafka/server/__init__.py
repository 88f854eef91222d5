"""The gateway: an AMPS-style command protocol over TCP, served inside each worker.

`Gateway` is loaded on first use: the client imports `server.frames` (the wire format
both ends share) without pulling in the engine and RocksDB behind the gateway.
"""

from typing import Any

__all__ = ["Gateway"]


def __getattr__(name: str) -> Any:
    if name == "Gateway":
        from amps_on_kafka.server.gateway import Gateway

        return Gateway
    raise AttributeError(f"module 'amps_on_kafka.server' has no attribute {name!r}")
