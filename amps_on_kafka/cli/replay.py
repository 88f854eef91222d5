"""`amps-kafka replay`: the log from a bookmark, as JSON lines or raw payloads.

A replay tool must get through any log: a record whose payload or headers don't decode
(any producer can write one) is printed as undecodable with its bookmark, or counted
and skipped, and ends the replay only when asked (`--on-error`). A sow_delete line
carries what it deletes (`sow_keys`, `filter`, or the data), so the output of a replay
can always be folded into a SOW.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, BinaryIO

import click
import orjson
from tqdm import tqdm

from amps_on_kafka import NOW
from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.errors import MessageError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.codecs import bytes_as_base64
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
@click.option(
    "--on-error",
    type=click.Choice(["raw", "skip", "stop"]),
    default="raw",
    show_default=True,
    help="A record that does not decode (jsonl): raw prints it with its bookmark, the "
    "reason and its value in base64; skip counts it on stderr; stop ends with exit code 1.",
)
@bootstrap_option
@reports_errors
def replay(
    topic,
    start,
    until,
    follow,
    filter_text,
    fmt,
    rate,
    conflate,
    conflation_keys,
    on_error,
    bootstrap,
) -> None:
    """Replay TOPIC (a name or a regular expression) from a bookmark.

    jsonl prints one object per message: bookmark, topic, timestamp, command, data, and
    sow_key, sow_keys or filter when the record has them. Exits 0 when the replay reaches
    the end of the log as it was at the start, unless --follow.
    """
    predicate = compile_filter(filter_text).matches if filter_text else None
    if until is not None and follow:
        raise click.UsageError("--until and --follow exclude each other")
    options = parse_options(_options_text(rate, conflate, conflation_keys))
    stop = until if until is not None or follow else NOW
    out = sys.stdout.buffer
    undecodable = Undecodable(on_error)
    write = undecodable.guard(_jsonl) if fmt == "jsonl" else _raw
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
        undecodable.report()


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


class Undecodable:
    """What `--on-error` does with a record that does not decode, and how many there were."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.count = 0
        self.first: str | None = None  # "bookmark: reason" of the first one

    def guard(self, write: Callable[[BinaryIO, LogMessage], None]):
        """`write`, with a MessageError (payload or headers) handled by the mode."""

        def guarded(out: BinaryIO, message: LogMessage) -> None:
            try:
                write(out, message)
            except MessageError as exc:
                self._handle(out, message, exc.reason)

        return guarded

    def _handle(self, out: BinaryIO, message: LogMessage, reason: str) -> None:
        if self.mode == "stop":
            raise click.ClickException(f"record {message.bookmark} does not decode: {reason}")
        self.count += 1
        self.first = self.first or f"{message.bookmark}: {reason}"
        if self.mode == "raw":
            out.write(orjson.dumps(undecodable_line(message, reason), option=_NEWLINE))

    def report(self) -> None:
        """Undecodable records are never silent: a count on stderr, whatever the mode."""
        if self.count:
            done = "skipped" if self.mode == "skip" else "printed as undecodable"
            first = f"; the first at {self.first}"
            click.echo(f"{self.count} record(s) did not decode, {done}{first}", err=True)


_NEWLINE = orjson.OPT_APPEND_NEWLINE


def _jsonl(out: BinaryIO, message: LogMessage) -> None:
    """The whole line is built before anything is written: a record failing half-way
    leaves no half line."""
    out.write(orjson.dumps(message_line(message), option=_NEWLINE, default=bytes_as_base64))


def message_line(message: LogMessage) -> dict[str, Any]:
    """A message as a JSON object; a sow_delete names what it deletes. MessageError when
    its payload or headers don't decode."""
    data = message.data
    if isinstance(data, bytes):
        data = bytes_as_base64(data)
    envelope = message.envelope
    line = {
        "bookmark": message.bookmark,
        "topic": envelope.topic or message.topic,
        "timestamp": iso_time(message.timestamp),
        "command": envelope.command.value,
        "data": data,
    }
    for name in ("sow_key", "sow_keys", "filter"):
        value = getattr(envelope, name)
        if value is not None:
            line[name] = value
    return line


def undecodable_line(message: LogMessage, reason: str) -> dict[str, Any]:
    """A record that does not decode: where it is, why, and its value as it is."""
    raw = message.raw
    return {
        "bookmark": message.bookmark,
        "topic": message.topic,
        "timestamp": iso_time(message.timestamp),
        "error": reason,
        "raw": base64.b64encode(raw).decode() if raw is not None else None,
    }


def _raw(out: BinaryIO, message: LogMessage) -> None:
    out.write(message.raw or b"")
    out.write(b"\n")


def iso_time(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
