"""A streamed scan's frames built by the compiled core (native/src/scans.rs, driven by
server/scans.py) against the Python path's (scan_matching's records cut by
queries.batches, encoded by sow_batch and encode_frame): the same writes, byte for byte.

Over generated stores (one or two partitions; keys with quotes, backslashes, control
characters and unicode; payloads that are documents, odd JSON or broken; offsets and
timestamps across 64 bits; deadlines never, expired, at the clock and later) and
generated filters of the compiled check's shape, none, or one it can't take, with small
batches, byte bounds and writes, so frames are cut in every way. A key that is not UTF-8
and a record shorter than its header fail alike on both paths.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.server.queries import _next_frames, batches
from amps_on_kafka.server.scans import compiled_writes
from amps_on_kafka.state.record import NEVER, SowRecord
from amps_on_kafka.state.store import PartitionStore, StateBatch
from tests.native.test_filters import documents, trees
from tests.sow.engine_helpers import two_store_engine

TOPIC = "scanned"
NOW = 1_000_000  # the engine's clock, ms
REQUEST = {"c": "sow", "cid": 'q"1\u00e9', "query_id": "7", "t": TOPIC}
FILTERS = [
    "/qty > 500",
    "/a = 'x' OR NOT /b/qty <= 1.5",
    "/qty <> 'zz' OR /a <> 1 OR NOT /b > 0",  # keeps most objects
    "/qty IS NULL",  # these two: not the compiled check's shape
    "/qty LIKE 'x'",
]

keys = st.text(max_size=6) | st.sampled_from(['"', "\\", "\x00\x1f\x7f", "\u2028", "é🙂", "a/b"])
int64 = st.integers(-(2**63), 2**63 - 1)
deadlines = st.sampled_from([NEVER, NEVER, NEVER, NOW - 1, NOW, NOW + 1, 2**63 - 1, -5]) | int64
records = st.dictionaries(
    keys, st.tuples(documents(), int64, int64, deadlines), min_size=1, max_size=12
)
# mostly the listed filters (a drawn tree seldom keeps a record)
filters = (
    st.sampled_from([None, *FILTERS])
    | st.sampled_from([None, *FILTERS])
    | trees.map(lambda tree: Filter("drawn", tree))
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SowEngine]:
    """An engine over two real stores (partitions 0 and 1), empty between tests."""
    with two_store_engine(tmp_path_factory.mktemp, TOPIC, NOW) as engine:
        yield engine


@contextmanager
def holding(engine: SowEngine, stores: list[dict[str, tuple]]) -> Iterator[SowEngine]:
    """The engine's partition p holding stores[p] (key -> payload, offset, timestamp,
    deadline) meanwhile; the other partition empty."""
    owned = engine._owned(TOPIC)
    for store, held in zip(owned, stores, strict=False):
        _write(store, {key: SowRecord(TOPIC, store.partition, key, *r) for key, r in held.items()})
    try:
        yield engine
    finally:
        for store in owned:
            _write(store, dict.fromkeys(store._sow.keys()))


def _write(store: PartitionStore, records: dict) -> None:
    batch = StateBatch(store)
    for key, record in records.items():
        batch.set(key.decode() if isinstance(key, bytes) else key, record)
    store.write(batch)


def python_writes(engine: SowEngine, filter: Filter | None, batch: int, least: int) -> list:
    chunks = batches(engine.stream(TOPIC, filter), batch)
    return _writes(lambda: _next_frames(REQUEST, TOPIC, chunks), least)


def native_writes(
    engine: SowEngine, filter: Filter | None, batch: int, batch_bytes: int, least: int
) -> list | None:
    writes = compiled_writes(engine, REQUEST, TOPIC, filter, batch, batch_bytes, least)
    return None if writes is None else _writes(writes, least)


def _writes(write, least: int) -> list:
    """Every write of a scan, as queries._send_streamed asks for them."""
    written = [write()]
    while written[-1][1] >= least:
        written.append(write())
    return written


@settings(max_examples=60, deadline=None)
@given(
    st.lists(records, min_size=1, max_size=2),
    filters,
    st.integers(1, 4),
    st.integers(1, 600),
    st.integers(1, 7),
)
def test_the_compiled_frames_are_the_python_paths(
    engine: SowEngine,
    stores: list,
    filter: Filter | str | None,
    batch: int,
    batch_bytes: int,
    least: int,
) -> None:
    if isinstance(filter, str):
        filter = compile_filter(filter)
    with holding(engine, stores), pytest.MonkeyPatch.context() as patch:
        patch.setattr("amps_on_kafka.server.queries.BATCH_BYTES", batch_bytes)
        patch.setattr("amps_on_kafka.server.queries.STREAM_WRITE", least)
        native = native_writes(engine, filter, batch, batch_bytes, least)
        expected = python_writes(engine, filter, batch, least)
    event(f"compiled: {native is not None}, records {sum(c for _, c in expected)}")
    if native is not None:  # None: a filter the compiled check can't take
        assert native == expected


def test_the_bench_scan_is_compiled_and_alike(engine: SowEngine) -> None:
    docs = {
        str(i): (orjson.dumps({"id": i, "qty": i * 37 % 1000, "x": "é"}), i, NOW, NEVER)
        for i in range(5000)
    }
    kept = sum(1 for payload, *_ in docs.values() if orjson.loads(payload)["qty"] > 500)
    filter = compile_filter("/qty > 500")
    with holding(engine, [docs]):
        native = native_writes(engine, filter, 500, 1 << 20, 2000)
        assert native is not None
        assert native == python_writes(engine, filter, 500, 2000)
    assert [count for _, count in native] == [2000, kept - 2000]  # whole batches, the rest
    assert [len(frames) for frames, _ in native] == [4, -(-(kept - 2000) // 500)]


def test_what_the_compiled_frames_leave_to_python(engine: SowEngine) -> None:
    """A filter that pins the key, or one the compiled check can't take: no compiled
    frames; without a filter, every store is read by the core."""
    with holding(engine, [{"1": (b'{"id": 1}', 1, 2, NEVER)}]):
        assert native_writes(engine, compile_filter("/id = 1"), 10, 1 << 20, 10) is None
        assert native_writes(engine, compile_filter("/qty LIKE 'x'"), 10, 1 << 20, 10) is None
        assert native_writes(engine, None, 10, 1 << 20, 10) is not None


@pytest.mark.parametrize(
    ("key", "stored", "error"),
    [
        (b"\xff", struct.pack(">qqq", 1, 2, NEVER) + b'{"qty": 1}', UnicodeDecodeError),
        (b"short", b"\x00" * 5, struct.error),
    ],
)
def test_a_broken_stored_record_fails_alike(
    engine: SowEngine, key: bytes, stored: bytes, error: type
) -> None:
    with holding(engine, [{"ok": (b'{"qty": 1}', 1, 2, NEVER)}]):
        store = engine._owned(TOPIC)[0]
        store._sow[key] = stored  # written past the store's API
        try:
            _assert_both_raise(engine, error)
        finally:
            del store._sow[key]


def _assert_both_raise(engine: SowEngine, error: type) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("amps_on_kafka.server.queries.STREAM_WRITE", 10)
        for filter in (None, compile_filter("/qty > 0")):
            with pytest.raises(error):
                python_writes(engine, filter, 10, 10)
            with pytest.raises(error):
                native_writes(engine, filter, 10, 1 << 20, 10)


def test_a_frame_needs_a_batch_of_one_record_at_least() -> None:
    from amps_on_kafka.native import core

    with pytest.raises(ValueError, match="a batch of at least one record"):
        core.SowFrames(b"{", 0, 1, bytes)  # type: ignore[union-attr]


def test_the_extreme_numbers_and_odd_keys_are_written_as_orjson_writes_them(
    engine: SowEngine,
) -> None:
    ends = [-(2**63), -1, 0, 9, 10, 2**63 - 1]
    held = {
        f'k"\\\x00\x1f\x7f\u2028é🙂{i}': (b'{"qty": 1}', offset, timestamp, NEVER)
        for i, (offset, timestamp) in enumerate(zip(ends, reversed(ends), strict=True))
    }
    with holding(engine, [held]):
        native = native_writes(engine, None, 4, 1 << 20, 10)
        assert native is not None
        assert native == python_writes(engine, None, 4, 10)
    assert [count for _, count in native] == [len(held)]


def test_records_with_an_expiration_are_written_by_the_core(
    engine: SowEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a record the core is not sure of goes to Python (`left`): an expiring
    topic's live records are not such records."""
    held = {str(i): (b'{"qty": %d}' % i, i, NOW - i, NOW + 1 + 7 * i) for i in range(50)}
    left: list = []
    raw_scan = PartitionStore.raw_scan

    def counted(store: PartitionStore, *args: Any) -> Any:
        iterator, read = raw_scan(store, *args)  # type: ignore[misc]
        return iterator, lambda: left.append(1) or read()

    monkeypatch.setattr(PartitionStore, "raw_scan", counted)
    with holding(engine, [held]):
        native = native_writes(engine, compile_filter("/qty > 10"), 8, 1 << 20, 2000)
        assert native == python_writes(engine, compile_filter("/qty > 10"), 8, 2000)
    assert left == [] and sum(count for _, count in native) == 39  # type: ignore[union-attr]
