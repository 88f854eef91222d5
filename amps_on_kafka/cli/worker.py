"""`amps-kafka worker`: the processor worker and its gateway, in the foreground."""

from __future__ import annotations

import logging
import os
import signal
import threading
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from amps_on_kafka.cli.common import EXIT_INTERRUPTED, bootstrap_option, kafka, reports_errors
from amps_on_kafka.cli.logs import announce, log_options, setup_logging
from amps_on_kafka.cli.ready import remove_ready_file, write_ready_file
from amps_on_kafka.config import check_listen, load_config
from amps_on_kafka.config.model import same_port
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.processor.collections import freeze_long_lived
from amps_on_kafka.processor.startup import check_serves_something
from amps_on_kafka.processor.summary import GatewayCounts, Summary
from amps_on_kafka.processor.worker import Worker

if TYPE_CHECKING:
    from amps_on_kafka.admin import AdminServer
    from amps_on_kafka.config import Config


class _Stopped(Exception):
    """Raised in the main thread by the first SIGINT or SIGTERM, wherever it is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else check_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command()
@click.option("--config", "config_file", required=True, type=click.Path(path_type=Path))
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=Path("state"), show_default=True
)
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    callback=_listen,
    help="Gateway address (default: the config's, else 127.0.0.1:9007).",
)
@click.option(
    "--group", "group_id", default=None, help="Kafka consumer group shared by the workers."
)
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership: a restart with the same id takes its partitions back "
    "at once (default: the config's Worker InstanceId).",
)
@bootstrap_option
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Once ready, write JSON {gateway, admin, pid, state_dir} here (removed at exit).",
)
@log_options
@reports_errors
def worker(
    config_file, state_dir, listen, group_id, instance_id, bootstrap, ready_file, level, log_format
) -> None:
    """Keep the SOW of the config's topics in RocksDB and serve the gateway protocol.

    Stops cleanly on SIGTERM (exit code 0) or Ctrl-C (130), during startup too: the
    current batch is written, stores closed. Once it serves it prints
    `worker ready: gateway=URI state=DIR` on stderr, and writes --ready-file.
    """
    setup_logging(level, log_format)
    config = load_config(config_file)
    check_serves_something(config, str(config_file))  # before waiting for Kafka
    if listen and config.admin.listen and same_port(config.admin.listen, listen):
        raise ConfigError(  # the config's own Gateway.Listen is checked at load
            f"--listen {listen} takes the port of Admin.Listen {config.admin.listen!r}"
        )
    _check_security_files(config, config_file)
    servers = kafka(bootstrap, config.kafka)
    processor = Worker(config, servers, state_dir, group_id=group_id, instance_id=instance_id)
    stopping = _raise_on_signals()
    try:
        _serve(processor, servers, listen or config.gateway.listen, stopping, ready_file)
    except _Stopped as stopped:
        if stopped.signum == signal.SIGINT:
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _check_security_files(config: Config, config_file: Path) -> None:
    """TLS files and the users file, checked before recovery (which may take minutes):
    the gateway would meet them only once it serves."""
    from amps_on_kafka.security.policy import file_problems

    problems = file_problems(config)
    if problems:
        raise ConfigError(f"{config_file}: {'; '.join(problems)}")


def _warn_about_logons(config: Config, listen: str) -> None:
    """A set-up nobody can log on to, or one that takes passwords in clear from the
    network, is pointed out once the gateway serves: a start that fails says one line."""
    from amps_on_kafka.security.policy import clear_password_note, no_logon_note

    for note in (no_logon_note(config), clear_password_note(config, listen)):
        if note is not None:
            logging.getLogger(__name__).warning("%s", note)


def _raise_on_signals() -> threading.Event:
    """SIGINT and SIGTERM raise _Stopped in the main thread, until the returned event
    is set: a signal while the worker closes its stores must not cut that short."""
    stopping = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            raise _Stopped(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
    return stopping


def _serve(
    processor: Worker,
    servers: str,
    listen: str,
    stopping: threading.Event,
    ready_file: Path | None,
) -> None:
    """Start the worker, then its gateway; run until a signal or a failure; stop both."""
    gateway = admin = None
    remove_ready_file(ready_file)  # a stale one must not say "ready" before this worker is
    try:
        if processor.queues is not None:  # workers sharing a queue config elect one owner
            processor.queues.share(processor.config.worker.session_timeout)
        processor.start()
        admin = _start_admin(processor)  # /health and /ready answer during recovery too
        processor.wait_ready()
        gateway = _start_gateway(processor, servers, listen)
        _warn_about_logons(processor.config, listen)
        freeze_long_lived()
        if admin is not None:
            admin.sources.gateway = gateway
        # Before the ready line: a signal that its reader sends at once must not land in
        # Thread.start (the handler raises there, and the new thread dies on a KeyError).
        Summary(processor, gateway=partial(_gateway_counts, gateway)).start(stopping)
        scheme = "tcps" if processor.config.gateway.tls is not None else "tcp"
        _announce(f"{scheme}://{gateway.address}", processor.state_dir, ready_file, admin)
        # Not Thread.join: a signal interrupting it marks the thread as stopped (CPython's
        # bpo-45274 handling), and stop() would then not wait for the stores to close.
        while not stopping.wait(0.5):
            processor.raise_if_failed()
    finally:
        stopping.set()
        remove_ready_file(ready_file)
        if admin is not None:
            admin.stop()
        if gateway is not None:
            if gateway.cluster is not None:
                gateway.cluster.leave()
            gateway.stop()
        processor.stop()


def _announce(
    gateway: str, state_dir: Path, ready_file: Path | None, admin: AdminServer | None
) -> None:
    """The ready line (space-separated key=value, nothing glued to the URI) and file;
    `gateway` is scheme://host:port (tcps:// when the gateway serves TLS). The state
    directory is made absolute: a reader may run in another directory than the worker."""
    uri = f"{gateway}/amps/json"
    state_dir = state_dir.resolve()
    admin_url = None if admin is None else f"http://{admin.address}"
    if ready_file is not None:  # first: whoever saw the line finds the file
        info = {"gateway": uri, "admin": admin_url, "pid": os.getpid(), "state_dir": str(state_dir)}
        write_ready_file(ready_file, info)
    shown = "" if admin_url is None else f" admin={admin_url}"
    announce(
        f"worker ready: gateway={uri}{shown} state={state_dir}",
        event="ready",
        gateway=uri,
        admin=admin_url,
        state_dir=str(state_dir),
    )


def _gateway_counts(gateway) -> GatewayCounts:
    stats = gateway.stats
    return GatewayCounts(gateway.session_count, stats.slow_consumers, stats.refused)


def _start_admin(processor: Worker) -> AdminServer | None:
    """The admin port (docs/operations.md, Metrics and admin), when Admin.Listen is set."""
    settings = processor.config.admin
    if settings.listen is None:
        return None
    from amps_on_kafka.admin import AdminServer, BasicAuth, Sources
    from amps_on_kafka.security.policy import Security

    # whoever may log on to the gateway may read the port (Anonymous: true lets anyone),
    # or only the users Admin.Users lists
    authorize = BasicAuth(Security.from_config(processor.config), settings.users)
    admin = AdminServer(Sources(processor), settings, authorize=authorize)
    admin.start()
    return admin


def _start_gateway(processor: Worker, servers: str, listen: str):
    from amps_on_kafka.security.policy import Security
    from amps_on_kafka.server import Gateway
    from amps_on_kafka.server.cluster import Cluster

    gateway = Gateway(
        processor.engine,
        servers,
        listen=listen,
        settings=processor.config.gateway,
        queues=processor.queues,
        security=Security.from_config(processor.config),
    )
    gateway.address = gateway.start()
    gateway.cluster = Cluster.join(gateway, processor.group_id, processor.instance_id)
    return gateway
