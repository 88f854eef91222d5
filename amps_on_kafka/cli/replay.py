"""`amps-kafka replay`: the log from a bookmark, as JSON lines or raw payloads."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, BinaryIO

import click
import orjson
from tqdm import tqdm

from amps_on_kafka import NOW
from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.controls import controlled, parse_options
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.registry import TopicRegistry
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
@click.option(
    "--rate",
    default=None,
    metavar="RATE",
    help="Limit delivery: 1000 (messages/s), 500KB (bytes/s) or 2x (times the original pace).",
)
@click.option(
    "--conflate",
    default=None,
    metavar="INTERVAL",
    help="Every INTERVAL (e.g. 1s), only the newest message per key; it carries the bookmark "
    "of the first one it replaced.",
)
@click.option(
    "--conflation-key",
    "conflation_keys",
    multiple=True,
    metavar="PATH",
    help="Conflate by this field, e.g. /id (repeatable; default: the SOW key).",
)
@bootstrap_option
@reports_errors
def replay(
    topic, start, until, follow, filter_text, fmt, rate, conflate, conflation_keys, bootstrap
) -> None:
    """Replay TOPIC (a name or a regular expression) from a bookmark.

    jsonl prints one object per message: bookmark, topic, timestamp, data. Exits 0 when
    the replay reaches the end of the log as it was at the start, unless --follow.
    """
    predicate = compile_filter(filter_text).matches if filter_text else None
    if until is not None and follow:
        raise click.UsageError("--until and --follow exclude each other")
    options = parse_options(_options_text(rate, conflate, conflation_keys))
    stop = until if until is not None or follow else NOW
    out = sys.stdout.buffer
    write = _jsonl if fmt == "jsonl" else _raw
    servers = kafka(bootstrap)
    registry = TopicRegistry(servers)

    def open_replay(bookmark: str, max_idle: float | None) -> Replay:
        return Replay(
            servers,
            topic,
            bookmark,
            predicate=predicate,
            until=stop,
            registry=registry,
            max_idle=max_idle,
        )

    run = controlled(open_replay, start, options, bounded=stop is not None, idle_limit=None)
    try:
        log = run.replay
        total = sum(max(0, (log.stops or log.ends)[tp] - o) for tp, o in log.starts.items())
        with tqdm(
            total=total, unit="msg", file=sys.stderr, disable=total < PROGRESS_THRESHOLD or None
        ) as bar:
            _copy(run.items, out, write, bar)
    finally:
        run.source.close()


def _options_text(rate: str | None, conflate: str | None, keys: tuple[str, ...]) -> str:
    """The CLI's options in AMPS's spelling, to be checked like a subscription's."""
    parts = [f"rate={rate}"] if rate else []
    if conflate:
        parts.append(f"conflation={conflate}")
    parts.extend(f"conflation_key={key}" for key in keys)
    return ",".join(parts)


def _copy(items: Iterable[Any], out: BinaryIO, write, bar: tqdm) -> None:
    done = 0
    for message in items:
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
        "timestamp": iso_time(message.timestamp),
        "command": message.command,
        "data": data,
    }
    if message.sow_key is not None:
        line["sow_key"] = message.sow_key
    out.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


def _raw(out: BinaryIO, message: LogMessage) -> None:
    out.write(message.raw or b"")
    out.write(b"\n")


def iso_time(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
