"""Reading command headers: typed fields, and a clear reason when one is wrong.

Every accessor raises ProtocolError (an AmpsError) naming the key, so a malformed
command becomes a failure ack and never an exception the session doesn't expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.expr import Filter, compile_filter

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

ACK_TYPES = frozenset({"received", "processed", "persisted", "completed", "stats"})
MAX_BATCH = 10_000


class ProtocolError(AmpsError, ValueError):
    """A command is malformed: a key is missing, has the wrong type, or is not allowed."""


@dataclass(slots=True)
class Request:
    """One command as received: its header, its payload and the acks it asked for.

    Not frozen, though nothing assigns its fields (dataclasses.replace makes a changed
    copy): a frozen dataclass is built through object.__setattr__, 1 us of every
    command against 0.2 us (docs/performance.md)."""

    header: dict[str, Any]
    payload: bytes
    acks: frozenset[str]

    @property
    def command(self) -> str:
        return self.header["c"]

    def wants(self, ack_type: str) -> bool:
        return ack_type in self.acks


def text(header: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = header.get(key)
    if value is None:
        if required:
            raise ProtocolError(f"{header.get('c')} needs {key!r}")
        return None
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{key!r} must be a non-empty string")
    return value


def number(header: dict[str, Any], key: str) -> float | None:
    value = header.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{key!r} must be a number, not {value!r}")
    return float(value)


def count(
    header: dict[str, Any], key: str, *, default: int | None = None, limit: int | None = None
) -> int | None:
    value = header.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"{key!r} must be a whole number >= 0, not {value!r}")
    if limit is not None and value > limit:
        raise ProtocolError(f"{key!r} must be at most {limit}, not {value}")
    return value


def words(header: dict[str, Any], key: str) -> frozenset[str]:
    """A comma-separated list (`a`, `o`), as AMPS spells them."""
    value = header.get(key)
    if value is None:
        return frozenset()
    if not isinstance(value, str):
        raise ProtocolError(f"{key!r} must be a comma-separated string")
    return frozenset(w.strip() for w in value.split(",") if w.strip())


def acks(header: dict[str, Any]) -> frozenset[str]:
    wanted = words(header, "a")
    unknown = wanted - ACK_TYPES
    if unknown:
        known = ", ".join(sorted(ACK_TYPES))
        raise ProtocolError(f"unknown ack type(s) {', '.join(sorted(unknown))} (use {known})")
    return wanted


def options(header: dict[str, Any], allowed: frozenset[str]) -> frozenset[str]:
    given = words(header, "o")
    unknown = given - allowed
    if unknown:
        raise ProtocolError(f"option(s) {', '.join(sorted(unknown))} not supported here")
    return given


MAX_SOW_KEYS = 100_000  # keys one sow_delete may name: a record each, written at once


def sow_keys(header: dict[str, Any]) -> list[str] | None:
    """`k` as a JSON list of keys, or AMPS's comma-separated text (no commas inside keys).

    At most MAX_SOW_KEYS: a frame of MaxFrameBytes could name two million, each a record
    produced from the event loop, past what librdkafka queues (a gateway-wide stall)."""
    value = header.get("k")
    if value is None:
        return None
    if isinstance(value, str):
        keys = [k.strip() for k in value.split(",") if k.strip()]
    elif isinstance(value, list) and all(isinstance(k, str) for k in value):
        keys = value
    else:
        raise ProtocolError("'k' must be a list of SOW keys or a comma-separated string")
    if len(keys) > MAX_SOW_KEYS:
        raise ProtocolError(
            f"'k' names {len(keys):,} keys: a sow_delete deletes at most {MAX_SOW_KEYS:,} "
            "keys a command; split the list"
        )
    return keys


def content_filter(header: dict[str, Any]) -> Filter | None:
    """The compiled `f`; a FilterError (with its position) is the failure reason."""
    value = text(header, "f")
    return compile_filter(value) if value is not None else None


async def compiled_filter(session: Session, header: dict[str, Any]) -> Filter | None:
    """content_filter on the gateway's pool: compiling 64 KiB of filter is 0.1-0.2 s of
    Python, which on the event loop kept every other session waiting."""
    if text(header, "f") is None:
        return None
    return await session.gateway.blocking(content_filter, header)
