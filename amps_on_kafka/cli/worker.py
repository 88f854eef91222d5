"""`amps-kafka worker`: the processor worker and its gateway, in the foreground."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import click

from amps_on_kafka.cli.common import kafka, reports_errors
from amps_on_kafka.config import load_config
from amps_on_kafka.processor.worker import Worker


@click.command()
@click.option("--config", "config_file", required=True, type=click.Path(path_type=Path))
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=Path("state"), show_default=True
)
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="Gateway address (default: the config's, else 127.0.0.1:9007).",
)
@click.option(
    "--group", "group_id", default=None, help="Kafka consumer group shared by the workers."
)
@click.option("--bootstrap", "-b", default=None, metavar="HOST:PORT")
@click.option("--log-level", default="INFO", show_default=True)
@reports_errors
def worker(config_file, state_dir, listen, group_id, bootstrap, log_level) -> None:
    """Keep the SOW of the config's topics in RocksDB and serve the gateway protocol.

    Stops cleanly on SIGTERM or Ctrl-C: the current batch is written, stores closed.
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = load_config(config_file)
    servers = kafka(bootstrap or config.kafka.bootstrap_servers)
    processor = Worker(config, servers, state_dir, group_id=group_id)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    processor.start()
    processor.wait_ready()
    gateway = _start_gateway(
        processor, servers, listen or config.gateway.listen, config.gateway.max_frame_bytes
    )
    click.echo(
        f"worker ready: gateway tcp://{gateway.address}/amps/json, state in {state_dir}", err=True
    )
    try:
        while not stop.wait(0.5):
            processor.raise_if_failed()
    finally:
        gateway.stop()
        processor.stop()


def _start_gateway(processor: Worker, servers: str, listen: str, max_frame_bytes: int):
    from amps_on_kafka.server import Gateway

    gateway = Gateway(
        processor.engine,
        servers,
        listen=listen,
        max_frame_bytes=max_frame_bytes,
        queues=processor.queues,
    )
    gateway.address = gateway.start()
    return gateway
