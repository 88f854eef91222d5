"""Creating log topics: LogAppendTime, so the broker stamps each record's arrival time.

Expiration deadlines and timestamp bookmarks are computed from that stamp, so a replay,
a restore or a Spark job computes the same deadline as the live worker did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from amps_on_kafka.config import Config, TopicConfig
from amps_on_kafka.errors import ConfigError, TransportError
from amps_on_kafka.log.kafka import METADATA_TIMEOUT
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec

LOG_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}


@dataclass(frozen=True)
class Created:
    name: str
    created: bool  # False when the topic already existed


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

    An existing topic is left as it is and re-registered, so `create` can be rerun.
    """
    specs = list(specs)
    new_topics = [
        NewTopic(spec.name, spec.partitions, replication, config=_topic_config(retention))
        for spec, replication, retention in specs
    ]
    if not new_topics:
        return []
    futures = admin.create_topics(new_topics, operation_timeout=METADATA_TIMEOUT)
    results = []
    for spec, _, _ in specs:
        results.append(Created(spec.name, _created(futures[spec.name], spec.name)))
        registry.register(spec)
    return results


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
