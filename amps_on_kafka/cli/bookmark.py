"""`amps-kafka bookmark`: what a bookmark means."""

from __future__ import annotations

import click

from amps_on_kafka.cli.common import (
    bootstrap_option,
    echo_json,
    format_option,
    kafka,
    reports_errors,
)
from amps_on_kafka.log.bookmarks import Moment, Position, parse_bookmark, resolve_start, watermarks
from amps_on_kafka.log.kafka import partitions_of, reader
from amps_on_kafka.log.replay import select_topics


@click.group()
def bookmark() -> None:
    """Decode and resolve bookmarks."""


@bookmark.command()
@click.argument("text")
@reports_errors
def decode(text: str) -> None:
    """Print what a bookmark names, without asking Kafka."""
    parsed = parse_bookmark(text)
    positions = parsed if isinstance(parsed, tuple) else (parsed,)
    for item in positions:
        if isinstance(item, Position):
            click.echo(f"topic={item.topic} partition={item.partition} offset={item.offset}")
        elif isinstance(item, Moment):
            click.echo(f"timestamp={item.millis} ms since the epoch (UTC)")
        else:
            click.echo(repr(item))


@bookmark.command()
@click.argument("topic")
@click.argument("text")
@bootstrap_option
@format_option
@reports_errors
def resolve(topic: str, text: str, bootstrap: str | None, output: str) -> None:
    """Print the offset each partition of TOPIC would start reading at for bookmark TEXT."""
    consumer = reader(kafka(bootstrap))
    try:
        partitions = [
            (t, p) for t in select_topics(consumer, topic) for p in partitions_of(consumer, t)
        ]
        marks = watermarks(consumer, partitions)
        starts = resolve_start(consumer, marks, parse_bookmark(text), text)
    finally:
        consumer.close()
    rows = [
        {
            "topic": name,
            "partition": partition,
            "start": offset,
            "earliest": marks[(name, partition)].low,
            "end": marks[(name, partition)].high,
        }
        for (name, partition), offset in sorted(starts.items())
    ]
    if output == "json":
        echo_json(rows)
        return
    for row in rows:
        click.echo(
            f"{row['topic']}|{row['partition']}| start={row['start']} "
            f"earliest={row['earliest']} end={row['end']}"
        )
