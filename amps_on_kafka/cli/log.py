"""`amps-kafka log`: the transaction log in Kafka's terms (docs/operations.md).

AMPS manages journal files (archive, compress, remove); here the log is a Kafka topic and
the broker manages its segments. What an operator needs is what can still be replayed
(`log info`: per partition, the earliest and latest offsets and when they were written)
and how long it is kept (`log retention`: the topic's retention.ms).
"""

from __future__ import annotations

import time

import click
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from amps_on_kafka.cli.common import (
    bootstrap_option,
    echo_json,
    format_option,
    kafka,
    reports_errors,
)
from amps_on_kafka.cli.replay import iso_time
from amps_on_kafka.config import parse_duration
from amps_on_kafka.errors import ConfigError, TransportError
from amps_on_kafka.log.bookmarks import TP, Watermarks, watermarks
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, admin_client, partitions_of, reader
from amps_on_kafka.log.replay import select_topics

SHOWN_CONFIGS = ("retention.ms", "retention.bytes", "cleanup.policy", "remote.storage.enable")
_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


@click.group("log")
def log() -> None:
    """What the log still holds, and how long Kafka keeps it."""


@log.command("info")
@click.argument("topic", required=False)
@bootstrap_option
@format_option
@reports_errors
def info(topic: str | None, bootstrap: str | None, output: str) -> None:
    """Per partition of TOPIC (a name or a regex; default: every topic): the earliest and
    latest offsets and their timestamps, i.e. what a bookmark can still replay."""
    servers = kafka(bootstrap)
    admin = admin_client(servers)
    consumer = reader(servers)
    found = []
    try:
        for name in select_topics(consumer, topic or ".*"):
            partitions = [(name, p) for p in partitions_of(consumer, name)]
            rows = _rows(watermarks(consumer, partitions), consumer)
            configs = topic_configs(admin, name)
            shown = {key: configs[key] for key in SHOWN_CONFIGS if key in configs}
            if output == "json":
                found.append({"topic": name, "configs": shown, "partitions": rows})
            else:
                click.echo(f"{name}  {_settings(shown)}")
                _show(rows)
    finally:
        consumer.close()
    if output == "json":
        echo_json(found)


def _rows(marks: dict[TP, Watermarks], consumer: Consumer) -> list[dict]:
    """Per partition: its earliest and latest offsets (None when empty) and when they
    were written, and the offset the next record will get."""
    filled = {tp: m for tp, m in marks.items() if m.high > m.low}
    first = _stamps(consumer, {tp: m.low for tp, m in filled.items()})
    last = _stamps(consumer, {tp: m.high - 1 for tp, m in filled.items()})
    return [
        {
            "partition": tp[1],
            "earliest": mark.low if tp in filled else None,
            "earliest_written": _when(first.get(tp)),
            "latest": mark.high - 1 if tp in filled else None,
            "latest_written": _when(last.get(tp)),
            "next_offset": mark.high,
        }
        for tp, mark in sorted(marks.items())
    ]


def _show(rows: list[dict]) -> None:
    click.echo(f"  {'partition':>9}  {'earliest':>10}  {'written':<24}  {'latest':>10}  written")
    for row in rows:
        if row["earliest"] is None:
            click.echo(
                f"  {row['partition']:>9}  {'(empty)':>10}  next offset {row['next_offset']}"
            )
            continue
        click.echo(
            f"  {row['partition']:>9}  {row['earliest']:>10}  {row['earliest_written'] or '-':<24}"
            f"  {row['latest']:>10}  {row['latest_written'] or '-'}"
        )


def _stamps(consumer: Consumer, offsets: dict[TP, int]) -> dict[TP, int]:
    """The timestamp of the first record at or after each offset (what reading there gives)."""
    found: dict[TP, int] = {}
    if not offsets:
        return found
    assigned = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    consumer.assign(assigned)
    deadline = time.monotonic() + METADATA_TIMEOUT
    try:
        while len(found) < len(offsets) and time.monotonic() < deadline:
            for record in consumer.consume(100, timeout=0.5):
                tp = (record.topic(), record.partition())
                if record.error() is None and tp not in found:
                    found[tp] = record.timestamp()[1]
                    consumer.pause([TopicPartition(*tp)])  # one record is all it takes
    finally:
        consumer.resume(assigned)  # a pause outlives the assignment in librdkafka
        consumer.unassign()
    return found


def _when(millis: int | None) -> str | None:
    return None if millis is None else iso_time(millis)


def _settings(configs: dict[str, str]) -> str:
    shown = []
    for name, value in configs.items():
        if name == "retention.ms":
            value = f"{format_millis(int(value))} ({value})"
        shown.append(f"{name}={value}")
    return "  ".join(shown)


def topic_configs(admin: AdminClient, topic: str, *, own_only: bool = False) -> dict[str, str]:
    """The topic's configuration in Kafka; with own_only, only what is set on the topic
    itself (at creation or since), not what it takes from the broker or its defaults."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't read the configuration of {topic!r}: {exc}") from exc
    return {
        name: entry.value
        for name, entry in sorted(entries.items())
        if not own_only or entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def format_millis(millis: int) -> str:
    """retention.ms in AMPS's duration style: 604800000 is 7d; -1 is forever."""
    if millis < 0:
        return "forever"
    for unit, size in _UNITS:
        if millis and millis % size == 0:
            return f"{millis // size}{unit}"
    return "0ms"


@log.command("retention")
@click.argument("topic")
@click.argument("duration")
@bootstrap_option
@reports_errors
def retention(topic: str, duration: str, bootstrap: str | None) -> None:
    """Keep TOPIC's records for DURATION (7d, 12h, 30m; or `forever`): its retention.ms.

    Kafka deletes whole segments older than that, so what can be replayed shrinks from
    the oldest end and never leaves a gap, as AMPS requires of removed journals.
    """
    millis = _duration_millis(duration)
    admin = admin_client(kafka(bootstrap))
    partitions_of(admin, topic)  # UnknownTopic, clearly, before any change
    _alter(admin, topic, {"retention.ms": str(millis)})
    click.echo(f"{topic}  retention.ms={topic_configs(admin, topic)['retention.ms']}")


def _duration_millis(duration: str) -> int:
    if duration.strip().lower() == "forever":
        return -1
    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise ConfigError(f"retention: {exc}") from exc
    if seconds <= 0:
        raise ConfigError(f"retention: {duration!r} must be longer than 0 (or `forever`)")
    return round(seconds * 1000)


def _alter(admin: AdminClient, topic: str, values: dict[str, str]) -> None:
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in values.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    try:
        admin.incremental_alter_configs([resource])[resource].result(METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't change the configuration of {topic!r}: {exc}") from exc
