"""One RocksDB per queue: its messages, the acks that came early, and how far it has read.

Column families: `entries` (arrival number → message and counts, so iteration is arrival
order), `early` (bookmark → what the events log said about a message not read yet) and
`meta` (next offset to read in each underlying partition, the next events-log offset the
state reflects, the next arrival number, the recovery point).

A checkpoint is prepared from the state machine's changes, then written only once every
event it reflects is durable in Kafka (`commit`): the store is always exactly the effect
of the underlying partitions before its offsets and of the events log before its events
offset, so a restart resumes from there and replays the rest. Leases are never stored:
a restart returns them to the queue.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rocksdict import ColumnFamily, Options, Rdict, WriteBatch

from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.native import core
from amps_on_kafka.state.queue_store_runs import _UnstoredRunsTwin
from amps_on_kafka.state.queue_types import (
    TP,
    Early,
    EventKind,
    MessageId,
    QueueEntry,
    QueueEvent,
    Reason,
    RecoveryPoint,
    Status,
)

COLUMN_FAMILIES = ("entries", "early", "meta")
GONE = (Status.REMOVED, Status.TAKEN)  # out of the queue: deleted from the store
_SEQ = struct.Struct(">q")
_LAST_SEQ = 2**63 - 1
_LENGTH = struct.Struct(">I")
_POSITIONS, _EVENTS, _NEXT_SEQ, _RECOVERY = b"positions", b"events", b"next_seq", b"recovery"
_RUNS = b"runs"
NO_DEADLINE = -1


def queue_store_path(state_dir: Path, queue: str) -> Path:
    return Path(state_dir) / "_queues" / queue


@dataclass
class StoredQueue:
    """What a store holds, as read back at startup."""

    positions: dict[TP, int]
    events_offset: int
    next_seq: int
    entries: list[QueueEntry]
    early: dict[MessageId, Early]
    # the messages left in their topics, to read again (UnstoredRuns.state())
    runs: list[list[Any]] = field(default_factory=list)


def encode_entry(entry: QueueEntry) -> bytes:
    meta = orjson.dumps(
        [
            *entry.id,
            entry.timestamp,
            NO_DEADLINE if entry.deadline is None else entry.deadline,
            entry.rank,
            entry.barrier,
            entry.deliveries,
            entry.cancels,
            entry.ev_pos,
            [(name, _text(value)) for name, value in entry.headers or ()],
        ]
    )
    return b"".join((_LENGTH.pack(len(meta)), meta, entry.payload))


def _put_entries_twin(
    batch: WriteBatch,
    column: ColumnFamily,
    entries: Iterable[QueueEntry],
    runs: Any = None,
) -> None:
    """put_entries in Python: what the compiled core leaves to it, or all without it."""
    removed = []
    for entry in entries:
        if entry.status in GONE:
            if entry.stored:  # the number as its key holds it (struct's error if it can't)
                removed.append(_SEQ.unpack(_SEQ.pack(entry.seq))[0])
            elif runs is not None:
                runs.leave(*entry.id)
            continue
        if runs is not None and not entry.stored:
            if entry.cancels == 0 and (entry.deliveries == 0 or not runs.deliveries_counted):
                runs.note(*entry.id, entry.seq)
                continue
            runs.leave(*entry.id)
        batch.put(_SEQ.pack(entry.seq), encode_entry(entry), column)
        entry.stored = True
    _delete_runs(batch, column, removed)


# A run of at least this many consecutive arrival numbers that left the queue is deleted
# from the store as one range. A queue acked in order removes thousands of consecutive
# entries between checkpoints: a tombstone a key cost RocksDB ~1 us a message (the batch's
# delete and its write), a range a few a checkpoint; a short run keeps a key each, as
# RocksDB's reads slow with many range tombstones.
DELETE_RANGE_FROM = 8


def _delete_runs(batch: WriteBatch, column: ColumnFamily, seqs: list[int]) -> None:
    """The stored copies of entries that left the queue deleted, after the checkpoint's
    puts (no arrival number is both), each run of DELETE_RANGE_FROM or more as one range:
    the keys of non-negative numbers sort as the numbers do, and the entries' column
    holds no other kind of key."""
    seqs.sort()
    at, count = 0, len(seqs)
    while at < count:
        end = at + 1
        while end < count and seqs[end] == seqs[end - 1] + 1:
            end += 1
        first, after = seqs[at], seqs[end - 1] + 1
        if end - at >= DELETE_RANGE_FROM and first >= 0 and after <= _LAST_SEQ:
            batch.delete_range(_SEQ.pack(first), _SEQ.pack(after), column)
        else:
            for seq in seqs[at:end]:
                batch.delete(_SEQ.pack(seq), column)
        at = end


# One call a checkpoint: each changed entry put in `column` of the batch (encoded by
# encode_entry), or deleted from it once it left the queue if it was ever stored
# (`_delete_runs`); given the queue's UnstoredRuns, a message that only waited is noted
# there instead of put, and leaves its run when it leaves the queue or is put
# (state/queue_store_runs.py). The compiled core writes encode_entry's bytes itself
# (~1 us of the queue thread a message that outlives a checkpoint, in Python).
put_entries: Callable[..., None] = (
    core.EntryWriter(QueueEntry, GONE, _put_entries_twin, DELETE_RANGE_FROM).put
    if core is not None
    else _put_entries_twin
)
UnstoredRuns: Callable[..., Any] = core.UnstoredRuns if core is not None else _UnstoredRunsTwin


def _text(value: bytes | None) -> str | None:
    """A header value as JSON can hold it: any bytes as latin-1 text; a header may have
    no value at all (Kafka allows it), which is null."""
    return None if value is None else value.decode("latin-1")


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def decode_entry(seq: int, raw: bytes, codec_of: Callable[[str], Codec | None]) -> QueueEntry:
    (length,) = _LENGTH.unpack_from(raw)
    start = _LENGTH.size
    topic, partition, offset, timestamp, deadline, *counts, headers = orjson.loads(
        raw[start : start + length]
    )
    rank, barrier, deliveries, cancels, ev_pos = counts
    return QueueEntry(
        (topic, partition, offset),
        timestamp,
        raw[start + length :],
        codec_of(topic),
        [(name, _bytes(value)) for name, value in headers] or None,
        stored=True,
        seq=seq,
        deadline=None if deadline == NO_DEADLINE else deadline,
        rank=rank,
        barrier=barrier,
        deliveries=deliveries,
        cancels=cancels,
        ev_pos=ev_pos,
    )


def _message_key(message: MessageId) -> bytes:
    return orjson.dumps(message)


def encode_events(events: list[QueueEvent]) -> bytes:
    """One record of the queue-events log: every event of one change, in order."""
    return orjson.dumps([[kind, *id, d, c, reason] for kind, id, d, c, reason in events])


def decode_events(raw: bytes) -> list[QueueEvent]:
    return [
        QueueEvent(
            EventKind(kind),
            (topic, partition, offset),
            deliveries,
            cancels,
            None if reason is None else Reason(reason),
        )
        for kind, topic, partition, offset, deliveries, cancels, reason in orjson.loads(raw)
    ]


class QueueStore:
    """The durable state of one queue."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        cf_options = {name: Options(raw_mode=True) for name in COLUMN_FAMILIES}
        self._db = Rdict(str(self.path), options, column_families=cf_options)
        self._families = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}

    # -- reading ---------------------------------------------------------------------
    def load(self, codec_of: Callable[[str], Codec | None]) -> StoredQueue | None:
        """The stored queue, or None when nothing was ever committed to this store."""
        meta = self._families["meta"]
        events = meta.get(_EVENTS)
        if events is None:
            return None
        positions = {
            (topic, partition): offset
            for topic, partition, offset in orjson.loads(meta.get(_POSITIONS) or b"[]")
        }
        early = {
            tuple(orjson.loads(key)): Early(*orjson.loads(value))
            for key, value in self._families["early"].items()
        }
        return StoredQueue(
            positions,
            _SEQ.unpack(events)[0],
            _SEQ.unpack(meta.get(_NEXT_SEQ))[0],
            list(self._entries(codec_of)),
            early,  # type: ignore[arg-type]
            orjson.loads(meta.get(_RUNS) or b"[]"),
        )

    def _entries(self, codec_of: Callable[[str], Codec | None]) -> Iterator[QueueEntry]:
        for key, value in self._families["entries"].items():
            yield decode_entry(_SEQ.unpack(key)[0], value, codec_of)

    def recovery_point(self) -> RecoveryPoint | None:
        raw = self._families["meta"].get(_RECOVERY)
        if raw is None:
            return None
        offsets, events = orjson.loads(raw)
        return RecoveryPoint({(t, p): o for t, p, o in offsets}, events)

    # -- writing ---------------------------------------------------------------------
    def prepare(
        self,
        changed: dict[MessageId, QueueEntry],
        early: dict[MessageId, Early | None],
        positions: dict[TP, int],
        next_seq: int,
        recovery: RecoveryPoint,
        runs: Any = None,
    ) -> WriteBatch:
        """A checkpoint of the state as it is now, to `commit` once its events are durable;
        with `runs` (the queue's UnstoredRuns), messages that only waited are left in their
        topics and noted there, the runs stored with the checkpoint."""
        entries, early_cf, meta = (self._handles[n] for n in COLUMN_FAMILIES)
        batch = WriteBatch(raw_mode=True)
        if runs is None:
            put_entries(batch, entries, changed.values())
            batch.delete(_RUNS, meta)  # a policy that stores every message now
        else:
            put_entries(batch, entries, changed.values(), runs)
            batch.put(_RUNS, orjson.dumps(runs.state()), meta)
        for message, value in early.items():
            if value is None:
                batch.delete(_message_key(message), early_cf)
            else:
                fields = [value.ev_pos, value.removed, value.deliveries, value.cancels]
                batch.put(_message_key(message), orjson.dumps(fields), early_cf)
        batch.put(_POSITIONS, orjson.dumps([[*tp, o] for tp, o in positions.items()]), meta)
        batch.put(_NEXT_SEQ, _SEQ.pack(next_seq), meta)
        offsets = [[*tp, o] for tp, o in recovery.offsets.items()]
        batch.put(_RECOVERY, orjson.dumps([offsets, recovery.events]), meta)
        return batch

    def commit(self, batch: WriteBatch, events_offset: int) -> None:
        """Write a prepared checkpoint: it reflects the events log before `events_offset`."""
        batch.put(_EVENTS, _SEQ.pack(events_offset), self._handles["meta"])
        self._db.write(batch)

    def close(self) -> None:
        del self._families, self._handles
        self._db.close()
