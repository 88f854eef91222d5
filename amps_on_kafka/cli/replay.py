"""`amps-kafka replay`: the log from a bookmark, as JSON lines or raw payloads."""

from __future__ import annotations

import base64
import sys
from datetime import UTC, datetime
from typing import BinaryIO

import click
import orjson
from tqdm import tqdm

from amps_on_kafka import NOW
from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay

PROGRESS_THRESHOLD = 10_000


@click.command()
@click.argument("topic")
@click.option(
    "--bookmark",
    "-m",
    "start",
    default="0",
    show_default=True,
    help="Where to start: 0, 0|1|, YYYYmmddTHHMMSS[Z], a bookmark or a list.",
)
@click.option(
    "--until", default=None, help="Stop at this bookmark or time (default: the end of the log now)."
)
@click.option("--follow", "-f", is_flag=True, help="Keep following the log after the replay.")
@click.option(
    "--filter", "filter_text", default=None, help='AMPS content filter, e.g. "/qty > 100".'
)
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "raw"]), default="jsonl", show_default=True
)
@bootstrap_option
@reports_errors
def replay(topic, start, until, follow, filter_text, fmt, bootstrap) -> None:
    """Replay TOPIC (a name or a regular expression) from a bookmark.

    jsonl prints one object per message: bookmark, topic, timestamp, data. Exits 0 when
    the replay reaches the end of the log as it was at the start, unless --follow.
    """
    predicate = compile_filter(filter_text).matches if filter_text else None
    if until is not None and follow:
        raise click.UsageError("--until and --follow exclude each other")
    stop = until if until is not None or follow else NOW
    out = sys.stdout.buffer
    write = _jsonl if fmt == "jsonl" else _raw
    with Replay(kafka(bootstrap), topic, start, predicate=predicate, until=stop) as log:
        total = sum(max(0, (log.stops or log.ends)[tp] - o) for tp, o in log.starts.items())
        with tqdm(
            total=total, unit="msg", file=sys.stderr, disable=total < PROGRESS_THRESHOLD or None
        ) as bar:
            _copy(log, out, write, bar)


def _copy(log: Replay, out: BinaryIO, write, bar: tqdm) -> None:
    done = 0
    for message in log:
        if isinstance(message, LogMessage):
            write(out, message)
            done += 1
            if done % 1000 == 0:
                bar.update(1000)
                out.flush()
    bar.update(done % 1000)
    out.flush()


def _jsonl(out: BinaryIO, message: LogMessage) -> None:
    data = message.data
    if isinstance(data, bytes):
        data = {"base64": base64.b64encode(data).decode()}
    line = {
        "bookmark": message.bookmark,
        "topic": message.logical_topic,
        "timestamp": _iso(message.timestamp),
        "command": message.command,
        "data": data,
    }
    if message.sow_key is not None:
        line["sow_key"] = message.sow_key
    out.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


def _raw(out: BinaryIO, message: LogMessage) -> None:
    out.write(message.raw or b"")
    out.write(b"\n")


def _iso(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
