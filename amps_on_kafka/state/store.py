"""One RocksDB per (topic, partition): the SOW, its expiry index and the consumed offset.

Column families: `sow` (sow key → record), `expiry` (deadline + sow key → nothing, so a
sweep reads only what is due, in deadline order) and `meta` (the next offset to consume,
and from which offset each expiration config is in force: expiry_history).
State and offset are written in ONE WriteBatch, so the store always holds exactly the
effect of the records before its offset, and the worker resumes there with no loss and
no double-applied delta.

RocksDB's write-ahead log is off: the Kafka log is the log. A crash loses what was
written since the last flush, state and offset alike (atomic_flush flushes every column
family together), and the worker re-applies those records from the offset that did
reach disk. RocksDB flushes when a memtable fills; the worker also calls flush() every
State.FlushEvery, so the records to re-apply are always recent enough for the log's
retention to still hold them. A clean close flushes everything.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from rocksdict import (
    BlockBasedOptions,
    Cache,
    ColumnFamily,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from amps_on_kafka.config.model import DEFAULT_WRITE_BUFFER_BYTES
from amps_on_kafka.errors import AmpsError, MessageError
from amps_on_kafka.expr.raw import RawCheck
from amps_on_kafka.log.codecs import Codec, JsonCodec
from amps_on_kafka.state.events import Replaced
from amps_on_kafka.state.record import (
    HEADER_SIZE,
    NEVER,
    SowRecord,
    deadline_of,
    unpack_header,
)

COLUMN_FAMILIES = ("sow", "expiry", "meta")
_OFFSET_KEY = b"next_offset"
_EXPIRY_KEY = b"expiry_history"
# present: every change of the state is in the changelog whose Kafka topic id it holds
_CHANGELOG_KEY = b"changelogged"
_EXPIRY_ENTRY = struct.Struct(">qq?")  # from offset, default in ms (-1: none), expiring
History = list[tuple[int, int | None, bool]]  # (from offset, default ms or None, expiring)
_UNREAD = object()
_DEADLINE = struct.Struct(">q")
# Expiry entries one sweep takes at most: the worker writes and announces each slice
# before it takes the next, so the last record of a burst waits for one slice's work
# (~7 us a record), not the whole burst's (docs/performance.md, "Expiration lag").
SWEEP_SLICE = 1_000


def _column_options(write_buffer_bytes: int) -> Options:
    options = Options(raw_mode=True)
    options.set_write_buffer_size(write_buffer_bytes)
    options.set_max_write_buffer_number(3)  # as Kafka Streams: a slow flush stalls no write
    return options


# One LRU block cache for the `sow` column family of every store of the process. RocksDB
# gives each column family of each store its own 8 MiB when none is set, less than a store
# of 100k records of ~200 bytes: a get that misses reads and decompresses its block (a
# random point get's CPU at its 99th percentile: 30 us with 8 MiB, 15 with 32 MiB or more,
# docs/performance.md). Shared, many partitions take no more than one.
SOW_BLOCK_CACHE_BYTES = 64 * 1024 * 1024


@cache
def _sow_block_cache() -> Cache:
    """Made at the first store's opening, not at import (a process that opens none)."""
    return Cache(SOW_BLOCK_CACHE_BYTES)


def _sow_options(write_buffer_bytes: int) -> Options:
    options = _column_options(write_buffer_bytes)
    table = BlockBasedOptions()
    table.set_block_cache(_sow_block_cache())
    options.set_block_based_table_factory(table)
    return options


def _options(write_buffer_bytes: int) -> Options:
    options = _column_options(write_buffer_bytes)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.increase_parallelism(2)
    options.set_atomic_flush(True)  # every column family reaches disk in the same flush
    return options


_NO_WAL = WriteOptions()
_NO_WAL.disable_wal = True


def store_path(state_dir: Path, topic: str, partition: int) -> Path:
    return Path(state_dir) / topic / str(partition)


class StoreUnavailable(AmpsError):
    """A partition's store that RocksDB can't open: locked by another process, or
    damaged. The message names the directory and says how to recover."""

    @classmethod
    def locked(cls, path: Path, cause: object) -> StoreUnavailable:
        return cls(
            f"the store {path} is locked by another process ({cause}): stop the other "
            "worker that uses this state directory, or give this one another --state-dir"
        )

    @classmethod
    def damaged(cls, path: Path, cause: object) -> StoreUnavailable:
        return cls(
            f"the store {path} is damaged ({cause}). To recover, stop the worker and delete "
            "that directory (or move it away to keep it): the worker then rebuilds the "
            "partition from the start of its log, which gives the whole SOW only while "
            "retention still holds every record of the partition (docs/operations.md, "
            "'A damaged state directory')"
        )


def _open_db(path: Path, write_buffer_bytes: int) -> Rdict:
    """Open a store's RocksDB, or say what is wrong and how to recover. A directory with
    table files but no CURRENT would otherwise be opened as a new, empty store, and the
    partition silently rebuilt from whatever the log still holds."""
    if not (path / "CURRENT").exists() and any(path.glob("MANIFEST-*")):
        raise StoreUnavailable.damaged(path, "its CURRENT file is missing")
    cf_options = {name: _column_options(write_buffer_bytes) for name in COLUMN_FAMILIES}
    cf_options["sow"] = _sow_options(write_buffer_bytes)
    try:
        return Rdict(str(path), _options(write_buffer_bytes), column_families=cf_options)
    except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's status
        text = str(exc)
        if text.startswith("IO error: lock") or "/LOCK:" in text:
            raise StoreUnavailable.locked(path, text) from exc
        raise StoreUnavailable.damaged(path, text) from exc


class StateBatch:
    """The state changes of one batch of log records, read-your-writes, written at once.

    `records` holds each touched key's record after the batch (None when deleted);
    `stored` holds the record before the batch, for the keys that were read. A key may
    be written blind (a publish needs no old record when nobody asks for it): its old
    expiry entry is then left behind, and the sweep, which checks every due entry
    against the record, removes it (see `due`).
    """

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        self.records: dict[str, SowRecord | None] = {}
        self.stored: dict[str, SowRecord | None] = {}
        self.swept: list[bytes] = []  # due expiry entries, all removed by write()
        self.next_offset: int | None = None

    def prefetch(self, sow_keys: Iterable[str]) -> None:
        """Read every key a batch will touch in one multi-get instead of one get each."""
        wanted = [k for k in dict.fromkeys(sow_keys) if k not in self.records]
        found = {r.sow_key: r for r in self.store.get_many(wanted)}
        for key in wanted:
            self.stored[key] = self.records[key] = found.get(key)

    def get(self, sow_key: str) -> SowRecord | None:
        record = self.records.get(sow_key, _UNREAD)
        if record is _UNREAD:
            record = self.stored[sow_key] = self.records[sow_key] = self.store.get(sow_key)
        return record  # type: ignore[return-value]

    def set(self, sow_key: str, record: SowRecord | None) -> None:
        self.records[sow_key] = record

    def changed(self) -> Iterator[tuple[str, SowRecord | None, SowRecord | None]]:
        """(key, record before or None if unknown or absent, record after or None when
        deleted) for each key the batch changed: what the store and the changelog write."""
        stored = self.stored
        for key, after in self.records.items():
            before = stored.get(key)
            if key in stored and before is after:
                continue  # read, never changed
            yield key, before, after

    def current(self) -> Iterator[SowRecord]:
        """Every live record as of this point in the batch (for deletes by filter)."""
        for record in self.store.scan():
            if record.sow_key not in self.records:
                yield record
        for record in list(self.records.values()):
            if record is not None:
                yield record


class Replacements:
    """Records replaced blind (SowRules.blind_publishes), staged as they are made.

    `put(raw key, record as stored)` writes straight into the WriteBatch, and `pairs`
    keeps (key, record as stored) for the listeners: a batch of publishes costs no
    object per record beyond those. Nothing is read, so a replaced record's old expiry
    entry stays behind, as for any blind write (see StateBatch); a key replaced twice
    keeps the later record.
    """

    def __init__(self, sow: ColumnFamily) -> None:
        self.writes = WriteBatch(raw_mode=True)
        self.writes.set_default_column_family(sow)
        self.put = self.writes.put
        self.pairs: list[Replaced] = []


class PartitionStore:
    """The state of one partition of one SOW topic."""

    def __init__(
        self,
        path: Path,
        topic: str,
        partition: int,
        codec: Codec | None = None,
        write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES,
    ) -> None:
        self.path = Path(path)
        self.topic = topic
        self.partition = partition
        self.codec = codec
        self.path.mkdir(parents=True, exist_ok=True)
        self._db = _open_db(self.path, write_buffer_bytes)
        self._sow = self._db.get_column_family("sow")
        self._expiry = self._db.get_column_family("expiry")
        self._meta = self._db.get_column_family("meta")
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._unflushed = False  # written since the last flush()
        # No expiry entry sorts below this key (b"": not known, from the first): a sweep
        # raises it past what it deleted, a write of an entry below it lowers it. `due`
        # and `next_deadline` seek to it, past the tombstones of earlier sweeps, which a
        # read from the first entry steps over one by one (a whole burst of them).
        self._expiry_floor = b""

    # -- reading ---------------------------------------------------------------------
    def next_offset(self) -> int | None:
        raw = self._meta.get(_OFFSET_KEY)
        return None if raw is None else _DEADLINE.unpack(raw)[0]

    def expiry_history(self) -> History:
        """The expiration config in force, (from offset, default ms or None, expiring),
        oldest first: what SowRules.expiry_at reads (an ExpirySchedule); empty for a new
        store."""
        raw = self._meta.get(_EXPIRY_KEY)
        return [] if raw is None else unpack_history(raw)

    def record_expiry(self, default_ms: int | None, expiring: bool, from_offset: int) -> History:
        """Put on disk, before anything is applied with it, that the records from this
        offset on are applied with this default and mode: the store has no write-ahead
        log, and a change lost in a crash would let the records before the boundary be
        applied with the new config.

        Entries no record will be applied with again are dropped: those that end at or
        before the stored next offset (a crash resumes there at the earliest). So the
        list holds at most the changes made since the last flush, plus one.
        """
        entries = [e for e in self.expiry_history() if e[0] < from_offset]
        entries.append((from_offset, default_ms, expiring))
        resume = self.next_offset() or 0
        while len(entries) > 1 and entries[1][0] <= resume:
            del entries[0]
        writes = WriteBatch(raw_mode=True)
        writes.put(_EXPIRY_KEY, pack_history(entries), self._handles["meta"])
        self._db.write(writes, _NO_WAL)
        self._unflushed = True
        self.flush()
        return entries

    def get(self, sow_key: str) -> SowRecord | None:
        raw = self._sow.get(sow_key.encode())
        return None if raw is None else self._record(sow_key.encode(), raw)

    def stored(self, raw_key: bytes) -> bytes | None:
        """The stored record of a key as it is (header and payload), or None."""
        stored: bytes | None = self._sow.get(raw_key)
        return stored

    def get_many(self, sow_keys: Iterable[str]) -> list[SowRecord]:
        keys = [k.encode() for k in sow_keys]
        if len(keys) < 2:  # one key (a look-up by key): a get is 5 us, a multi-get of one 12
            raw = self._sow.get(keys[0]) if keys else None
            return [] if raw is None else [self._record(keys[0], raw)]
        found = self._sow.get(keys)
        return [self._record(k, raw) for k, raw in zip(keys, found, strict=True) if raw is not None]

    def scan(self) -> Iterator[SowRecord]:
        """Every record, in key order, as of this call (the iterator is the snapshot)."""
        iterator = self._sow.iter()
        iterator.seek_to_first()
        return self._walk(iterator)

    def scan_matching(
        self,
        keep: Callable[[Any], bool] | None,
        expired_by: int | None,
        sure: RawCheck | None = None,
    ) -> Iterator[SowRecord]:
        """scan() without the records whose deadline is at or before `expired_by` (ms;
        None: none expire) or whose decoded payload `keep` refuses (a payload that does
        not decode is refused), as of this call. A filtered scan's checks run on the
        stored bytes, so a record skipped is never built: building every record was a
        fifth of a gateway's scan, and a filter drops half (docs/performance.md).

        `sure` (expr/raw.py, for a JSON store) answers `keep` on the stored record's
        bytes without decoding it, or None when it is not sure: only then is the
        payload decoded."""
        iterator = self._sow.iter()
        iterator.seek_to_first()
        decode = _decoder(self.codec)
        sure = sure if decode is orjson.loads else None
        return self._walk_matching(iterator, keep, expired_by, sure)

    def raw_scan(
        self, keep: Callable[[Any], bool] | None, expired_by: int | None, sure: RawCheck | None
    ) -> tuple[Any, Callable[[], SowRecord | None]] | None:
        """scan_matching() for code that reads the stored records itself (the compiled
        frames of a streamed scan, server/scans.py): the RocksDB iterator on the first
        record, as of this call, and `left()`, scan_matching's next record from the
        iterator's place on (None at the end), which leaves the iterator on the record it
        returns. None when `keep` can't be answered on the stored bytes (no `sure`, or a
        store of another codec than JSON)."""
        if keep is not None and (sure is None or _decoder(self.codec) is not orjson.loads):
            return None
        iterator = self._sow.iter()
        iterator.seek_to_first()
        return iterator, lambda: next(self._walk_matching(iterator, keep, expired_by, sure), None)

    def _walk_matching(
        self,
        iterator: Any,
        keep: Callable[[Any], bool] | None,
        expired_by: int | None,
        sure: RawCheck | None,
    ) -> Iterator[SowRecord]:
        topic, partition, codec = self.topic, self.partition, self.codec
        decode, unpack = _decoder(codec), unpack_header
        try:
            while iterator.valid():
                raw = iterator.value()
                offset, timestamp, deadline = unpack(raw)
                if expired_by is None or deadline == NEVER or deadline > expired_by:
                    data, kept = None, True
                    if keep is not None:
                        verdict = None if sure is None else sure(raw)
                        if verdict is not None:
                            kept = verdict
                        else:
                            try:
                                data = decode(raw[HEADER_SIZE:])
                                kept = keep(data)
                            except (MessageError, orjson.JSONDecodeError):  # can't match
                                kept = False
                    if kept:
                        key, payload = iterator.key().decode(), raw[HEADER_SIZE:]
                        yield SowRecord(
                            topic, partition, key, payload, offset, timestamp, deadline, codec, data
                        )
                iterator.next()
        finally:
            del iterator

    def _walk(self, iterator) -> Iterator[SowRecord]:
        try:
            while iterator.valid():
                yield self._record(iterator.key(), iterator.value())
                iterator.next()
        finally:
            del iterator

    def count(self) -> int:
        return sum(1 for _ in self._sow.keys())  # noqa: SIM118 - an Rdict is not a dict

    def estimated_count(self) -> int:
        """RocksDB's estimate of the records held, read from a property at no cost (count()
        reads every key): exact once compacted; a key replaced since the last flush or
        compaction may count more than once until then."""
        return self._sow.property_int_value("rocksdb.estimate-num-keys") or 0

    def due(self, now_ms: int, limit: int = SWEEP_SLICE) -> list[bytes]:
        """Expiry entries whose deadline is at or before now, earliest first, at most
        `limit` of them (a sweep's slice, see SWEEP_SLICE).

        An entry is either its record's deadline, so the record expires now, or left
        over from a record replaced blind; either way the sweep removes it.
        """
        entries = []
        for entry in self._expiry_entries():
            if _DEADLINE.unpack_from(entry)[0] > now_ms or len(entries) >= limit:
                break
            entries.append(entry)
        return entries

    def _expiry_entries(self) -> Iterator[bytes]:
        """The expiry entries in deadline order, from the floor (see __init__)."""
        return self._expiry.keys(from_key=self._expiry_floor or None)

    @staticmethod
    def key_of_entry(entry: bytes) -> str:
        return entry[_DEADLINE.size :].decode()

    def next_deadline(self) -> int | None:
        for entry in self._expiry_entries():
            return _DEADLINE.unpack_from(entry)[0]
        return None

    def record_of(self, sow_key: str, stored: bytes) -> SowRecord:
        return self._record(sow_key.encode(), stored)

    def _record(self, key: bytes, raw: bytes) -> SowRecord:
        return SowRecord.decode(self.topic, self.partition, key, raw, self.codec)

    # -- writing ---------------------------------------------------------------------
    def write(self, batch: StateBatch) -> None:
        """Apply a batch and its offset atomically (one WriteBatch)."""
        sow, expiry = self._handles["sow"], self._handles["expiry"]
        writes = WriteBatch(raw_mode=True)
        swept = set(batch.swept)
        lowest = None  # the lowest expiry entry put
        for key, before, after in batch.changed():
            raw_key = key.encode()
            if before is not None and before.deadline != NEVER:
                entry = _expiry_key(before.deadline, raw_key)
                if entry not in swept:  # deleted below, once
                    writes.delete(entry, expiry)
            if after is None:
                writes.delete(raw_key, sow)
                continue
            writes.put(raw_key, after.encode(), sow)
            if after.deadline != NEVER:
                entry = _expiry_key(after.deadline, raw_key)
                writes.put(entry, b"", expiry)
                lowest = entry if lowest is None else min(lowest, entry)
        for entry in batch.swept:
            writes.delete(entry, expiry)
        self._commit(writes, batch.next_offset)
        if batch.swept:  # `due` gave every entry from the floor to the last one swept
            self._expiry_floor = max(self._expiry_floor, batch.swept[-1][: _DEADLINE.size])
        self._lower_floor(lowest)

    def _lower_floor(self, entry: bytes | None) -> None:
        if entry is not None and entry < self._expiry_floor:
            self._expiry_floor = entry[: _DEADLINE.size]

    def replacements(self) -> Replacements:
        return Replacements(self._handles["sow"])

    def write_replacements(self, staged: Replacements, next_offset: int) -> None:
        """Records replaced blind and the offset after them, in one WriteBatch."""
        self._commit(staged.writes, next_offset)

    def _commit(self, writes: WriteBatch, next_offset: int | None) -> None:
        if next_offset is not None:
            writes.put(_OFFSET_KEY, _DEADLINE.pack(next_offset), self._handles["meta"])
        self._db.write(writes, _NO_WAL)
        self._unflushed = True

    def load(self, pairs: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Records restored from elsewhere (processor/changelog.py): each raw key's record
        as stored, or None to delete it, written blind with its deadline's expiry entry.
        A key loaded twice leaves its first deadline's entry behind, which the sweep
        removes as it does any left by a blind write (see `due`)."""
        sow, expiry = self._handles["sow"], self._handles["expiry"]
        writes = WriteBatch(raw_mode=True)
        for raw_key, stored in pairs:
            if stored is None:
                writes.delete(raw_key, sow)
                continue
            writes.put(raw_key, stored, sow)
            deadline = deadline_of(stored)
            if deadline != NEVER:
                entry = _expiry_key(deadline, raw_key)
                writes.put(entry, b"", expiry)
                self._lower_floor(entry)
        self._commit(writes, None)

    def load_position(self, next_offset: int, history: History) -> None:
        """After `load`: the offset the loaded records reflect and the expiration config
        they were applied with, then everything on disk (the offset is what marks a
        store as restored: one without it is restored again from the start)."""
        writes = WriteBatch(raw_mode=True)
        if history:
            writes.put(_EXPIRY_KEY, pack_history(history), self._handles["meta"])
        self._commit(writes, next_offset)
        self.flush()

    def changelogged(self) -> str | None:
        """The Kafka topic id of the changelog that has had every change of this store's
        state (it was restored from it, started empty with it, or was copied into it:
        processor/changelog.py); None if it was written while the changelog was off. A
        changelog deleted and created again has another id: the store is copied into it.
        A mark written before ids were kept reads "" (no id matches it)."""
        raw = self._meta.get(_CHANGELOG_KEY)
        return None if raw is None else raw.decode()

    def mark_changelogged(self, topic_id: str | None) -> None:
        writes = WriteBatch(raw_mode=True)
        if topic_id is not None:
            writes.put(_CHANGELOG_KEY, topic_id.encode(), self._handles["meta"])
        else:
            writes.delete(_CHANGELOG_KEY, self._handles["meta"])
        self._commit(writes, None)
        self.flush()

    def flush(self) -> None:
        """Put everything written so far on disk, every column family at the same point.

        rocksdict flushes one column family at a time, which would let the state and
        its offset reach disk at different points. A manual compaction flushes all of
        them in one atomic flush when atomic_flush is set; it is asked of `meta`, which
        holds one key, so the compaction itself costs nothing.
        """
        if self._unflushed:
            self._meta.compact_range(None, None)
            self._unflushed = False

    def close(self) -> None:
        del self._sow, self._expiry, self._meta, self._handles
        self._db.close()

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


def pack_history(entries: History) -> bytes:
    return b"".join(_EXPIRY_ENTRY.pack(o, -1 if d is None else d, on) for o, d, on in entries)


def unpack_history(raw: bytes) -> History:
    return [(o, None if ms < 0 else ms, on) for o, ms, on in _EXPIRY_ENTRY.iter_unpack(raw)]


def _expiry_key(deadline: int, sow_key: bytes) -> bytes:
    return _DEADLINE.pack(deadline) + sow_key


def _decoder(codec: Codec | None) -> Callable[[bytes], Any]:
    """What SowRecord.data decodes with; for JSON orjson itself, whose error means what
    the codec's MessageError does (a scan makes a call per record)."""
    if codec is None:
        return _no_data
    return orjson.loads if type(codec) is JsonCodec else codec.decode


def _no_data(payload: bytes) -> None:
    """A store without a codec: its records' data is None (SowRecord.data)."""
    return None
