"""Cold rebuild: each partition's SOW computed on Spark, written as the worker's stores.

The SOW as of now (sow.sow_frame) is computed for all partitions at once and cached by
Spark, then fetched to the driver one partition at a time (as Arrow: the driver holds one
partition's SOW at most) and written with PartitionStore and StateBatch at
state.store.store_path, with the log end the job read up to as the store's next offset.
A worker given that state directory resumes there: it replays nothing. RocksDB writes
happen on the driver because the stores belong on the machine that will run the worker,
not on Spark's executors.

Each store is built beside its final place and renamed into it once complete, so a
rebuild that fails half-way leaves the previous store (or none), never a partial one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql.functions import unix_millis

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.spark.plan import AsOf
from amps_on_kafka.spark.sow import SowJob, sow_frame
from amps_on_kafka.state.record import NEVER, SowRecord
from amps_on_kafka.state.store import PartitionStore, StateBatch, store_path

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession

WRITE_BATCH = 20_000  # records per RocksDB WriteBatch


@dataclass(frozen=True)
class Rebuilt:
    """One partition's store: where it is, how many records, where the worker resumes."""

    partition: int
    path: Path
    records: int
    next_offset: int


def rebuild_stores(
    spark: SparkSession,
    bootstrap: str,
    job: SowJob,
    as_of: AsOf,
    state_dir: str | Path,
    rejected: Accumulator[int] | None = None,
) -> list[Rebuilt]:
    """Write the stores of every partition of the topic (empty ones too) under state_dir."""
    check_unused(state_dir, job.topic, as_of.range.partitions)  # before Spark does any work
    paths = {p: store_path(Path(state_dir), job.topic, p) for p in as_of.range.partitions}
    frame = sow_frame(spark, bootstrap, job, as_of, rejected=rejected).select(
        "partition",
        "sow_key",
        "payload",
        "offset",
        unix_millis("timestamp").alias("timestamp"),
        unix_millis("deadline").alias("deadline"),
    )
    frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        frame.count()  # every partition's SOW at once, in parallel; then one at a time below
        return [
            _write_store(
                path,
                job.topic,
                partition,
                as_of.range.stops[partition],
                frame.where(frame.partition == partition).toArrow(),
            )
            for partition, path in paths.items()
        ]
    finally:
        frame.unpersist()


def _write_store(
    path: Path, topic: str, partition: int, next_offset: int, sow: pa.Table
) -> Rebuilt:
    """One partition's SOW into a scratch store, with the next offset last; then in place."""
    columns = ("sow_key", "payload", "offset", "timestamp", "deadline")
    records = [
        SowRecord(topic, partition, key, payload, offset, stamp, NEVER if due is None else due)
        for key, payload, offset, stamp, due in zip(
            *(sow.column(name).to_pylist() for name in columns), strict=True
        )
    ]
    chunks = [records[i : i + WRITE_BATCH] for i in range(0, len(records), WRITE_BATCH)] or [[]]
    scratch = path.with_name(f".{partition}.rebuild")
    PartitionStore.destroy(scratch)
    store = PartitionStore(scratch, topic, partition)
    try:
        for number, chunk in enumerate(chunks, 1):
            batch = StateBatch(store)
            batch.prefetch(r.sow_key for r in chunk)
            for record in chunk:
                batch.set(record.sow_key, record)
            batch.next_offset = next_offset if number == len(chunks) else None
            store.write(batch)
    finally:
        store.close()
    PartitionStore.destroy(path)
    scratch.rename(path)
    return Rebuilt(partition, path, len(records), next_offset)


def check_unused(state_dir: str | Path, topic: str, partitions: list[int]) -> None:
    """Refuse to replace a store a running worker holds open (RocksDB's lock says so)."""
    for partition in partitions:
        path = store_path(Path(state_dir), topic, partition)
        if not path.exists():
            continue
        try:
            PartitionStore(path, topic, partition).close()
        except Exception as exc:  # rocksdict reports a held lock as a plain Exception
            raise AmpsError(
                f"can't replace the store {path}: {exc} (stop the workers using it first)"
            ) from exc
