"""The stores without a write-ahead log: what a crash keeps, and that it is consistent.

Each case writes in a process of its own that then dies without closing the store; the
reopened store must hold exactly the records before its offset, whatever it lost.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from amps_on_kafka.config.model import DEFAULT_WRITE_BUFFER_BYTES
from amps_on_kafka.state.store import PartitionStore
from tests.sow.store_process import BATCH

ROOT = Path(__file__).parents[2]


def crash_after_writing(path: Path, batches: int, flush_after: int, write_buffer: int) -> None:
    args = [str(path), str(batches), str(flush_after), str(write_buffer)]
    subprocess.run([sys.executable, "-m", "tests.sow.store_process", *args], cwd=ROOT, check=True)


def reopened(path: Path) -> tuple[int | None, int]:
    store = PartitionStore(path, "t", 0)
    try:
        return store.next_offset(), store.count()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("flush_after", "kept"),
    [(-1, (None, 0)), (3, (3 * BATCH, 3 * BATCH))],
    ids=["never flushed: nothing kept", "flushed after 3 of 5: those 3 kept"],
)
def test_a_crash_keeps_state_and_offset_of_the_last_flush(tmp_path, flush_after, kept):
    crash_after_writing(tmp_path / "s", 5, flush_after, DEFAULT_WRITE_BUFFER_BYTES)
    assert reopened(tmp_path / "s") == kept


def test_full_memtables_reach_disk_with_their_offset(tmp_path):
    """A small write buffer fills many times over: RocksDB flushes on its own, every
    column family together, so the offset kept always matches the records kept."""
    crash_after_writing(tmp_path / "s", 20, -1, 256 * 1024)
    offset, count = reopened(tmp_path / "s")
    assert offset is not None and 0 < offset < 20 * BATCH
    assert count == offset
