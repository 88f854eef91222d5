"""`amps-kafka sow`, `subscribe`, `sow-delete` and `ping`: a worker's SOW, through its
gateway.

`sow` and `subscribe` print one JSON object per message, like `replay`: command, bookmark,
topic, sow_key, timestamp, data (and reason, for oof messages).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from typing import BinaryIO

import click
import orjson

from amps_on_kafka.cli.common import cli_client_name, reports_errors
from amps_on_kafka.cli.replay import iso_time
from amps_on_kafka.client import Client, Message
from amps_on_kafka.client.base import MAX_COUNT
from amps_on_kafka.client.uri import shown

DEFAULT_SERVER = "tcp://127.0.0.1:9007/amps/json"

server_option = click.option(
    "--server",
    "-s",
    default=DEFAULT_SERVER,
    show_default=True,
    envvar="AMPS_KAFKA_SERVER",
    help="The worker's gateway (also $AMPS_KAFKA_SERVER).",
)
filter_option = click.option(
    "--filter", "filter_text", default=None, help='AMPS content filter, e.g. "/qty > 100".'
)


@click.command()
@click.argument("topic")
@filter_option
@click.option("--order-by", default=None, help='e.g. "/qty DESC, /id".')
@click.option(
    "--top-n", type=click.IntRange(0, MAX_COUNT), default=None, help="Only the first N records."
)
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True)
@server_option
@reports_errors
def sow(topic, filter_text, order_by, top_n, batch_size, server) -> None:
    """Print the SOW records of TOPIC that match, as of one moment."""
    with Client(cli_client_name("sow")) as client:
        client.connect(server)
        client.logon()
        records = client.sow(
            topic, filter_text, order_by=order_by, top_n=top_n, batch_size=batch_size
        )
        _print(records, sys.stdout.buffer)


@click.command()
@click.argument("topic")
@filter_option
@click.option("--oof", is_flag=True, help="Also print out-of-focus messages (reason included).")
@click.option("--sow", "with_sow", is_flag=True, help="Print the current records first.")
@click.option("--bookmark", "-m", default=None, help="Replay the log from here, then go live.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    callback=lambda _ctx, _param, value: _idle_seconds(value),
    help="Stop after this many idle seconds (default: never).",
)
@server_option
@reports_errors
def subscribe(topic, filter_text, oof, with_sow, bookmark, timeout, server) -> None:
    """Print TOPIC's messages as they come, until Ctrl-C (or --timeout idle seconds)."""
    if bookmark is not None and (oof or with_sow):
        raise click.UsageError("--bookmark replays the log: it excludes --oof and --sow")
    options = "oof" if oof else None
    with Client(cli_client_name("subscribe")) as client:
        client.connect(server)
        client.logon()
        if bookmark is not None:
            stream = client.bookmark_subscribe(topic, bookmark, filter_text, timeout=timeout)
        elif with_sow:
            stream = client.sow_and_subscribe(topic, filter_text, options, timeout=timeout)
        else:
            stream = client.subscribe(topic, filter_text, options, timeout=timeout)
        with stream:
            _print(stream, sys.stdout.buffer)


def _idle_seconds(value: float | None) -> float | None:
    """A usage error, as the client's own check would be a traceback (NaN passes
    click's FloatRange)."""
    if value is not None and not value > 0:
        raise click.BadParameter(f"{value} is not a number of seconds above 0")
    return value


def _answer_seconds(value: float) -> float:
    """A usage error: NaN passed click's FloatRange and `inf` overflowed the client's
    wait, each a traceback."""
    if not 0 < value < math.inf:
        raise click.BadParameter(f"{value} is not a finite number of seconds above 0")
    return value


@click.command("sow-delete")
@click.argument("topic")
@filter_option
@click.option(
    "--key",
    "--keys",
    "keys",
    multiple=True,
    metavar="SOW_KEY",
    help="Delete the record with this SOW key, as `sow` prints it (repeatable).",
)
@server_option
@reports_errors
def sow_delete(topic, filter_text, keys, server) -> None:
    """Delete TOPIC's SOW records that match --filter, or those with the given --key(s):
    the worker writes a delete to the log for each, and the count is printed once they
    are applied."""
    if (filter_text is None) == (not keys):
        raise click.UsageError("give either --filter or --key (one or more)")
    with Client(cli_client_name("sow-delete")) as client:
        client.connect(server)
        client.logon()
        ack = client.sow_delete(topic, filter_text, keys=list(keys) or None)
    click.echo(f"{topic}: deleted {ack.matches} record{'' if ack.matches == 1 else 's'}")


@click.command()
@server_option
@click.option(
    "--timeout",
    type=float,
    default=5.0,
    show_default=True,
    callback=lambda _ctx, _param, value: _answer_seconds(value),
    help="Seconds to wait for each answer.",
)
@reports_errors
def ping(server, timeout) -> None:
    """Log on to a gateway and send a heartbeat: print how long each round trip took, or
    exit 1 with the reason if the gateway doesn't answer within --timeout."""
    started = time.perf_counter()
    with Client(cli_client_name("ping")) as client:
        client.connect(server)
        client.logon(timeout)  # TransportError naming the gateway when it doesn't answer
        logged_on = time.perf_counter()
        client.heartbeat(timeout)
        answered = time.perf_counter()
    click.echo(
        f"{shown(server)}: logon {(logged_on - started) * 1000:.1f} ms, "
        f"heartbeat {(answered - logged_on) * 1000:.1f} ms"
    )


def _print(messages: Iterable[object], out: BinaryIO) -> None:
    for message in messages:
        if isinstance(message, Message) and message.command in ("sow", "publish", "oof"):
            out.write(orjson.dumps(_line(message), option=orjson.OPT_APPEND_NEWLINE))
            out.flush()


def _line(message: Message) -> dict:
    line = {
        "command": message.command,
        "bookmark": message.bookmark,
        "topic": message.topic,
        "sow_key": message.sow_key,
        "timestamp": iso_time(message.timestamp) if message.timestamp else None,
        "data": message.data,
    }
    if message.reason is not None:
        line["reason"] = message.reason
    return line
