"""`amps-kafka topics`: create and list log topics."""

from __future__ import annotations

from pathlib import Path

import click

from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.config import check_topic_name, load_config
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.log.kafka import admin_client, partitions_of, topic_names
from amps_on_kafka.log.keys import PARTITIONERS
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec
from amps_on_kafka.log.topics import create_from_config, create_log_topics


@click.group()
def topics() -> None:
    """Create and list log topics."""


@topics.command("create")
@click.argument("name", required=False)
@click.option("--partitions", "-p", type=click.IntRange(1, 10_000), default=1, show_default=True)
@click.option(
    "--key", "keys", multiple=True, metavar="PATH", help="SOW key path, e.g. /id (repeatable)."
)
@click.option(
    "--message-type", type=click.Choice(["json", "binary"]), default="json", show_default=True
)
@click.option(
    "--partitioner",
    type=click.Choice(PARTITIONERS),
    default="murmur2",
    show_default=True,
    help="How the topic's producers place keys: murmur2 (Java, this project), crc32 "
    "(librdkafka's default, kcat), fnv1a (Sarama).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="Create every topic a config declares.",
)
@bootstrap_option
@reports_errors
def create(name, partitions, keys, message_type, partitioner, config_file, bootstrap) -> None:
    """Create log topics (LogAppendTime), by NAME or from a --config file.

    Rerunning with the same spec changes nothing; a topic that exists with another spec
    is refused, showing both.
    """
    if (name is None) == (config_file is None):
        raise click.UsageError("give either NAME or --config FILE")
    if config_file is not None:
        config = load_config(config_file)
        servers = kafka(bootstrap or config.kafka.bootstrap_servers)
        results = create_from_config(admin_client(servers), TopicRegistry(servers), config)
    else:
        try:
            check_topic_name(name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        servers = kafka(bootstrap)
        spec = TopicSpec(
            name,
            partitions,
            message_type=message_type,
            key=tuple(keys) or None,
            partitioner=partitioner,
        )
        results = create_log_topics(
            admin_client(servers), TopicRegistry(servers), [(spec, 1, None)]
        )
    for result in results:
        click.echo(f"{result.name}: {result.outcome}")


@topics.command("list")
@bootstrap_option
@reports_errors
def list_(bootstrap) -> None:
    """List log topics with their partition counts."""
    admin = admin_client(kafka(bootstrap))
    for name in topic_names(admin):
        click.echo(f"{name}\t{len(partitions_of(admin, name))}")
