"""What the worker tells its listeners after each batch is durable in RocksDB.

The gateway is the main listener: it turns changes into subscription deliveries and
oof messages, and command results into sow_delete acks. Listeners run on the worker's
thread while it holds the engine lock, so they must only hand work off, never block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
    rejection: str | None = None  # with an error: its category (state/sow.py, _kind)


Replaced = tuple[str, bytes]  # a publish applied blind: its sow key and its record as stored


class BatchApplied:
    """One durable batch: its changes, in log order, and its command results.

    A batch of plain publishes applied blind lists each as a Replaced pair, and the
    pairs become Change objects only when a listener first reads `changes`: with no
    subscriber, a batch costs no object per record. The first read may come from any
    thread (the gateway reads on its event loop), so building them takes a lock.
    """

    __slots__ = ("__weakref__", "_build", "_changes", "_lock", "results")

    def __init__(
        self,
        changes: list[Change] | list[Replaced],
        results: list[CommandResult],
        build: Callable[[str, bytes], Change] | None = None,
    ) -> None:
        self._changes = changes
        self._build = build  # set when `changes` holds Replaced pairs
        self._lock = threading.Lock()
        self.results = results

    @property
    def changes(self) -> list[Change]:
        if self._build is not None:
            with self._lock:
                if self._build is not None:
                    build = self._build
                    self._changes = [build(key, stored) for key, stored in self._changes]
                    self._build = None
        return self._changes  # type: ignore[return-value]

    def size(self) -> tuple[int, int]:
        """How many changes the batch holds and the bytes of their records, without
        building Change objects: what a listener that keeps the batch a while holds."""
        changes = self._changes  # pairs or Change objects, whichever is there now
        if changes and isinstance(changes[0], tuple):
            return len(changes), sum(len(stored) for _, stored in changes)  # type: ignore[misc]
        held = 0
        for change in changes:
            for record in (change.old, change.new):  # type: ignore[union-attr]
                if record is not None:
                    held += len(record.payload)
        return len(changes), held
