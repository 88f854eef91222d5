"""`amps-kafka publish`: publish one message, or JSON lines from stdin."""

from __future__ import annotations

import sys

import click

from amps_on_kafka.cli.common import bootstrap_option, cli_client_name, kafka, reports_errors
from amps_on_kafka.client import Client
from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.envelope import check_expiration


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
@bootstrap_option
@reports_errors
def publish(topic, data, expiration, delta, bootstrap) -> None:
    """Publish DATA to TOPIC, or one message per line of stdin when DATA is absent.

    DATA is JSON; for an Avro topic it is encoded with the topic's schema, and a field
    that does not fit is named. Exits once Kafka has persisted every message (acks=all).
    """
    lines = [data] if data is not None else (line for line in sys.stdin if line.strip())
    with Client(cli_client_name("publish")) as client:
        servers = kafka(bootstrap)
        client.connect(f"kafka://{servers}", kafka_config=servers.properties)
        send = client.delta_publish if delta else client.publish
        count = 0
        for line in lines:
            try:
                send(topic, line.strip(), expiration)
            except MessageError as exc:
                client.publish_flush()  # the lines before it are published, and said so
                where = "" if data is not None else f"line {count + 1}: "
                raise MessageError(f"{where}{exc.reason} ({count} message(s) published)") from exc
            count += 1
        client.publish_flush()
    click.echo(f"published {count} message(s) to {topic}", err=True)
