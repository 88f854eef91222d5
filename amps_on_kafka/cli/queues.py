"""`amps-kafka queues delete`: a queue's own state in Kafka, which `topics delete` of its
underlying topics leaves alone (a queue may view several topics, and is no topic)."""

from __future__ import annotations

import click
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from amps_on_kafka.cli.common import bootstrap_option, kafka, reports_errors
from amps_on_kafka.cli.topics import _delete_topics
from amps_on_kafka.errors import TransportError, UnknownTopic
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, admin_client, topic_names
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.processor.queue_owner import OWNER_GROUP_PREFIX
from amps_on_kafka.processor.queue_recovery import GROUP_PREFIX
from amps_on_kafka.processor.queue_runtime import events_topic


@click.group()
def queues() -> None:
    """A queue's state in Kafka."""


@queues.command("delete")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--yes", "-y", is_flag=True, help="Don't ask for confirmation.")
@bootstrap_option
@reports_errors
def delete(names: tuple[str, ...], yes: bool, bootstrap: str | None) -> None:
    """Forget queues: delete each one's events topic (_amps_queue.NAME, its acks and
    cancels), its consumer groups (its recovery point, its owner election) and the
    registry entry that routes publishes to its name. The underlying topics and their
    messages stay. Stop the workers serving the queue first (refused while one runs),
    and delete <state-dir>/_queues/NAME on each: a worker keeping it would bring the
    old queue back."""
    servers = kafka(bootstrap)
    admin = admin_client(servers)
    registry = TopicRegistry(servers)
    existing, groups, routes = _queue_parts(admin, registry, names)
    unknown = [n for n in names if not (existing[n] or groups[n] or n in routes)]
    if unknown:
        raise UnknownTopic(f"no such queue in Kafka: {', '.join(unknown)} (nothing deleted)")
    if not yes:
        click.confirm(
            f"Delete the state of queue(s) {', '.join(names)} (what was acknowledged; "
            "the messages stay in their topics)?",
            abort=True,
            err=True,
        )
    _delete_groups(admin, [g for n in names for g in groups[n]])
    _delete_topics(admin, [events_topic(n) for n in names if existing[n]])
    for name in names:
        if name in routes:
            registry.unregister(name)
        click.echo(f"{name}: deleted")


def _queue_parts(
    admin: AdminClient, registry: TopicRegistry, names: tuple[str, ...]
) -> tuple[dict[str, bool], dict[str, list[str]], set[str]]:
    """Per queue: whether its events topic exists, which of its groups do; and the names
    the registry routes to a publish target (a queue's name, seed 001)."""
    topics = set(topic_names(admin, internal=True))
    try:
        listed = admin.list_consumer_groups().result(METADATA_TIMEOUT).valid
    except KafkaException as exc:
        raise TransportError(f"can't list Kafka's consumer groups: {exc}") from exc
    ids = {g.group_id for g in listed}
    existing = {n: events_topic(n) in topics for n in names}
    groups = {
        n: [g for g in (f"{GROUP_PREFIX}{n}", f"{OWNER_GROUP_PREFIX}{n}") if g in ids]
        for n in names
    }
    routes = {n for n, spec in registry.entries().items() if spec.publish_target is not None}
    return existing, groups, routes


def _delete_groups(admin: AdminClient, groups: list[str]) -> None:
    """The owner groups first: one with members means a worker runs the queue, and
    refusing then leaves everything as it was (the recovery groups have no members:
    their offsets are committed without joining)."""
    owners = [g for g in groups if g.startswith(OWNER_GROUP_PREFIX)]
    for batch in (owners, [g for g in groups if g not in owners]):
        if not batch:
            continue
        for group, future in admin.delete_consumer_groups(batch).items():
            try:
                future.result(METADATA_TIMEOUT)
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code == KafkaError.NON_EMPTY_GROUP:
                    raise TransportError(
                        f"consumer group {group} has members: a worker still runs the "
                        "queue (stop it first; nothing deleted)"
                    ) from exc
                if code != KafkaError.GROUP_ID_NOT_FOUND:
                    raise TransportError(f"Kafka did not delete group {group}: {exc}") from exc
