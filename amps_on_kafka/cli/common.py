"""What every sub-command shares: finding Kafka, and turning errors into clear messages."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from amps_on_kafka.broker import resolve_bootstrap
from amps_on_kafka.errors import AmpsError

F = TypeVar("F", bound=Callable[..., Any])

bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default=None,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else the local broker).",
)


def kafka(bootstrap: str | None) -> str:
    """The embedded default: explicit, environment, or the local broker (started if needed)."""
    return resolve_bootstrap(bootstrap, echo=lambda line: click.echo(line, err=True))


def cli_client_name(role: str) -> str:
    return f"amps-kafka-{role}-{socket.gethostname()}-{os.getpid()}"


def reports_errors(command: F) -> F:
    """AmpsError becomes `Error: <reason>` and exit code 2, never a traceback."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AmpsError as exc:
            raise click.ClickException(exc.reason) from exc

    return run  # type: ignore[return-value]
