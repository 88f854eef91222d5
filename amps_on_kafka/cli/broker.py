"""``amps-kafka broker``: run the local single-node Kafka broker.

``status`` prints the bootstrap address as its last line so scripts can take it with
``tail -1``; when no broker runs it prints ``not running`` and exits with status 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from amps_on_kafka.broker import LocalBroker, fetch_jars
from amps_on_kafka.broker.local import DEFAULT_PORT, DEFAULT_SECURE_PORT
from amps_on_kafka.cli.common import reports_errors
from amps_on_kafka.config.properties import redacted
from amps_on_kafka.log.kafka import properties_of

_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Broker data directory "
    "[default: $AMPS_KAFKA_HOME or ~/.local/share/amps_on_kafka/broker; "
    "with --secure, the same with -secure appended].",
)
_secure_option = click.option(
    "--secure",
    is_flag=True,
    help="The secured broker: a SASL_SSL listener (SCRAM-SHA-512 user, certificate from "
    "a local CA); client properties in DATA_DIR/client.properties.",
)


def _progress(message: str) -> None:
    click.echo(message, err=True)


@click.group()
def broker() -> None:
    """Run a local Apache Kafka broker (single-node KRaft, from Kafka's own jars)."""


@broker.command()
@reports_errors
def fetch() -> None:
    """Fetch Kafka's jars with Maven into the cache (once); print the jar directory."""
    click.echo(fetch_jars(echo=_progress))


@broker.command()
@_data_dir_option
@click.option(
    "--port",
    type=int,
    default=None,
    help=f"Client port on 127.0.0.1 [default: {DEFAULT_PORT}, with --secure "
    f"{DEFAULT_SECURE_PORT}]; the controller listens on PORT+1.",
)
@_secure_option
@reports_errors
def start(data_dir: Path | None, port: int | None, secure: bool) -> None:
    """Start the broker unless it already runs; print its bootstrap address.

    With --secure, also print the client properties (password redacted) and where they
    are written, for --kafka-config and Kafka's tools' --command-config.
    """
    port = port or (DEFAULT_SECURE_PORT if secure else DEFAULT_PORT)
    broker = LocalBroker(data_dir, port=port, echo=_progress, secure=secure)
    bootstrap = broker.start()
    if broker.secure is not None:
        _progress(f"client properties (all of them in {broker.secure.client_properties}):")
        for key, value in redacted(properties_of(bootstrap)).items():
            _progress(f"  {key}={value}")
        _progress(f"e.g. amps-kafka topics list --kafka-config {broker.secure.client_properties}")
    click.echo(bootstrap)


@broker.command()
@_data_dir_option
@_secure_option
@reports_errors
def stop(data_dir: Path | None, secure: bool) -> None:
    """Stop the broker (SIGTERM, SIGKILL after 30 s); does nothing if none runs."""
    click.echo("stopped" if LocalBroker(data_dir, secure=secure).stop() else "not running")


@broker.command()
@_data_dir_option
@_secure_option
@click.pass_context
def status(ctx: click.Context, data_dir: Path | None, secure: bool) -> None:
    """Print pid and data directory, then the bootstrap address; exit 1 if not running."""
    current = LocalBroker(data_dir, secure=secure).status()
    if not current.running:
        click.echo("not running")
        ctx.exit(1)
    click.echo(f"running: pid {current.pid}, data in {current.data_dir}")
    click.echo(current.bootstrap)
