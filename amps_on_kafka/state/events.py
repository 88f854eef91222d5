"""What the worker tells its listeners after each batch is durable in RocksDB.

The gateway is the main listener: it turns changes into subscription deliveries and
oof messages, and command results into sow_delete acks. Listeners run on the worker's
thread while it holds the engine lock, so they must only hand work off, never block.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from amps_on_kafka.state.record import SowRecord


class ChangeKind(StrEnum):
    UPSERT = "upsert"  # publish or delta_publish; `new` is the full record after the merge
    DELETE = "delete"  # sow_delete; `old` is the record removed
    EXPIRE = "expire"  # the record's deadline passed; `old` is the record removed


@dataclass(slots=True)
class Change:
    topic: str
    sow_key: str
    kind: ChangeKind
    old: SowRecord | None
    new: SowRecord | None


@dataclass(slots=True)
class CommandResult:
    """One log record applied: how many records it deleted, or why it was rejected."""

    topic: str
    partition: int
    offset: int
    command: str
    publisher_id: str | None
    sequence: int | None
    correlation_id: str | None
    deleted: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BatchApplied:
    changes: list[Change]
    results: list[CommandResult]
