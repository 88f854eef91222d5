"""A damaged or locked state directory: the error names the store and how to recover.

Real RocksDB directories, damaged the ways a crash, a full disk or a careless copy damage
them; before, RocksDB's bare status reached the operator, and a directory that had lost
its CURRENT file was opened as a new, empty store.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from amps_on_kafka.errors import TransportError
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.state.record import NEVER, pack_record
from amps_on_kafka.state.store import PartitionStore, StoreUnavailable, store_path
from tests.sow.conftest import sow_config

RECORDS = 2000


def filled_store(path: Path, offset: int = RECORDS) -> None:
    """A store holding RECORDS records in table files, closed."""
    store = PartitionStore(path, "t", 0)
    staged = store.replacements()
    for i in range(RECORDS):
        staged.put(b"%d" % i, pack_record(i, 0, NEVER, b'{"id": %d}' % i))
    store.write_replacements(staged, offset)
    store.flush()
    store.close()


def truncate_tables(path: Path) -> None:
    for table in path.glob("*.sst"):
        table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])


def flip_a_table_byte(path: Path) -> None:
    for table in path.glob("*.sst"):
        data = bytearray(table.read_bytes())
        data[100] ^= 0xFF
        table.write_bytes(bytes(data))


def remove_current(path: Path) -> None:
    os.remove(path / "CURRENT")


@pytest.mark.parametrize(
    "damage",
    [truncate_tables, flip_a_table_byte, remove_current],
    ids=["a truncated table file", "a flipped byte in a table", "no CURRENT file"],
)
def test_a_damaged_store_is_refused_naming_its_directory_and_the_way_back(tmp_path, damage):
    path = tmp_path / "t" / "0"
    filled_store(path)
    damage(path)
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(StoreUnavailable) as refused:
        PartitionStore(path, "t", 0)
    message = str(refused.value)
    assert f"the store {path} is damaged" in message
    assert "delete that directory" in message and "rebuilds the partition" in message
    if damage is remove_current:  # not opened as a new, empty store over the old files
        assert sorted(p.name for p in path.iterdir()) == before


def test_a_store_another_process_holds_is_refused_as_locked(tmp_path):
    path = tmp_path / "t" / "0"
    holder = PartitionStore(path, "t", 0)
    try:
        with pytest.raises(StoreUnavailable, match=f"the store {path} is locked"):
            PartitionStore(path, "t", 0)
    finally:
        holder.close()


# The worker's thread ends by raising the error it reports (Worker._run_guarded).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_on_a_damaged_store_fails_with_the_directory_and_the_way_back(
    bootstrap, topic_factory, start_worker, tmp_path
):
    """The worker stops with the store's error; after the directory is deleted as it
    says, a worker rebuilds the partition from the log."""
    topic = topic_factory(1, key=("/id",))
    state = tmp_path / "state"
    path = store_path(state, topic, 0)
    filled_store(path, offset=0)
    truncate_tables(path)
    failing = Worker(sow_config(topic, 1), bootstrap, state, group_id=f"g-{uuid.uuid4().hex}")
    failing.start()
    try:
        with pytest.raises(TransportError, match=f"the store {path} is damaged"):
            failing.wait_ready()
    finally:
        failing.stop()
    PartitionStore.destroy(path)
    rebuilt = start_worker(sow_config(topic, 1), state)
    assert rebuilt.next_offsets(topic) == {0: None}  # an empty log: nothing to apply yet
