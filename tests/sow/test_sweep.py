"""The expiry sweep's bounds (state/store.py SWEEP_SLICE and the expiry floor): a sweep
takes at most a slice of the due entries, in deadline order, and reads from past what
earlier sweeps deleted without missing an entry written below it since; and a turn of
the worker's loop takes fewer records while a deadline is near (EXPIRY_TURN)."""

from __future__ import annotations

from pathlib import Path

from amps_on_kafka.config import SowConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.processor.applying import BATCH_SIZE, EXPIRY_TURN, NEAR_DEADLINE_MS
from amps_on_kafka.processor.staging import stage_expiry
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.state.record import SowRecord
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import SWEEP_SLICE, PartitionStore, StateBatch
from tests.sow.conftest import sow_config

RULES = SowRules(
    SowConfig.model_validate({"Topic": "t", "Key": "/id", "Expiration": "enabled"}), JSON
)


def put(store: PartitionStore, deadlines: dict[str, int]) -> None:
    """Records of these keys, each with its deadline (ms), written as a batch applies them."""
    batch = StateBatch(store)
    batch.prefetch(deadlines)
    for key, deadline in deadlines.items():
        batch.set(key, SowRecord("t", 0, key, b'{"id": 1}', 0, 0, deadline, JSON))
    store.write(batch)


def sweep(store: PartitionStore, now: int) -> list[str]:
    """One slice, as the worker sweeps it: the keys expired."""
    staged = stage_expiry(store, RULES, now)
    if staged is None:
        return []
    store.write(staged[0])
    return [change.sow_key for change in staged[1]]


def test_a_sweep_takes_one_slice_of_the_due_records_earliest_first(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "s", "t", 0, JSON)
    try:
        count = SWEEP_SLICE * 2 + 7
        put(store, {f"k{i:05}": 1_000 + i for i in range(count)})
        slices = [sweep(store, 10_000_000) for _ in range(4)]
        assert [len(s) for s in slices] == [SWEEP_SLICE, SWEEP_SLICE, 7, 0]
        assert [k for s in slices for k in s] == [f"k{i:05}" for i in range(count)]
        assert store.count() == 0
    finally:
        store.close()


def test_an_entry_written_below_what_a_sweep_passed_is_still_found(tmp_path: Path) -> None:
    """After a sweep the store reads its expiry entries from past the ones it deleted: a
    record written since with an earlier deadline (a log timestamp from the past, a
    restore) lowers that point again, so it still expires, and the next deadline is its."""
    store = PartitionStore(tmp_path / "s", "t", 0, JSON)
    try:
        put(store, {"a": 5_000, "b": 6_000, "later": 90_000})
        assert sweep(store, 7_000) == ["a", "b"]
        assert store.next_deadline() == 90_000
        put(store, {"old": 2_000})
        assert store.next_deadline() == 2_000
        store.load([(b"restored", SowRecord("t", 0, "restored", b"{}", 0, 0, 1_000).encode())])
        assert store.next_deadline() == 1_000
        assert sweep(store, 7_000) == ["restored", "old"]
        assert [r.sow_key for r in store.scan()] == ["later"]
    finally:
        store.close()


def test_a_turn_takes_fewer_records_while_a_deadline_is_near(bootstrap, tmp_path: Path) -> None:
    """Due records wait for the turn being applied: while the next deadline is less than
    NEAR_DEADLINE_MS away (or passed) a turn takes EXPIRY_TURN records, else BATCH_SIZE."""
    now = 50_000
    config = sow_config("t", 1, Expiration="enabled")
    worker = Worker(config, bootstrap, tmp_path, clock=lambda: now)
    assert EXPIRY_TURN < BATCH_SIZE
    assert worker._turn_size(None) == worker._turn_size(now + NEAR_DEADLINE_MS) == BATCH_SIZE
    near = now + NEAR_DEADLINE_MS - 1
    assert worker._turn_size(near) == worker._turn_size(now - 5_000) == EXPIRY_TURN


def test_a_reopened_store_sweeps_from_its_first_entry(tmp_path: Path) -> None:
    """The floor lives in memory only: a store reopened after sweeps (a restart, a kill)
    reads its expiry entries from the first again, so nothing written below the floor
    before the restart is missed, and what was due while it was down is due at once."""
    store = PartitionStore(tmp_path / "s", "t", 0, JSON)
    try:
        put(store, {"a": 5_000, "later": 90_000})
        assert sweep(store, 7_000) == ["a"]
        put(store, {"old": 2_000, "past": 3_000})
    finally:
        store.close()
    reopened = PartitionStore(tmp_path / "s", "t", 0, JSON)
    try:
        assert reopened.next_deadline() == 2_000
        assert sweep(reopened, 100_000) == ["old", "past", "later"]
        assert reopened.next_deadline() is None and reopened.count() == 0
    finally:
        reopened.close()


def test_a_record_updated_past_the_floor_is_swept_once_at_its_new_deadline(
    tmp_path: Path,
) -> None:
    """A record whose deadline moved (an update) leaves no entry of its old deadline that
    a later sweep would expire it by."""
    store = PartitionStore(tmp_path / "s", "t", 0, JSON)
    try:
        put(store, {"a": 5_000, "b": 6_000})
        assert sweep(store, 5_500) == ["a"]
        put(store, {"b": 50_000, "a": 1_000})  # b moved later, a came back below the floor
        assert sweep(store, 10_000) == ["a"]
        assert [r.sow_key for r in store.scan()] == ["b"]
        assert sweep(store, 60_000) == ["b"]
    finally:
        store.close()
