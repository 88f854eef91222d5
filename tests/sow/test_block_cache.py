"""The `sow` column family of every store of a process reads through one bounded block
cache (state/store.py SOW_BLOCK_CACHE_BYTES): a key look-up's point get that misses reads
and decompresses its block, and RocksDB's own 8 MiB a column family was less than a store
of 100k records (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.state import store as stores
from amps_on_kafka.state.record import SowRecord
from amps_on_kafka.state.store import PartitionStore, StateBatch

RECORDS = 3_000
PAYLOAD = b'{"id":%d,"text":"' + b"x" * 400 + b'"}'


def filled(path, partition: int) -> PartitionStore:
    """A store of RECORDS records of ~420 bytes, closed and opened again: its reads come
    from table files, not from the memtable."""
    store = PartitionStore(path / str(partition), "cached", partition, JSON)
    batch = StateBatch(store)
    for i in range(RECORDS):
        batch.set(str(i), SowRecord("cached", partition, str(i), PAYLOAD % i, i, 1))
    store.write(batch)
    store.close()
    return PartitionStore(path / str(partition), "cached", partition, JSON)


@pytest.fixture
def small_cache() -> Iterator[int]:
    """The process's cache emptied and held to 1 MiB for a test (16 KiB to each of its
    64 shards: a few blocks), then given its size back."""
    cache, capacity = stores._sow_block_cache(), 1024 * 1024
    cache.set_capacity(0)
    cache.set_capacity(capacity)
    try:
        yield capacity
    finally:
        cache.set_capacity(stores.SOW_BLOCK_CACHE_BYTES)


def test_every_store_reads_through_the_one_bounded_cache(tmp_path, small_cache) -> None:
    first, second = filled(tmp_path, 0), filled(tmp_path, 1)
    cache = stores._sow_block_cache()
    try:
        used = cache.get_usage()  # what opening and flushing them left in it
        for store in (first, second):  # ~1.3 MiB of records each, 2.5 times the cache
            assert all(store.get(str(i)) is not None for i in range(RECORDS))
            assert cache.get_usage() <= small_cache
        assert cache.get_usage() > used + small_cache // 2  # their blocks came through it
    finally:
        first.close()
        second.close()
