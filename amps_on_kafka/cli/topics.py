"""`amps-kafka topics`: create, list, describe and delete log topics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click
import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from amps_on_kafka.cli.common import (
    bootstrap_option,
    echo_json,
    format_option,
    kafka,
    reports_errors,
)
from amps_on_kafka.cli.log import topic_configs
from amps_on_kafka.config import check_key_path, check_topic_name, load_config
from amps_on_kafka.errors import ConfigError, TransportError, UnknownTopic
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    partitions_matching,
    partitions_of,
    topic_names,
)
from amps_on_kafka.log.keys import PARTITIONERS
from amps_on_kafka.log.registry import REGISTRY_TOPIC, TopicRegistry, TopicSpec
from amps_on_kafka.log.topics import create_from_config, create_log_topics, repartition_topic


@click.group()
def topics() -> None:
    """Create, list, describe and delete log topics."""


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
        servers = kafka(bootstrap, config.kafka)
        results = create_from_config(admin_client(servers), TopicRegistry(servers), config)
    else:
        try:
            check_topic_name(name)
            for path in keys:
                check_key_path(path)
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
@format_option
@reports_errors
def list_(bootstrap, output) -> None:
    """List log topics with their partition counts."""
    # one metadata request for every topic: asking per topic after listing them failed
    # the whole command when one was deleted in between
    listed = partitions_matching(admin_client(kafka(bootstrap)), lambda _: True)
    counts = Counter(name for name, _ in listed)
    if output == "json":
        echo_json([{"name": name, "partitions": count} for name, count in counts.items()])
        return
    for name, count in counts.items():
        click.echo(f"{name}\t{count}")


@topics.command("describe")
@click.argument("name")
@bootstrap_option
@format_option
@reports_errors
def describe(name, bootstrap, output) -> None:
    """NAME's registered spec (what clients publish with) beside Kafka's own view: its
    partitions with their leaders and replicas, and the configuration set on the topic
    itself."""
    servers = kafka(bootstrap)
    spec = TopicRegistry(servers).entries().get(name)
    admin = admin_client(servers)
    view = _kafka_view(admin, name)
    if spec is None and view is None:
        raise UnknownTopic(f"topic {name!r} is neither in Kafka nor in the topic registry")
    if output == "json":
        registered = orjson.loads(spec.to_json()) if spec is not None else None
        echo_json({"name": name, "registered": registered, "kafka": view})
        return
    click.echo(f"{name}")
    click.echo(f"  registered: {spec.describe() if spec else 'no (read as JSON without a key)'}")
    if view is None:
        click.echo("  in Kafka:   no (the registry entry outlived its topic)")
        return
    click.echo(
        f"  in Kafka:   {len(view['partitions'])} partitions, "
        f"replication factor {view['replication_factor']}"
    )
    for partition in view["partitions"]:
        click.echo(
            f"    partition {partition['partition']}: leader {partition['leader']}, "
            f"replicas {partition['replicas']}, in sync {partition['in_sync']}"
        )
    for key, value in view["configs"].items():
        click.echo(f"    {key}={value}")


def _kafka_view(admin: AdminClient, name: str) -> dict | None:
    """Kafka's metadata of the topic, or None when Kafka doesn't have it."""
    try:
        partitions_of(admin, name)
    except UnknownTopic:
        return None
    try:
        info = admin.list_topics(name, timeout=METADATA_TIMEOUT).topics[name]
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka for metadata of {name!r}: {exc}") from exc
    partitions = [
        {
            "partition": p.id,
            "leader": p.leader,
            "replicas": list(p.replicas),
            "in_sync": list(p.isrs),
        }
        for p in sorted(info.partitions.values(), key=lambda p: p.id)
    ]
    return {
        "partitions": partitions,
        "replication_factor": len(partitions[0]["replicas"]) if partitions else 0,
        "configs": topic_configs(admin, name, own_only=True),
    }


@topics.command("delete")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--yes", "-y", is_flag=True, help="Don't ask for confirmation.")
@bootstrap_option
@reports_errors
def delete(names, yes, bootstrap) -> None:
    """Delete log topics from Kafka, with every record they hold, and their registry
    entries (a repartitioned topic's internal topic too). Workers serving them must be
    stopped first: their stores are left as they are."""
    if REGISTRY_TOPIC in names:
        raise click.UsageError(f"{REGISTRY_TOPIC} is the topic registry itself: not deleted")
    servers = kafka(bootstrap)
    registry = TopicRegistry(servers)
    entries = registry.entries()
    admin = admin_client(servers)
    existing = set(topic_names(admin, internal=True))
    unknown = [n for n in names if n not in existing and n not in entries]
    if unknown:
        raise UnknownTopic(f"no such topic: {', '.join(unknown)} (nothing deleted)")
    doomed = [n for n in names if n in existing]
    doomed += [
        repartition_topic(n)
        for n in names
        if n in entries and entries[n].repartition and repartition_topic(n) in existing
    ]
    if not yes:
        question = (
            f"Delete {', '.join(doomed)} and every record in them (and the registry entries)?"
            if doomed
            else f"Delete the registry entries of {', '.join(names)} (not topics in Kafka)?"
        )
        click.confirm(question, abort=True, err=True)
    _delete_topics(admin, doomed)
    for name in names:
        if name in entries:
            registry.unregister(name)
        click.echo(f"{name}: deleted" + ("" if name in existing else " (registry entry)"))


def _delete_topics(admin: AdminClient, names: list[str]) -> None:
    if not names:
        return
    futures = admin.delete_topics(names, operation_timeout=METADATA_TIMEOUT)
    for name, future in futures.items():
        try:
            future.result(METADATA_TIMEOUT)
        except KafkaException as exc:
            raise TransportError(f"Kafka did not delete {name!r}: {exc}") from exc
