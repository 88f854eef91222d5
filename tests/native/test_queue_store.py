"""The compiled checkpoint writer of a queue's entries (native/src/queue_store.rs) against
its Python twin (state/queue_store.py `_put_entries_twin`, `encode_entry`).

The compiled encoder must give encode_entry's bytes exactly, or leave the entry to the
twin (None); the writer must leave a real RocksDB store holding the same keys and values,
mark the same entries stored, and fail with the same error where the twin fails.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import WriteBatch

from amps_on_kafka.native import core
from amps_on_kafka.state.queue_store import (
    _SEQ,
    DELETE_RANGE_FROM,
    QueueStore,
    UnstoredRuns,
    _put_entries_twin,
    decode_entry,
    encode_entry,
    put_entries,
)
from amps_on_kafka.state.queue_store_runs import _UnstoredRunsTwin, members
from amps_on_kafka.state.queue_types import QueueEntry, Status

TEXT = st.text(max_size=6) | st.sampled_from(['"\\/', "\x00\x1f\x7f", "é€😀", "\ud800"])
INTS = (
    st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([-(2**63) - 1, 2**64, 2**70, True, 1.0])
    | st.integers(0, 100)
)
VALUES = st.none() | st.binary(max_size=6) | st.sampled_from([bytearray(b"a"), "text"])
HEADER = st.tuples(TEXT | st.sampled_from([b"c", 3]), VALUES) | st.just(("c",))
HEADERS = st.none() | st.lists(HEADER, max_size=3) | st.sampled_from([(), (("p", b"x"),)])


@st.composite
def entries(draw) -> QueueEntry:
    """Entries as the state machine makes them, and now and then a field of another type
    or range, which the compiled encoder must leave to the twin."""
    odd = draw(st.booleans())
    ints = INTS if odd else st.integers(0, 2**42)
    entry = QueueEntry(
        (draw(TEXT if odd else st.sampled_from(["t", "orders.v1"])), draw(ints), draw(ints)),
        draw(ints),
        draw(st.binary(max_size=8) | st.just(bytearray(b"x")) if odd else st.binary(max_size=8)),
        headers=draw(HEADERS if odd else st.none() | st.lists(st.tuples(TEXT, VALUES))),
        seq=draw(st.integers(0, 2**40) | st.just(2**63) if odd else st.integers(0, 2**40)),
        deadline=draw(st.none() | ints),
        rank=draw(ints),
        barrier=draw(st.booleans() | st.just(1) if odd else st.booleans()),
        deliveries=draw(ints),
        cancels=draw(ints),
        ev_pos=draw(ints),
        stored=draw(st.booleans()),
        # a plain int equal to a status (or not) is gone as `in GONE` finds it
        status=draw(st.sampled_from([*Status, 5, 4, 2, 9] if odd else list(Status))),
    )
    if odd and draw(st.integers(0, 9)) == 0:
        entry.id = (entry.id[0], entry.id[1])  # type: ignore[assignment]
    return entry


# the compiled encoder alone (None: the twin's); the tests are skipped without the core
ENCODE = getattr(getattr(put_entries, "__self__", None), "encode", None)


def clone(entry: QueueEntry) -> QueueEntry:
    return QueueEntry(**{name: getattr(entry, name) for name in QueueEntry.__dataclass_fields__})


def outcome(call):
    try:
        return ("value", call())
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)))


def test_the_compiled_writer_is_in_use():
    assert put_entries != _put_entries_twin
    assert type(put_entries.__self__) is core.EntryWriter
    assert UnstoredRuns is core.UnstoredRuns


@given(entries())
def test_the_encoder_writes_encode_entrys_bytes_or_leaves_the_entry(entry):
    ours = ENCODE(entry)
    if ours is not None:
        assert ours == encode_entry(entry)


@given(st.integers(0, 2**62), st.binary(max_size=4))
def test_common_entries_are_always_encoded(offset, value):
    """What the state machine makes is never left to the twin (else no gain)."""
    common = QueueEntry(("t", 0, offset), 7, b"{}", headers=[("p", value)], seq=1)
    assert ENCODE(common) == encode_entry(common)
    decoded = decode_entry(1, ENCODE(common), lambda topic: None)
    assert (decoded.id, decoded.headers, decoded.payload) == (common.id, common.headers, b"{}")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[QueueStore, QueueStore]:
    base: Path = tmp_path_factory.mktemp("queue-stores")
    ours, twin = QueueStore(base / "ours"), QueueStore(base / "twin")
    yield ours, twin
    ours.close()
    twin.close()


def written(store: QueueStore, put, batch_of: list[QueueEntry]):
    """What `put` leaves in a real store, the entries' stored flags, or its error; the
    store's entries are emptied afterwards for the next example."""
    column = store._handles["entries"]
    batch = WriteBatch(raw_mode=True)
    result = outcome(lambda: put(batch, column, batch_of))
    store.commit(batch, 0)
    kept = dict(store._families["entries"].items())
    clear = WriteBatch(raw_mode=True)
    for key in kept:
        clear.delete(key, column)
    store._db.write(clear)
    return result, kept, [entry.stored for entry in batch_of]


@given(st.lists(entries(), max_size=5), st.booleans())
def test_the_writer_leaves_the_store_as_the_twin_does(stores, batch, stored_first):
    ours, twin = stores
    if stored_first:  # a delete of an entry not in the store
        for entry in batch:
            entry.stored = True
    copies = [clone(entry) for entry in batch]
    assert written(ours, put_entries, batch) == written(twin, _put_entries_twin, copies)


LIVE = 48  # entries in the store before the checkpoint: arrival numbers 0..47
RUNS = st.lists(st.tuples(st.integers(0, LIVE - 1), st.integers(1, 20)), max_size=4).map(
    lambda runs: {n for start, length in runs for n in range(start, min(LIVE, start + length))}
)
FAR = st.sampled_from([[], list(range(-12, 0)), [2**63 - 12 + i for i in range(12)]])


@given(RUNS, st.sets(st.integers(0, LIVE - 1)), FAR)
def test_deletes_by_range_remove_exactly_the_entries_that_left(stores, gone, put, far):
    """A checkpoint that removes runs of consecutive entries (deleted as ranges) among
    others still stored, and puts others again: the compiled writer and the twin leave the
    same store, holding every entry that did not leave, as last put. Runs of negative
    numbers or at the end of the key's range (kept a key each) leave too."""
    results = []
    for store, put_ in zip(stores, (put_entries, _put_entries_twin), strict=True):
        column = store._handles["entries"]
        first = WriteBatch(raw_mode=True)
        seqs = [*range(LIVE), *far]
        _put_entries_twin(first, column, [QueueEntry(("t", 0, n), 7, b"{}", seq=n) for n in seqs])
        store.commit(first, 0)
        removed = [
            QueueEntry(("t", 0, n), 7, b"{}", seq=n, stored=True, status=Status.REMOVED)
            for n in sorted(gone | set(far), reverse=True)
        ]
        again = [QueueEntry(("t", 1, n), 8, b"[]", seq=n) for n in sorted(put - gone)]
        results.append(written(store, put_, removed + again))
    assert results[0] == results[1]
    kept = {
        _SEQ.unpack(key)[0]: decode_entry(0, value, lambda _: None).id[1]
        for key, value in results[0][1].items()
    }
    assert kept == {n: int(n in put) for n in range(LIVE) if n not in gone}


def test_a_run_of_entries_that_left_is_one_delete(stores):
    """What a queue acked in order removes between checkpoints costs the batch one range
    (else no gain), and a shorter run a delete each."""
    column = stores[0]._handles["entries"]
    for put_ in (put_entries, _put_entries_twin):
        for count, operations in (
            (DELETE_RANGE_FROM * 10, 1),
            (DELETE_RANGE_FROM - 1, DELETE_RANGE_FROM - 1),
        ):
            gone = [
                QueueEntry(("t", 0, n), 7, b"{}", seq=n, stored=True, status=Status.REMOVED)
                for n in range(100, 100 + count)
            ]
            batch = WriteBatch(raw_mode=True)
            put_(batch, column, gone)
            assert batch.len() == operations


class Subclassed(QueueEntry):
    """An entry of another class: its slots may not be where QueueEntry's are."""


def test_entries_of_another_class_or_with_a_slot_unset_go_to_the_twin(stores):
    common = QueueEntry(("t", 0, 1), 7, b"{}", seq=1)
    other = Subclassed(("t", 0, 1), 7, b"{}", seq=1)
    assert ENCODE(other) is None and ENCODE(common) == encode_entry(common)
    assert written(stores[0], put_entries, [other]) == written(
        stores[1], _put_entries_twin, [clone(common)]
    )
    unset, column = QueueEntry.__new__(QueueEntry), stores[0]._handles["entries"]
    assert ENCODE(unset) is None
    ours = outcome(lambda: put_entries(WriteBatch(raw_mode=True), column, [unset]))
    twin = outcome(lambda: _put_entries_twin(WriteBatch(raw_mode=True), column, [unset]))
    assert (
        ours == twin == ("error", (AttributeError, "'QueueEntry' object has no attribute 'status'"))
    )


# -- the messages a checkpoint leaves in their topics (UnstoredRuns) -------------------
ARRIVALS = st.lists(
    st.tuples(st.sampled_from([("t", 0), ("t", 1), ("u", 0)]), st.integers(1, 3), st.booleans()),
    max_size=60,
)


def arrivals(steps) -> dict[tuple[str, int], dict[int, int]]:
    """Messages as a queue reads them: offsets rising by partition (gaps where a record
    held no message), arrival numbers rising across partitions (gaps where another kind
    of entry took one): offset -> arrival number, by partition."""
    found: dict[tuple[str, int], dict[int, int]] = {}
    seq, next_offset = 0, {}
    for tp, step, skip in steps:
        offset = next_offset.get(tp, 0) + step - 1
        next_offset[tp] = offset + 1
        seq += 1 + skip
        found.setdefault(tp, {})[offset] = seq
    return found


@given(ARRIVALS, st.data())
def test_runs_keep_exactly_the_members_with_their_arrival_numbers(steps, data):
    """Noted in the order read, then any of them leaving in any order (and some left
    twice, some never noted): both classes hold exactly the rest, each with its arrival
    number, the same state, and each partition's front at its first member."""
    found = arrivals(steps)
    noted = [(tp, o, s) for tp, offsets in found.items() for o, s in offsets.items()]
    noted.sort(key=lambda item: item[2])
    leaving = data.draw(
        st.lists(st.sampled_from(noted), max_size=len(noted)) if noted else st.just([])
    )
    stranger = data.draw(st.lists(st.tuples(st.just(("t", 0)), st.integers(0, 300))))
    both = [UnstoredRuns(False), _UnstoredRunsTwin(False)]
    for runs in both:
        for (topic, partition), offset, seq in noted:
            runs.note(topic, partition, offset, seq)
        for (topic, partition), offset, _ in leaving:
            runs.leave(topic, partition, offset)
        for (topic, partition), offset in stranger:
            if offset not in found.get((topic, partition), {}):
                runs.leave(topic, partition, offset)
    assert both[0].state() == both[1].state()
    assert both[0].fronts() == both[1].fronts()
    left = {(tp, o) for tp, o, _ in leaving}
    expected = {
        tp: {o: s for o, s in offsets.items() if (tp, o) not in left}
        for tp, offsets in found.items()
    }
    expected = {tp: offsets for tp, offsets in expected.items() if offsets}
    assert members(both[0].state()) == expected
    assert both[0].fronts() == {tp: min(offsets) for tp, offsets in expected.items()}
    again = UnstoredRuns(False, both[0].state())  # as read back from the store
    assert again.state() == _UnstoredRunsTwin(False, both[1].state()).state() == both[0].state()


def _with_runs(put_, runs, batch, column, entries) -> None:
    put_(batch, column, entries, runs)


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1)), max_size=12),
    st.booleans(),
)
def test_the_writer_notes_what_only_waited_as_the_twin_does(stores, counts, deliveries_counted):
    """A checkpoint with runs: an unstored entry that only waited is noted, not put; one
    counted (a cancel; a delivery under MaxDeliveries) is put and leaves its run; one that
    left the queue leaves it. Both writers leave the same store, flags and runs."""
    results = []
    for store, put_, runs in zip(
        stores,
        (put_entries, _put_entries_twin),
        (UnstoredRuns(deliveries_counted), _UnstoredRunsTwin(deliveries_counted)),
        strict=True,
    ):
        fresh = [QueueEntry(("t", 0, n), 7, b"{}", seq=n) for n in range(len(counts))]
        with_runs = partial(_with_runs, put_, runs)
        first = written(store, with_runs, fresh)
        for entry, (deliveries, cancels, leaves) in zip(fresh, counts, strict=True):
            entry.deliveries, entry.cancels = deliveries, cancels
            if leaves:
                entry.status = Status.REMOVED
        second = written(store, with_runs, fresh)
        results.append((first, second, runs.state()))
    assert results[0] == results[1]
    waited = [
        n
        for n, (deliveries, cancels, leaves) in enumerate(counts)
        if not leaves and cancels == 0 and (deliveries == 0 or not deliveries_counted)
    ]
    assert sorted(members(results[0][2]).get(("t", 0), {})) == waited
    assert results[0][0][1] == {}, "nothing put while every entry only waited"
