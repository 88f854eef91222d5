"""The SOW as of a bookmark or a time, computed on Spark with the worker's own rules.

The Kafka partition is the unit, as in the worker: each Spark task reads one Kafka
partition's range in offset order (source.records, the log source's own reader) and
applies SowRules to its records in a dict-backed State, in the same Python pass. The
records are grouped and ordered by construction, whatever Spark does with rows, and
each is handled in Python once: reading the log DataFrame and then regrouping it
(shuffle, sort, mapInArrow) would convert every record to Arrow and back on top.
What is left is the SOW at the end of the range; records whose deadline passed at the
as-of moment are then dropped when the topic's expiration is enabled, exactly as the
worker's query and sweep would drop them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from amps_on_kafka.config import Config, SowConfig
from amps_on_kafka.errors import ConfigError, MessageError
from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.log.codecs import JsonCodec, codec_for
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.topics import spec_from_config
from amps_on_kafka.spark.plan import AsOf
from amps_on_kafka.spark.session import parquet_timestamps_in_micros
from amps_on_kafka.spark.source import BATCH_ROWS, Slice, records, slices
from amps_on_kafka.state.record import NEVER, SowRecord
from amps_on_kafka.state.sow import Applied, DictState, SowRules

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

SOW_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("bookmark", pa.string()),
        ("sow_key", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("deadline", pa.timestamp("us", tz="UTC")),
        ("payload", pa.binary()),
        ("data", pa.string()),
    ]
)
SOW_SCHEMA = (
    "topic string, partition int, offset bigint, bookmark string, sow_key string, "
    "timestamp timestamp, deadline timestamp, payload binary, data string"
)


@dataclass(frozen=True)
class SowJob:
    """What a task needs to build the topic's SowRules (the rules themselves don't pickle)."""

    sow: SowConfig
    message_type: str = "json"
    schema: dict[str, Any] | None = None

    @property
    def topic(self) -> str:
        return self.sow.topic

    def rules(self) -> SowRules:
        return SowRules(self.sow, codec_for(self.message_type, self.schema))


def job_from_config(config: Config, topic: str) -> SowJob:
    """The SOW topic as the worker sees it: Key paths, expiration and codec from the config."""
    sow, log_topic = config.sow_for(topic), config.topic(topic)
    if sow is None or log_topic is None:
        raise ConfigError(f"{topic!r} is not a SOW topic of the configuration")
    spec = spec_from_config(config, log_topic)
    return SowJob(sow, spec.message_type, spec.schema)


def job_from_registry(bootstrap: str, topic: str) -> SowJob:
    """Without a config: the Key paths from the topic registry, expiration disabled."""
    spec = TopicRegistry(bootstrap).spec(topic)
    if not spec.key:
        raise ConfigError(f"topic {topic!r} has no SOW Key in the topic registry: give --config")
    sow = SowConfig(topic=topic, key=spec.key, key_from_publish=spec.key_from_publish)
    return SowJob(sow, spec.message_type, spec.schema)


def sow_frame(
    spark: SparkSession,
    bootstrap: str,
    job: SowJob,
    as_of: AsOf,
    filter_text: str | None = None,
    rejected: Accumulator[int] | None = None,
) -> DataFrame:
    """The SOW as of `as_of` (SOW_SCHEMA), optionally only the records matching a filter.

    One task per Kafka partition: `spark.range` with one row per partition in as many
    Spark partitions gives each task exactly one. `rejected` counts the records the rules
    refused (a missing key, a bad delta), which the worker skips the same way.
    """
    if filter_text:
        compile_filter(filter_text)  # a syntax error is reported before Spark works
    parts = slices(as_of.range, None)
    task = _sow_task(bootstrap, job, parts, as_of.millis, filter_text, rejected)
    return spark.range(len(parts), numPartitions=max(1, len(parts))).mapInArrow(task, SOW_SCHEMA)


def _sow_task(
    bootstrap: str,
    job: SowJob,
    parts: list[Slice],
    as_of: int,
    filter_text: str | None,
    rejected: Accumulator[int] | None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The Python side of the job: replay each Kafka partition given, then expire, filter."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rules = job.rules()
        matcher = compile_filter(filter_text) if filter_text else None
        for batch in batches:
            for index in batch.column("id").to_pylist():
                state = _replay(bootstrap, rules, parts[index], rejected)
                live = [
                    r
                    for _, r in sorted(state.records.items())
                    if not rules.is_expired(r, as_of) and (matcher is None or _matches(matcher, r))
                ]
                for start in range(0, len(live), BATCH_ROWS):
                    yield _sow_batch(live[start : start + BATCH_ROWS])

    return run


def _replay(
    bootstrap: str, rules: SowRules, part: Slice, rejected: Accumulator[int] | None
) -> DictState:
    """One partition's records in offset order through the rules, as the worker applies them."""
    state, applied = DictState(), Applied()
    topic, partition, codec = rules.topic, part.partition, rules.codec
    for record in records(bootstrap, topic, part):
        message = LogMessage(
            topic, partition, record.offset(), record.timestamp()[1], record.value(), record, codec
        )
        rules.apply(state, message, applied)
        if len(applied.results) + len(applied.changes) >= BATCH_ROWS:
            applied = _count_rejected(applied, rejected)
    _count_rejected(applied, rejected)
    return state


def _count_rejected(applied: Applied, rejected: Accumulator[int] | None) -> Applied:
    """Counts the rejections so far and returns a fresh Applied: changes aren't kept."""
    if rejected is not None:
        rejected.add(sum(1 for r in applied.results if r.error is not None))
    return Applied()


def _matches(matcher: Filter, record: SowRecord) -> bool:
    try:
        return matcher.matches(record.data)
    except MessageError:  # a payload that doesn't decode can't match, as in the engine
        return False


def _sow_batch(records: list[SowRecord]) -> pa.RecordBatch:
    rows = {
        "topic": [r.topic for r in records],
        "partition": [r.partition for r in records],
        "offset": [r.offset for r in records],
        "bookmark": [r.bookmark for r in records],
        "sow_key": [r.sow_key for r in records],
        "timestamp": [r.timestamp * 1000 for r in records],
        "deadline": [None if r.deadline == NEVER else r.deadline * 1000 for r in records],
        "payload": [r.payload for r in records],
        "data": [_document_text(r) for r in records],
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(rows[f.name], f.type) for f in SOW_ARROW], schema=SOW_ARROW
    )


def _document_text(record: SowRecord) -> str | None:
    """The record as JSON text, for analysts: JSON as stored, Avro converted, binary none."""
    if isinstance(record.codec, JsonCodec):
        return record.payload.decode()
    data = record.data
    return None if isinstance(data, bytes) else orjson.dumps(data).decode()


# -- writing -----------------------------------------------------------------------------
def write_sow(frame: DataFrame, out: str, fmt: str = "parquet", overwrite: bool = False) -> None:
    """Parquet (SOW_SCHEMA) or JSON lines like `amps-kafka replay`'s, into directory `out`."""
    mode = "overwrite" if overwrite else "errorifexists"
    if fmt == "parquet":
        with parquet_timestamps_in_micros(frame.sparkSession):
            frame.write.mode(mode).parquet(out)
    elif fmt == "jsonl":
        frame.mapInArrow(_jsonl_lines, "value string").write.mode(mode).text(out)
    else:
        raise ConfigError(f"unknown output format {fmt!r} (parquet or jsonl)")


def _jsonl_lines(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        rows = batch.to_pylist()
        yield pa.RecordBatch.from_arrays(
            [pa.array([_jsonl(r) for r in rows], pa.string())], ["value"]
        )


def _jsonl(row: dict[str, Any]) -> str:
    data = row["data"]
    line = {
        "bookmark": row["bookmark"],
        "sow_key": row["sow_key"],
        "timestamp": _iso(row["timestamp"]),
        "deadline": _iso(row["deadline"]) if row["deadline"] is not None else None,
        "data": orjson.Fragment(data)
        if data is not None
        else {"base64": base64.b64encode(row["payload"]).decode()},
    }
    return orjson.dumps(line).decode()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
