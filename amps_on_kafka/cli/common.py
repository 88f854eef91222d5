"""What every sub-command shares: finding Kafka, and turning errors into clear messages.

Exit codes: 0 done; 1 an error (`Error: <reason>` on one line): a bad configuration,
Kafka unreachable, an unknown topic, and any value that parses but is wrong (a bookmark,
a filter, a payload); 2 only for what click itself refuses before the command runs (an
unknown option, a missing argument, a value of the wrong type, out of range or not
among the choices, options that exclude each other), after its `Usage:` text; 130
interrupted by Ctrl-C (SIGINT); 141, silently, when the reader of stdout went away.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import orjson
from confluent_kafka import KafkaError, KafkaException

from amps_on_kafka.broker import BOOTSTRAP_ENV, resolve_bootstrap
from amps_on_kafka.broker.probe import require_answer
from amps_on_kafka.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from amps_on_kafka.config.model import KafkaConfig
from amps_on_kafka.config.properties import read_properties_file
from amps_on_kafka.errors import AmpsError, ConfigError
from amps_on_kafka.log.kafka import Bootstrap

F = TypeVar("F", bound=Callable[..., Any])

# How long a command waits for Kafka to answer before it gives up: an unreachable broker
# is one line within seconds, not librdkafka's retries for 10-20 s.
PROBE_TIMEOUT = 3.0

_KAFKA_CONFIG = "amps_on_kafka.kafka_config"  # where --kafka-config waits in ctx.meta

format_option = click.option(
    "--format",
    "output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON document, for scripts.",
)


def echo_json(document: Any) -> None:
    """What `--format json` prints: one document, indented, on stdout."""
    click.echo(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())


def _remember_kafka_config(ctx: click.Context, _param: click.Parameter, value: Path | None):
    if value is not None:
        ctx.meta[_KAFKA_CONFIG] = value


def bootstrap_option(command: F) -> F:
    """--bootstrap and --kafka-config, for every command that talks to Kafka.

    --kafka-config isn't passed to the command: kafka() reads it from the click context,
    so a command that finds Kafka through kafka() can't forget to honour it.
    """
    command = click.option(
        "--kafka-config",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        expose_value=False,
        callback=_remember_kafka_config,
        metavar="FILE",
        help="Kafka client properties (security.protocol, sasl.*, ssl.*...) in a "
        "properties file, as Kafka's tools take with --command-config; ${env:NAME} and "
        "${file:PATH} in values are resolved.",
    )(command)
    return click.option(
        "--bootstrap",
        "-b",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: the config's, else bootstrap.servers in "
        "--kafka-config, else $KAFKA_BOOTSTRAP_SERVERS, else the local broker).",
    )(command)


def kafka(bootstrap: str | None, config: KafkaConfig | None = None) -> Bootstrap:
    """Where Kafka is and how to connect: explicit, the config's, the --kafka-config
    file's, the environment, or the local broker (started if needed). The config's
    Properties and the --kafka-config file's (which win) travel with the address
    (log.kafka.Bootstrap) to every client made from it.

    A broker that refuses the connection, the credentials or the TLS handshake, or
    doesn't answer within PROBE_TIMEOUT, is a one-line TransportError naming the address,
    before the command builds any client of its own.
    """
    properties = dict(config.properties) if config is not None else {}
    ctx = click.get_current_context(silent=True)
    path = ctx.find_root().meta.get(_KAFKA_CONFIG) if ctx is not None else None
    if path is not None:
        properties.update(read_properties_file(path))
    given = (
        bootstrap
        or (config.bootstrap_servers if config is not None else None)
        or properties.pop("bootstrap.servers", None)
    )
    properties.pop("bootstrap.servers", None)
    if not given and not os.environ.get(BOOTSTRAP_ENV) and _secured(properties):
        raise ConfigError(
            "the Kafka properties ask for a secured connection but name no broker: "
            "give --bootstrap, Kafka.BootstrapServers or bootstrap.servers"
        )
    servers = Bootstrap(
        resolve_bootstrap(given, echo=lambda line: click.echo(line, err=True)), properties
    )
    require_answer(
        servers,
        PROBE_TIMEOUT,
        hint=": start one (amps-kafka broker start) or fix --bootstrap, --kafka-config, "
        "$KAFKA_BOOTSTRAP_SERVERS or the config's Kafka section",
    )
    return servers


def _secured(properties: dict[str, str]) -> bool:
    """Whether the properties ask for more than plaintext: the plain local broker that
    would otherwise be started can't serve them."""
    return properties.get("security.protocol", "plaintext").lower() != "plaintext"


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
        except BrokenPipeError:
            _reader_gone()
        except OSError as exc:
            raise click.ClickException(_os_reason(exc)) from exc

    return run  # type: ignore[return-value]


def _reader_gone() -> NoReturn:
    """The reader of stdout closed it (`amps-kafka replay T | head`): end quietly, as a
    Unix tool killed by SIGPIPE does, instead of "Error: Broken pipe". Python's own flush
    of stdout at exit would raise again, so stdout goes to /dev/null first."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise click.exceptions.Exit(EXIT_BROKEN_PIPE)


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
