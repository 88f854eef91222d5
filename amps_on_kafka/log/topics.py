"""Creating log topics: LogAppendTime, so the broker stamps each record's arrival time.

Expiration deadlines and timestamp bookmarks are computed from that stamp, so a replay,
a restore or a Spark job computes the same deadline as the live worker did.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import orjson
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from amps_on_kafka.config import Config, TopicConfig
from amps_on_kafka.errors import ConfigError, TransportError
from amps_on_kafka.log.kafka import METADATA_TIMEOUT
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec

LOG_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}
REPARTITION_PREFIX = "_amps_repartition."
# On a delete by filter of a repartitioned topic: the internal partition it is meant for.
H_TARGET_PARTITION = "rp"


@dataclass(frozen=True)
class Created:
    name: str
    created: bool  # False when the topic already existed
    registered: bool = True  # False when the registry already held this very spec

    @property
    def outcome(self) -> str:
        if self.created:
            return "created"
        return "exists, registered" if self.registered else "exists"


def spec_from_config(config: Config, topic: TopicConfig) -> TopicSpec:
    """Join a log topic with its SOW definition into what clients need to publish."""
    sow = config.sow_for(topic.name)
    schema = None
    if topic.schema_path is not None:
        schema = _read_schema(topic)
    return TopicSpec(
        name=topic.name,
        partitions=topic.partitions,
        message_type=topic.message_type,
        schema=schema,
        key=sow.key if sow else None,
        key_from_publish=sow.key_from_publish if sow else False,
        partitioner=topic.partitioner,
        repartition=sow.repartition if sow else False,
    )


def _read_schema(topic: TopicConfig) -> dict:
    try:
        return orjson.loads(topic.schema_path.read_bytes())  # type: ignore[union-attr]
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(
            f"topic {topic.name}: can't read Avro schema {topic.schema_path}: {exc}"
        ) from exc


def create_log_topics(
    admin: AdminClient,
    registry: TopicRegistry,
    specs: Iterable[tuple[TopicSpec, int, float | None]],
) -> list[Created]:
    """Create topics (spec, replication factor, retention seconds) and register them.

    Rerunning with the same specs changes nothing. A topic that exists with another spec
    (key, partitions, partitioner, ...) is refused, naming both, before anything is
    created or registered: re-registering it would make publishers place its SOW keys
    elsewhere and split a key over two partitions (defect 3). An existing topic without
    a registry entry (made by other tools) is registered if its partition count matches.
    """
    specs = list(specs)
    if not specs:
        return []
    counts = _partition_counts(admin, [spec.name for spec, _, _ in specs])
    entries = registry.entries()
    conflicts = _conflicts([spec for spec, _, _ in specs], counts, entries)
    if conflicts:
        raise ConfigError("\n".join(conflicts))
    created = create_topics(
        admin,
        [
            NewTopic(spec.name, spec.partitions, rf, config=_topic_config(retention))
            for spec, rf, retention in specs
            if spec.name not in counts
        ],
    )
    create_topics(admin, [new_repartition_topic(*entry) for entry in specs if entry[0].repartition])
    results = []
    for spec, _, _ in specs:
        is_new = created.get(spec.name, False)
        register = is_new or (spec.name in counts and entries.get(spec.name) != spec)
        if register:
            registry.register(spec)
        results.append(Created(spec.name, is_new, register))
    return results


def conflicts_with_kafka(
    admin: AdminClient, registry: TopicRegistry, specs: list[TopicSpec]
) -> list[str]:
    """Why `create_log_topics` would refuse each of these specs, changing nothing
    (`amps-kafka config check --kafka`)."""
    counts = _partition_counts(admin, [spec.name for spec in specs])
    return _conflicts(specs, counts, registry.entries())


def _conflicts(
    specs: list[TopicSpec], counts: dict[str, int], entries: dict[str, TopicSpec]
) -> list[str]:
    return [
        problem
        for spec in specs
        if (problem := _conflict(spec, counts.get(spec.name), entries.get(spec.name)))
    ]


def _partition_counts(admin: AdminClient, names: list[str]) -> dict[str, int]:
    """Kafka's partition count of each of `names` that exists, from one metadata request."""
    try:
        metadata = admin.list_topics(timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka: {exc}") from exc
    return {
        name: len(info.partitions)
        for name in names
        if (info := metadata.topics.get(name)) is not None and info.error is None
    }


def _conflict(spec: TopicSpec, count: int | None, entry: TopicSpec | None) -> str | None:
    """Why `spec` can't be (re)registered for a topic with `count` partitions in Kafka
    and this registry entry; None when it can. A missing topic is created afresh.

    Turning Repartition on is the one change allowed: the SOW is then kept from the
    internal topic, so where the source holds its keys no longer matters (nor its
    partition count). Turning it off is refused: the source's keys may be anywhere."""
    if count is None:
        return None
    if entry is not None and entry not in (spec, replace(spec, repartition=False)):
        why = "" if entry.describe() != spec.describe() else " (their Avro schemas differ)"
        return (
            f"topic {spec.name!r} exists with another spec{why}; refused, nothing changed:\n"
            f"  registered: {entry.describe()}\n"
            f"  requested:  {spec.describe()}\n"
            "  (another key, partition count or partitioner would put its SOW keys in "
            "other partitions than its records; create a new topic instead)"
        )
    if count != spec.partitions and not spec.repartition:
        return (
            f"topic {spec.name!r} has {count} partitions in Kafka, not the "
            f"{spec.partitions} its spec says ({spec.describe()}): SOW keys are placed by "
            "the partition count, so a topic whose partitions were added can't keep its "
            "keys where they are (docs/operations.md, The rule: one SOW key, one partition)"
        )
    return None


def create_topics(admin: AdminClient, topics: list[NewTopic]) -> dict[str, bool]:
    """Create the topics; for each, True, or False if it existed already."""
    if not topics:
        return {}
    futures = admin.create_topics(topics, operation_timeout=METADATA_TIMEOUT)
    created = {t.topic: _created(futures[t.topic], t.topic) for t in topics}
    _await_listed(admin, {t.topic: t.num_partitions for t in topics if created[t.topic]})
    return created


def _await_listed(admin: AdminClient, partitions: dict[str, int]) -> None:
    """Return once Kafka's metadata lists each topic with its partitions. A topic is made
    by the controller and reaches a broker's metadata a moment later (a few ms, more on
    a loaded machine): a publisher or worker asking at once would be told it does not
    exist. Kafka offers nothing to wait on, so its metadata is asked again until then."""
    deadline = time.monotonic() + METADATA_TIMEOUT
    while partitions and _partition_counts(admin, list(partitions)) != partitions:
        if time.monotonic() > deadline:
            raise TransportError(
                f"Kafka created {', '.join(map(repr, partitions))}, but its metadata does "
                f"not list them with their partitions after {METADATA_TIMEOUT:g} s"
            )
        time.sleep(0.02)


def repartition_topic(topic: str) -> str:
    """The internal topic that holds a repartitioned topic's records keyed by SOW key
    (processor/repartition.py)."""
    return REPARTITION_PREFIX + topic


def new_repartition_topic(spec: TopicSpec, replication: int, retention: float | None) -> NewTopic:
    """The internal topic of a repartitioned `spec`: as many partitions, the source's
    retention (the SOW is rebuilt from it), and CreateTime: each copy keeps the source
    record's LogAppendTime, so expirations are computed from when it was published."""
    config = {"message.timestamp.type": "CreateTime"}
    if retention is not None:
        config["retention.ms"] = str(int(retention * 1000))
    return NewTopic(repartition_topic(spec.name), spec.partitions, replication, config=config)


def create_from_config(
    admin: AdminClient, registry: TopicRegistry, config: Config
) -> list[Created]:
    """The config's log topics, and a registry entry for each queue whose name is not a
    topic, naming its DefaultPublishTarget: a `kafka://` publish to the queue's name then
    lands where a gateway publish would (seed 001)."""
    created = create_log_topics(
        admin,
        registry,
        ((spec_from_config(config, t), t.replication_factor, t.retention) for t in config.topics),
    )
    for queue in config.queues:
        target = queue.publish_target
        if target not in (None, queue.name) and queue.enqueues_publishes_to_its_name:
            registry.register(TopicSpec(name=queue.name, publish_target=target))
    return created


def _topic_config(retention: float | None) -> dict[str, str]:
    config = dict(LOG_TOPIC_CONFIG)
    if retention is not None:
        config["retention.ms"] = str(int(retention * 1000))
    return config


def _created(future, name: str) -> bool:
    try:
        future.result()
        return True
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise TransportError(f"can't create topic {name!r}: {exc.args[0].str()}") from exc
