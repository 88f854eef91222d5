"""The log as a Spark DataFrame: a PySpark Python data source over confluent-kafka.

Why not Spark's own Kafka source: its jar (spark-sql-kafka) must match Spark's exact
version, and the PySpark that pip installs is ahead of what Maven Central serves here, so
`pip install pyspark` gives a Spark whose Kafka connector can't be fetched. This source
needs no jar, reads with the same consumer settings as the rest of the project (log.kafka
.reader) and decodes the headers with Envelope.from_headers as it reads. docs/spark.md
has the comparison.

Each task reads one slice of one partition, assigned (no group), from its start offset to
its stop offset, and yields Arrow record batches. `records` is that reader alone: the SOW
jobs call it to replay a whole partition in the task that applies the rules to it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from confluent_kafka import TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from amps_on_kafka.errors import MessageError, TransportError
from amps_on_kafka.log.bookmarks import format_bookmark
from amps_on_kafka.log.envelope import Envelope, headers_of
from amps_on_kafka.log.kafka import Bootstrap, properties_of, reader
from amps_on_kafka.spark.plan import LogRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "amps_log"
KAFKA_OPTION = "kafka."  # prefix of the options that are Kafka client properties
_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()  # sessions that know the source
SLICE_RECORDS = 1_000_000  # offsets per task when partitions may be split
BATCH_ROWS = 10_000  # rows per Arrow record batch
IDLE_TIMEOUT = 60.0  # seconds without a record before a task gives up on the broker

_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
LOG_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("bookmark", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("command", pa.string()),
        ("logical_topic", pa.string()),
        ("sow_key", pa.string()),
        ("sow_keys", pa.list_(pa.string())),
        ("filter", pa.string()),
        ("expiration", pa.float64()),
        ("publisher_id", pa.string()),
        ("sequence", pa.int64()),
        ("correlation_id", pa.string()),
        ("message_type", pa.string()),
        ("payload", pa.binary()),
        ("headers", pa.list_(_HEADER)),
        ("error", pa.string()),
    ]
)
LOG_SCHEMA = (
    "topic string, partition int, offset bigint, bookmark string, timestamp timestamp, "
    "command string, logical_topic string, sow_key string, sow_keys array<string>, "
    "filter string, expiration double, publisher_id string, sequence bigint, "
    "correlation_id string, message_type string, payload binary, "
    "headers array<struct<key: string, value: binary>>, error string"
)


@dataclass(frozen=True)
class Slice(InputPartition):
    """Offsets [start, stop) of one partition: one Spark task."""

    partition: int
    start: int
    stop: int


def slices(log: LogRange, size: int | None) -> list[Slice]:
    """Cut each partition's range into slices of at most `size` offsets (None: whole)."""
    out = []
    for partition in log.partitions:
        start, stop = log.starts[partition], log.stops[partition]
        step = size or max(1, stop - start)
        out.extend(Slice(partition, s, min(s + step, stop)) for s in range(start, stop, step))
    return out


def read_log(spark: SparkSession, bootstrap: str, log: LogRange) -> DataFrame:
    """The records of `log` as a DataFrame with LOG_SCHEMA's columns.

    The Kafka client properties `bootstrap` carries (log.kafka.Bootstrap) go to the tasks
    as options prefixed `kafka.`, as Spark's own Kafka source takes them: a secret's
    option name (kafka.sasl.password...) matches spark.redaction.regex, so Spark shows
    its value redacted in plans and its UI.
    """
    if spark not in _REGISTERED:
        spark.dataSource.register(AmpsLogSource)
        _REGISTERED.add(spark)
    options = {
        "bootstrap": str(bootstrap),
        "topic": log.topic,
        "offsets": log.to_json(),
        **{KAFKA_OPTION + key: value for key, value in properties_of(bootstrap).items()},
    }
    return spark.read.format(SOURCE_NAME).options(**options).load()


class AmpsLogSource(DataSource):
    """`spark.read.format("amps_log")` with options bootstrap, topic, offsets, slice and
    the Kafka client properties as kafka.<property>."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        properties = {
            key.removeprefix(KAFKA_OPTION): value
            for key, value in self.options.items()
            if key.startswith(KAFKA_OPTION)
        }
        return LogReader(
            Bootstrap(self.options["bootstrap"], properties),
            LogRange.from_json(self.options["topic"], self.options["offsets"]),
            int(self.options.get("slice", SLICE_RECORDS)) or None,
        )


class LogReader(DataSourceReader):
    def __init__(self, bootstrap: str, log: LogRange, slice_size: int | None) -> None:
        self.bootstrap = bootstrap
        self.log = log
        self.slice_size = slice_size

    def partitions(self) -> list[Slice]:
        # Given no partition, Spark reads one of its own making: an empty range is a slice.
        return slices(self.log, self.slice_size) or [Slice(0, 0, 0)]

    def read(self, partition: Slice) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        topic, rows = self.log.topic, []
        for record in records(self.bootstrap, topic, partition):
            rows.append(_row(topic, record))
            if len(rows) >= BATCH_ROWS:
                yield _batch(rows)
                rows = []
        if rows:
            yield _batch(rows)


def records(bootstrap: str, topic: str, part: Slice) -> Iterator:
    """The Kafka records of one slice, in offset order; gaps in the offsets are skipped."""
    if part.start >= part.stop:
        return
    consumer = reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, part.partition, part.start)])
        position, idle_since = part.start, time.monotonic()
        while position < part.stop:
            batch = consumer.consume(BATCH_ROWS, timeout=0.5)
            if not batch:
                position = max(
                    position, consumer.position([TopicPartition(topic, part.partition)])[0].offset
                )
                if time.monotonic() - idle_since > IDLE_TIMEOUT:
                    raise TransportError(
                        f"no record from {topic}|{part.partition}| for {IDLE_TIMEOUT}s"
                    )
                continue
            idle_since = time.monotonic()
            for record in batch:
                if record.error():
                    raise TransportError(
                        f"reading {topic}|{part.partition}|: {record.error().str()}"
                    )
                position = record.offset() + 1
                if record.offset() < part.stop:
                    yield record
    finally:
        consumer.close()


def _row(topic: str, record) -> tuple:
    """A row of LOG_SCHEMA: the envelope decoded by Envelope.from_headers, or its error."""
    partition, offset, headers = record.partition(), record.offset(), None
    try:
        headers = headers_of(record)  # not record.headers(): see envelope.read_headers
        envelope, error = Envelope.from_headers(headers), None
    except MessageError as exc:
        envelope, error = None, exc.reason
    return (
        topic,
        partition,
        offset,
        format_bookmark(topic, partition, offset),
        record.timestamp()[1] * 1000,
        *(_envelope_fields(envelope, topic) if envelope is not None else _UNDECODED),
        record.value(),
        headers or [],
        error,
    )


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    """Rows (tuples in LOG_ARROW's order) transposed into one Arrow record batch."""
    columns = zip(*rows, strict=True)
    arrays = [pa.array(c, f.type) for c, f in zip(columns, LOG_ARROW, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=LOG_ARROW)


def _envelope_fields(envelope: Envelope, topic: str) -> tuple:
    """The envelope's columns, from command to message_type in ARROW_SCHEMA."""
    return (
        envelope.command.value,
        envelope.topic or topic,
        envelope.sow_key,
        envelope.sow_keys,
        envelope.filter,
        envelope.expiration,
        envelope.publisher_id,
        envelope.sequence,
        envelope.correlation_id,
        envelope.message_type,
    )


_UNDECODED = (None,) * len(_envelope_fields(Envelope(), ""))
