"""The SOW engine: the worker's state as the gateway sees it.

The worker thread applies batches under `lock` and then calls every listener with a
BatchApplied, still under the lock. A query takes the lock only to create its RocksDB
iterators (each one an implicit snapshot) and, for sow_and_subscribe, to add its
listener in the same moment: the snapshot and the live stream meet with no gap and no
duplicate.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from amps_on_kafka.config import Config, SowConfig
from amps_on_kafka.errors import FilterError, MessageError, PartitionsMoving, UnknownTopic
from amps_on_kafka.expr import Expression, Filter, compile_expression
from amps_on_kafka.expr.keys import KeyEquality
from amps_on_kafka.expr.raw import RawCheck, raw_check
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.keys import key_from_values
from amps_on_kafka.processor.collections import let_go
from amps_on_kafka.state.events import BatchApplied
from amps_on_kafka.state.record import HEADER_SIZE, SowRecord
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore

Listener = Callable[[BatchApplied], None]
T = TypeVar("T")
#: A SowRecord's fields after its topic and before its codec, as a query holds them.
Row = tuple[int, str, bytes, int, int, int]


class Records(Sequence[SowRecord]):
    """A query's records, held as rows of plain values and made SowRecords when read.

    Why: CPython's cyclic collector stops tracking a tuple of strings, bytes and ints the
    first time it sees one, but tracks a SowRecord all its life. Half a million SowRecords
    held by a scan made the collector's full passes (several while the list grew) walk
    them all with the GIL held: up to 0.7-1.8 s in which no other session, heartbeats
    included, got an answer. Rows cost the collector nothing; the records made from them
    while a batch is sent die with the batch.
    """

    __slots__ = ("codec", "rows", "topic")

    def __init__(self, topic: str, codec: Codec | None, rows: list[Row]) -> None:
        self.topic = topic
        self.codec = codec
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> SowRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Records: ...

    def __getitem__(self, index: int | slice) -> SowRecord | Records:
        if isinstance(index, slice):
            return Records(self.topic, self.codec, self.rows[index])
        return self._record(self.rows[index])

    def __iter__(self) -> Iterator[SowRecord]:
        return map(self._record, self.rows)

    def take(self) -> Iterator[SowRecord]:
        """Each record in order, its row let go as it is read (len() stays; the records
        are gone after). A million rows freed at once, after the last batch was sent,
        held the event loop (every session) for 0.1-0.3 s; see collections.let_go."""
        rows = self.rows
        for index in range(len(rows)):
            row, rows[index] = rows[index], None
            yield self._record(row)

    def _record(self, row: Row) -> SowRecord:
        return SowRecord(self.topic, *row, codec=self.codec)


# a store, its RocksDB iterator on the next record, and scan_matching's next record from there
RawScan = tuple[PartitionStore, Any, Callable[[], SowRecord | None]]


@dataclass(frozen=True)
class RawScans:
    """A scan's stores as SowEngine.raw_scans gives them, the compiled check of its filter
    (None: no filter) and the expiry clock it was taken at (ms; None: nothing expires)."""

    stores: list[RawScan]
    check: RawCheck | None
    expired_by: int | None


@dataclass
class QueryResult:
    records: Sequence[SowRecord]
    matches: int  # records that matched, before top_n


class SowEngine:
    def __init__(
        self, config: Config, rules: dict[str, SowRules], clock: Callable[[], int]
    ) -> None:
        self.config = config
        # sow_config's answers (Config.sow_for's: the first of a topic), a look-up's two
        # asks of it were a linear search each (the config is frozen)
        self._sow = {sow.topic: sow for sow in reversed(config.sow)}
        self.rules = rules
        self.clock = clock
        self.lock = threading.RLock()
        self.ready = threading.Event()  # set once startup expiry of the first assignment ran
        self.assignment_changed = threading.Event()  # set at every attach and detach
        self._assignment_listeners: list[Callable[[], None]] = []  # called likewise
        # Partitions attached but still catching up with the log end as of their
        # assignment (the offset they must reach): not served to other gateways.
        self._restoring: dict[tuple[str, int], int] = {}
        self._stores: dict[tuple[str, int], PartitionStore] = {}
        # _owned's answer per topic, until the next attach or detach (under the lock)
        self._owned_by_topic: dict[str, tuple[PartitionStore, ...]] = {}
        self._listeners: list[Listener] = []
        self._previous_wanted: Counter[str] = Counter()

    # -- topics -----------------------------------------------------------------
    def sow_config(self, topic: str) -> SowConfig:
        sow = self._sow.get(topic)
        if sow is None:
            raise UnknownTopic(f"{topic!r} is not a SOW topic of this worker")
        return sow

    def is_sow_topic(self, topic: str) -> bool:
        return topic in self._sow

    def partitions(self, topic: str) -> list[int]:
        """The partitions of a topic this worker owns now (others live on other workers)."""
        with self.lock:
            return sorted(p for t, p in self._stores if t == topic)

    # -- the worker's side --------------------------------------------------------
    def serving(self, topic: str) -> list[int]:
        """The partitions of a topic held here that have caught up with the log as it
        was when they were assigned: those a query spread over the workers may use (a
        partition restoring from the log would answer with part of its records)."""
        with self.lock:
            return [p for p in self.partitions(topic) if (topic, p) not in self._restoring]

    def attach(self, store: PartitionStore, restore_to: int = 0) -> None:
        """Hold `store`; it serves once it has applied the log up to `restore_to`."""
        key = (store.topic, store.partition)
        with self.lock:
            self._stores[key] = store
            self._owned_by_topic = {}
            if (store.next_offset() or 0) < restore_to:
                self._restoring[key] = restore_to
        self._assignment_changed()

    def restored(self, topic: str, partition: int, position: int) -> None:
        """The worker's consumer stands at `position` in the partition: serve it once
        that reaches the log end it had to catch up with."""
        key = (topic, partition)
        with self.lock:
            if self._restoring.get(key, position) > position:
                return
            self._restoring.pop(key, None)
        self._assignment_changed()

    def restoring(self) -> list[tuple[str, int]]:
        with self.lock:
            return list(self._restoring)

    def detach(self, topic: str, partition: int) -> PartitionStore | None:
        with self.lock:
            store = self._stores.pop((topic, partition), None)
            self._owned_by_topic = {}
            self._restoring.pop((topic, partition), None)
        self._assignment_changed()
        return store

    def on_assignment(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the worker's thread: it must not block) at every attach
        and detach: the gateway announces what this worker holds (server/membership.py)."""
        self._assignment_listeners.append(listener)

    def _assignment_changed(self) -> None:
        self.assignment_changed.set()
        for listener in list(self._assignment_listeners):
            listener()

    def wants_previous(self, topic: str) -> bool:
        """Whether a listener needs each upsert's old record (an oof subscription does).

        Without one, a publish to a topic without expiration replaces its record unread.
        The worker asks before a batch and again under the lock before notifying.
        """
        return self._previous_wanted[topic] > 0

    def store(self, topic: str, partition: int) -> PartitionStore | None:
        return self._stores.get((topic, partition))

    def stores(self) -> list[PartitionStore]:
        with self.lock:
            return list(self._stores.values())

    def notify(self, applied: BatchApplied) -> None:
        """Called by the worker under the lock, after the batch is durable."""
        for listener in list(self._listeners):
            listener(applied)

    # -- the gateway's side -------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        with self.lock:
            self._listeners.append(listener)

    def want_previous(self, topic: str) -> None:
        with self.lock:
            self._previous_wanted[topic] += 1

    def release_previous(self, topic: str) -> None:
        with self.lock:
            self._previous_wanted[topic] -= 1

    def remove_listener(self, listener: Listener) -> None:
        with self.lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def query(
        self,
        topic: str,
        filter: Filter | None = None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        listener: Listener | None = None,
        partitions: Collection[int] | None = None,
    ) -> QueryResult:
        """The records of a SOW topic that match, as of one consistent moment.

        A filter that pins every Key path is answered by point lookups. With `listener`,
        the listener is added in the same moment the snapshot is taken. With `partitions`
        (a gateway asking for its part of a query), only those, which must all be held
        here: PartitionsMoving otherwise.
        """
        sow = self.sow_config(topic)
        rules = self.rules[topic]
        terms = order_terms(order_by) if order_by else None  # a bad order_by fails first
        sources, expired = self._snapshot(topic, sow, filter, listener, partitions)
        kept = _rows_kept(sources, filter, terms, expired)
        matches, rows = len(kept), kept
        if terms is not None:
            rows = sort_pairs(kept, terms)
            let_go(kept)  # the (sort values, row) pairs: see let_go
        if top_n is not None and top_n < len(rows):
            rows, dropped = rows[:top_n], rows
            let_go(dropped)
        return QueryResult(Records(topic, rules.codec, rows), matches)

    def look_up(
        self, topic: str, filter: Filter | KeyEquality, sow_keys: list[str]
    ) -> QueryResult | None:
        """query(topic, filter) of a filter that pins every Key path to `sow_keys` (the
        caller found them: filter.equalities and key_from_values, or a KeyEquality's key;
        `filter` is only asked `matches`), or None while the worker
        holds the lock: the gateway's event loop asks, and must not wait out a batch
        being applied (it takes the pool's query() then).

        The same point gets, expiry as of the same moment and filter check as query(),
        without its general machinery (the stores sorted, the key pinned a second time,
        rows and a Records for a record or two): that was two thirds of a look-up's CPU
        on the gateway, and its tail (docs/performance.md)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            found = [r for store in self._owned(topic) for r in store.get_many(sow_keys)]
            now = self.clock()
        finally:
            self.lock.release()
        return self.kept(topic, filter, found, now)

    def stored(
        self, topic: str, sow_key: str
    ) -> tuple[list[tuple[PartitionStore, bytes]], int] | None:
        """look_up's read of one key, the stored bytes as they are: each owned store that
        holds `sow_key` with its stored record, and the clock, in one moment under the
        lock (None while the worker holds it, as look_up). A key look-up's answer is
        written from these bytes by the compiled core (server/queries.py _key_answer),
        with no SowRecord made; where it is not sure, kept() decides on the records."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            raw = sow_key.encode()
            found = [
                (s, stored) for s in self._owned(topic) if (stored := s.stored(raw)) is not None
            ]
            now = self.clock()
        finally:
            self.lock.release()
        return found, now

    def kept(
        self, topic: str, filter: Filter | KeyEquality, records: list[SowRecord], now: int
    ) -> QueryResult:
        """The records of a look-up that query() would give as of `now`: not expired,
        and matching `filter`."""
        rules = self.rules[topic]
        kept = [r for r in records if not rules.is_expired(r, now) and _matches(filter, r)]
        return QueryResult(kept, len(kept))

    def stream(self, topic: str, filter: Filter | None = None) -> Iterator[SowRecord]:
        """query() without order_by, top_n or listener, one record at a time as the
        sources are read: the same consistent moment (each source is a snapshot taken
        here), so a gateway sends the first records while it reads the rest."""
        sow = self.sow_config(topic)
        if filter is None or filter.equalities(list(sow.key)) is None:
            return self._scan(topic, filter)
        sources, expired = self._snapshot(topic, sow, filter)
        return (
            record
            for source in sources
            for record in source
            if not expired(record) and _matches(filter, record)
        )

    def _scan(self, topic: str, filter: Filter | None) -> Iterator[SowRecord]:
        """stream() of a filter that pins no key: each store's scan, its checks run on
        the stored bytes (PartitionStore.scan_matching), every scan and the expiry clock
        taken in one moment under the lock, as _snapshot takes a query's."""
        keep, sure = None, None
        if filter is not None:
            keep, sure = filter.matches, raw_check(filter, HEADER_SIZE)
        with self.lock:
            expired_by = self.clock() if self.rules[topic].expiring else None
            owned = self._owned(topic)
            sources = [store.scan_matching(keep, expired_by, sure) for store in owned]
        return itertools.chain.from_iterable(sources)

    def raw_scans(self, topic: str, filter: Filter | None) -> RawScans | None:
        """stream() for code that reads the stored records itself (server/scans.py): each
        store's raw_scan taken in one moment, as _scan takes them; None when a filter pins
        a key or a store can't be read so."""
        sow = self.sow_config(topic)
        if filter is not None and filter.equalities(list(sow.key)) is not None:
            return None
        keep = None if filter is None else filter.matches
        sure = None if filter is None else raw_check(filter, HEADER_SIZE)
        with self.lock:
            expired_by = self.clock() if self.rules[topic].expiring else None
            scans = [(s, s.raw_scan(keep, expired_by, sure)) for s in self._owned(topic)]
        if any(scan is None for _, scan in scans):
            return None
        return RawScans([(store, *scan) for store, scan in scans], sure, expired_by)  # type: ignore[misc]

    def _snapshot(
        self,
        topic: str,
        sow: SowConfig,
        filter: Filter | None,
        listener: Listener | None = None,
        partitions: Collection[int] | None = None,
    ) -> tuple[list[Iterator[SowRecord]], Callable[[SowRecord], bool]]:
        """The sources of a query, taken in one moment, and whether a record has expired
        as of that moment."""
        rules = self.rules[topic]
        with self.lock:
            owned = self._owned(topic, partitions)
            sources = [self._source(store, filter, sow) for store in owned]
            if listener is not None:
                self._listeners.append(listener)
            now = self.clock()
        return sources, lambda record: rules.is_expired(record, now)

    def _owned(
        self, topic: str, partitions: Collection[int] | None = None
    ) -> Sequence[PartitionStore]:
        """The topic's stores held here, by partition (the caller holds the lock). Kept
        per topic until the next attach or detach: sorting every store was a tenth of a
        key look-up's CPU on the gateway (docs/performance.md)."""
        owned = self._owned_by_topic.get(topic)
        if owned is None:
            owned = tuple(s for (t, _), s in sorted(self._stores.items()) if t == topic)
            self._owned_by_topic[topic] = owned
        if partitions is None:
            return owned
        self.held(topic, partitions)
        return [s for s in owned if s.partition in partitions]

    def held(self, topic: str, partitions: Collection[int]) -> None:
        """PartitionsMoving unless every one of `partitions` is held here now (a peer's
        gateway asks for its part of a query: server/cluster.py)."""
        missing = set(partitions) - set(self.serving(topic))
        if missing:
            raise PartitionsMoving(
                f"retry: partitions moving ({topic} partition(s) "
                f"{', '.join(map(str, sorted(missing)))} not held by this worker now)"
            )

    @staticmethod
    def _source(
        store: PartitionStore, filter: Filter | None, sow: SowConfig
    ) -> Iterator[SowRecord]:
        pinned = filter.equalities(list(sow.key)) if filter is not None else None
        if pinned is not None:
            return iter(store.get_many(key_from_values(values) for values in pinned))
        return store.scan()


def _rows_kept(
    sources: list[Iterator[SowRecord]],
    filter: Filter | None,
    terms: list[Term] | None,
    expired: Callable[[SowRecord], bool],
) -> list:
    """The rows of the records that are live and match, each with its sort values when
    ordered. Each record is decoded once, for both, and let go at once (see Records)."""
    kept: list = []
    for source in sources:
        for record in source:
            if expired(record) or (filter is not None and not _matches(filter, record)):
                continue
            row = _row(record)
            kept.append(row if terms is None else (sort_values(terms, record.data), row))
    return kept


def _row(record: SowRecord) -> Row:
    return (
        record.partition,
        record.sow_key,
        record.payload,
        record.offset,
        record.timestamp,
        record.deadline,
    )


def _matches(filter: Filter | KeyEquality, record: SowRecord) -> bool:
    try:
        return filter.matches(record.data)
    except MessageError:  # a payload that no longer decodes can't match
        return False


Term = tuple[Expression, bool]  # an order_by expression and whether it is DESC


def order_terms(order_by: str) -> list[Term]:
    """`/a DESC, /b`: each expression in turn, ascending unless DESC."""
    terms = []
    for term in (t.strip() for t in order_by.split(",")):
        words = term.split()
        if not words:
            continue
        descending = len(words) > 1 and words[-1].upper() == "DESC"
        if len(words) > 1 and words[-1].upper() in ("ASC", "DESC"):
            words = words[:-1]
        try:
            terms.append((compile_expression(" ".join(words)), descending))
        except FilterError as exc:  # say it is the order_by, not a filter, that is wrong
            raise FilterError(
                f"order_by term {term!r}: {exc} (a term is an expression, then ASC or DESC)"
            ) from exc
    return terms


def sort_values(terms: list[Term], data: Any) -> tuple:
    """A record's sort keys, one (kind, value) after the other: (0, number), (1, text),
    or NULL when the term has no value. Flat, and made after the keys it holds: the
    collector stops tracking such a tuple the first time it sees it (a tuple of tuples
    made before them was still tracked when it reached the oldest generation)."""
    flat: list = []
    for expression, _ in terms:
        value = expression.evaluate(data)
        flat.extend(NULL if value is None else _sort_key(value))
    return tuple(flat)


NULL = (2, None)  # sort_values of a term without a value


def ordered(records: Sequence[T], order_by: str) -> list[T]:
    """`/a DESC, /b` orders by each expression in turn; NULLs sort last either way."""
    terms = order_terms(order_by)
    pairs = [(sort_values(terms, r.data), r) for r in records]
    items = sort_pairs(pairs, terms)
    let_go(pairs)
    return items


def sort_pairs(pairs: list[tuple[tuple, T]], terms: list[Term]) -> list[T]:
    """The items of (sort values, item) pairs, by each term in turn (stable sorts from the
    last term to the first); an item with no value for a term goes after those with one."""
    for position in reversed(range(len(terms))):
        kind = 2 * position  # where the term's (kind, value) starts in sort_values
        valued = [p for p in pairs if p[0][kind] != NULL[0]]
        nulls = [p for p in pairs if p[0][kind] == NULL[0]]
        pairs = _sorted(valued, terms[position][1], position) + nulls
        del valued, nulls
    return [item for _, item in pairs]


SORT_RUN = 2_000  # records sorted by one C call (a few ms), between turns of the event loop


def _sorted(pairs: list[tuple[tuple, T]], descending: bool, position: int = 0) -> list:
    """A stable sort of (sort values, item) pairs by one value, which never holds the GIL
    long.

    list.sort compares in C without running bytecode, so one sort of a million records
    keeps the gateway's event loop (every other session) waiting for half a second.
    Sorting runs of SORT_RUN and merging them in Python (heapq.merge is stable across
    runs) gives the loop its turn between comparisons.
    """

    def key(pair: tuple[tuple, T]) -> Any:
        return pair[0][2 * position : 2 * position + 2]

    if len(pairs) <= SORT_RUN:
        return sorted(pairs, key=key, reverse=descending)
    runs = [
        sorted(pairs[i : i + SORT_RUN], key=key, reverse=descending)
        for i in range(0, len(pairs), SORT_RUN)
    ]
    return list(heapq.merge(*runs, key=key, reverse=descending))


def _sort_key(value: object) -> tuple[int, object]:
    return (
        (0, value)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else (1, str(value))
    )
