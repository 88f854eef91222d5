"""`amps-kafka publish`: publish one message, or JSON lines from stdin.

A line of stdin is read with a bound (--max-line-bytes, 1 MiB by default: Kafka's
default largest message), so a stream without newlines can't grow the process: a longer
line stops the command with an error naming its line number, after the lines before it
are published (as any bad line does).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

import click

from amps_on_kafka.cli.common import bootstrap_option, cli_client_name, kafka, reports_errors
from amps_on_kafka.client import Client
from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.envelope import check_expiration

MAX_LINE_BYTES = 1024 * 1024


def _expiration(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    """Refuse inf, nan, negative or beyond 100 years before anything is published."""
    try:
        return None if value is None else check_expiration(value)
    except MessageError as exc:
        raise click.BadParameter(exc.reason) from exc


@click.command()
@click.argument("topic")
@click.argument("data", required=False)
@click.option(
    "--expiration",
    type=float,
    default=None,
    callback=_expiration,
    help="Seconds until the record expires (0 = never, at most 100 years).",
)
@click.option("--delta", is_flag=True, help="delta_publish instead of publish.")
@click.option(
    "--max-line-bytes",
    type=click.IntRange(min=1),
    default=MAX_LINE_BYTES,
    show_default=True,
    help="The longest line of stdin (without its newline); a longer one stops the command.",
)
@bootstrap_option
@reports_errors
def publish(topic, data, expiration, delta, max_line_bytes, bootstrap) -> None:
    """Publish DATA to TOPIC, or one message per line of stdin when DATA is absent.

    DATA is JSON; for an Avro topic it is encoded with the topic's schema, and a field
    that does not fit is named. Exits once Kafka has persisted every message (acks=all).
    A bad line stops the command with an error naming its line number; the lines before
    it are published.
    """
    if data is not None:
        lines: Iterator[tuple[int | None, str]] = iter([(None, data)])
    else:
        lines = stdin_lines(sys.stdin.buffer, max_line_bytes)
    with Client(cli_client_name("publish")) as client:
        servers = kafka(bootstrap)
        client.connect(f"kafka://{servers}", kafka_config=servers.properties)
        client.transport.registry.spec(topic)  # a missing topic fails before stdin is read
        send = client.delta_publish if delta else client.publish
        count = 0
        try:
            for number, line in lines:
                try:
                    send(topic, line, expiration)
                except MessageError as exc:
                    where = "" if number is None else f"line {number}: "
                    raise MessageError(f"{where}{exc.reason}") from exc
                count += 1
        except MessageError as exc:
            client.publish_flush()  # the lines before it are published, and said so
            raise MessageError(f"{exc.reason} ({count} message(s) published)") from exc
        client.publish_flush()
    click.echo(f"published {count} message(s) to {topic}", err=True)


def stdin_lines(stream: BinaryIO, limit: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line that is not blank. A line longer than `limit`
    bytes is a MessageError naming it, read no further than that; so is one that is not
    UTF-8."""
    number = 0
    while line := stream.readline(limit + 2):  # room for the line's end, \r\n
        number += 1
        content = line.rstrip(b"\r\n")
        if len(content) > limit or (len(line) == limit + 2 and not line.endswith(b"\n")):
            raise MessageError(f"line {number}: longer than {limit:,} bytes (--max-line-bytes)")
        try:
            text = content.decode()
        except UnicodeDecodeError as exc:
            raise MessageError(f"line {number}: not UTF-8 text ({exc.reason})") from None
        if text.strip():
            yield number, text.strip()
