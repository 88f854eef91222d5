"""How a long-running command logs: `--log-level` and `--log-format text|json`.

Text is for a terminal. JSON is one object per line for a log shipper: `time`, `level`,
`logger`, `message`, and the record's context fields (what a call passes as `extra`, e.g.
the topic, partition and offset of a skipped record), each a key of its own, so an
operator can filter on them instead of parsing messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pythonjsonlogger.json import JsonFormatter

F = TypeVar("F", bound=Callable[..., Any])

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The record's attributes a JSON line carries under these names; python-json-logger adds
# every other non-standard attribute (the call's `extra`) as it is, and `time` (ISO 8601,
# UTC, microseconds).
JSON_FIELDS = {"levelname": "level", "name": "logger"}


def log_options(command: F) -> F:
    """The two options, as `level` and `log_format` arguments of the command."""
    command = click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS, case_sensitive=False),
        default="text",
        show_default=True,
        help="json: one object per line (time, level, logger, message, context fields).",
    )(command)
    return click.option(
        "--log-level",
        "level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="INFO",
        show_default=True,
        help="DEBUG also shows librdkafka's own log.",
    )(command)


_chosen = {"format": "text"}  # what setup_logging chose, for announce()


def setup_logging(level: str, log_format: str) -> None:
    """Send the process's log to stderr at `level`, as text or JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    _chosen["format"] = log_format.lower()


def announce(line: str, **context: Any) -> None:
    """A line scripts wait for (`worker ready: ...`), shown at any --log-level: as is on
    stderr, or with --log-format json as a JSON line like the log's (INFO, logger
    `amps_on_kafka.cli`, the context fields beside the message), so a log shipper reading
    stderr meets nothing but JSON."""
    if _chosen["format"] != "json":
        click.echo(line, err=True)
        return
    record = logging.makeLogRecord(
        {"name": "amps_on_kafka.cli", "levelno": logging.INFO, "levelname": "INFO", "msg": line}
    )
    record.__dict__.update(context)
    click.echo(formatter("json").format(record), err=True)


def formatter(log_format: str) -> logging.Formatter:
    if log_format.lower() == "json":
        return JsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            rename_fields=JSON_FIELDS,
            timestamp="time",
            json_ensure_ascii=False,
        )
    return logging.Formatter(TEXT_FORMAT)
