"""What every sub-command shares: finding Kafka, and turning errors into clear messages.

Exit codes: 0 done; 1 a runtime error (`Error: <reason>` on one line: bad configuration,
Kafka unreachable, unknown topic...); 2 a usage error (click's: a bad option or argument);
130 interrupted by Ctrl-C (SIGINT).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click
from confluent_kafka import KafkaError, KafkaException

from amps_on_kafka.broker import resolve_bootstrap
from amps_on_kafka.broker.probe import answers, refused
from amps_on_kafka.cli import EXIT_INTERRUPTED
from amps_on_kafka.errors import AmpsError, TransportError

F = TypeVar("F", bound=Callable[..., Any])

# How long a command waits for Kafka to answer before it gives up: an unreachable broker
# is one line within seconds, not librdkafka's retries for 10-20 s.
PROBE_TIMEOUT = 3.0

bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default=None,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else the local broker).",
)


def kafka(bootstrap: str | None) -> str:
    """The embedded default: explicit, environment, or the local broker (started if needed).

    A broker that refuses the connection, or doesn't answer within PROBE_TIMEOUT, is a
    TransportError naming the address, before the command builds any client of its own.
    """
    servers = resolve_bootstrap(bootstrap, echo=lambda line: click.echo(line, err=True))
    deadline = time.monotonic() + PROBE_TIMEOUT
    if refused(servers):
        why = "connection refused"
    elif not answers(servers, timeout=deadline - time.monotonic()):
        why = f"waited {PROBE_TIMEOUT:.0f} s"
    else:
        return servers
    raise TransportError(
        f"no Kafka broker answers at {servers} ({why}): start one (amps-kafka broker "
        "start) or fix --bootstrap, $KAFKA_BOOTSTRAP_SERVERS or the config's "
        "Kafka.BootstrapServers"
    )


def cli_client_name(role: str) -> str:
    return f"amps-kafka-{role}-{socket.gethostname()}-{os.getpid()}"


def reports_errors(command: F) -> F:
    """An AmpsError, a KafkaException or an OSError becomes `Error: <reason>` and exit
    code 1, never a traceback: they are the user's or the environment's problems, which
    one line names. Anything else escaping is a bug, and its traceback is wanted."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AmpsError as exc:
            raise click.ClickException(exc.reason) from exc
        except KafkaException as exc:
            raise click.ClickException(f"Kafka: {_kafka_reason(exc)}") from exc
        except OSError as exc:
            raise click.ClickException(_os_reason(exc)) from exc

    return run  # type: ignore[return-value]


def _kafka_reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _os_reason(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


class Main(click.Group):
    """The top-level group: Ctrl-C ends any command with exit code 130 and no traceback
    (click's own handling says "Aborted!" and exits 1, like a failure)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("", err=True)  # past the ^C the terminal printed
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
