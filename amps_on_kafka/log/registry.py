"""The topic registry: what every client must know about a log topic, kept in Kafka.

AMPS clients learn a topic's message type and SOW key from the server's configuration.
Here there is no server between a `kafka://` publisher and the log, so `topics create`
records each topic's spec in a compacted topic, `_amps_topics`, and every client and
worker reads it. The publisher needs the Key paths to put a record's SOW key in its
Kafka key: that keeps one SOW key in one partition, in one order.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from amps_on_kafka.errors import MessageError, TransportError
from amps_on_kafka.log.codecs import Codec, codec_for
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    consume_available,
    log_producer,
    partitions_of,
    reader,
)
from amps_on_kafka.log.keys import KeyExtractor

REGISTRY_TOPIC = "_amps_topics"


@dataclass(frozen=True)
class TopicSpec:
    """A log topic as clients see it: how to encode payloads and compute SOW keys."""

    name: str
    partitions: int = 1
    message_type: str = "json"
    schema: dict[str, Any] | None = None
    key: tuple[str, ...] | None = None
    key_from_publish: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    publish_target: str | None = None  # a queue's name: its publishes go to this topic
    partitioner: str = "murmur2"  # how the topic's producers place keys (keys.partition_for)
    repartition: bool = False  # the worker re-keys the records (processor/repartition.py)

    @cached_property
    def codec(self) -> Codec:
        return codec_for(self.message_type, self.schema)

    @cached_property
    def key_extractor(self) -> KeyExtractor | None:
        return KeyExtractor(self.key) if self.key else None

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "name": self.name,
                "partitions": self.partitions,
                "message_type": self.message_type,
                "schema": self.schema,
                "key": list(self.key) if self.key else None,
                "key_from_publish": self.key_from_publish,
                "publish_target": self.publish_target,
                "partitioner": self.partitioner,
                "repartition": self.repartition,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> TopicSpec:
        doc = orjson.loads(raw)
        return cls(
            name=doc["name"],
            partitions=int(doc.get("partitions", 1)),
            message_type=doc.get("message_type", "json"),
            schema=doc.get("schema"),
            key=tuple(doc["key"]) if doc.get("key") else None,
            key_from_publish=bool(doc.get("key_from_publish", False)),
            publish_target=doc.get("publish_target"),
            partitioner=doc.get("partitioner", "murmur2"),
            repartition=bool(doc.get("repartition", False)),
        )

    def describe(self) -> str:
        """The spec in the words of `topics create`'s options, for messages that compare
        two specs."""
        parts = [
            f"{self.partitions} partition{'s' if self.partitions != 1 else ''}",
            f"key {', '.join(self.key)}" if self.key else "no key",
            self.message_type,
            f"partitioner {self.partitioner}",
        ]
        if self.key_from_publish:
            parts.append("key from publish")
        if self.repartition:
            parts.append("repartitioned")
        if self.publish_target:
            parts.append(f"publishes to {self.publish_target}")
        if self.schema is not None:
            parts.append("with an Avro schema")
        return ", ".join(parts)


class TopicRegistry:
    """Reads the registry once and again on a miss; thread-safe for the gateway."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._specs: dict[str, TopicSpec] = {}
        self._lock = threading.Lock()
        self._admin = admin_client(bootstrap)

    def spec(self, name: str) -> TopicSpec:
        """The spec of an existing topic; UnknownTopic when Kafka lacks it.

        A topic created by other tools has no registry entry: it is JSON without a key.
        A queue's name whose publishes go elsewhere (seed 001) gives its target's spec.
        """
        with self._lock:
            if name not in self._specs:
                self._specs.update(self._read_all())
            found = self._specs.get(name)
        if found is not None and found.publish_target not in (None, name):
            return self.spec(found.publish_target)  # type: ignore[arg-type]
        partitions = partitions_of(self._admin, name)
        if found is None:
            return TopicSpec(name=name, partitions=len(partitions))
        return found

    def entries(self) -> dict[str, TopicSpec]:
        """Every entry of the registry, read afresh (what `topics create` compares with)."""
        specs = self._read_all()
        with self._lock:
            self._specs.update(specs)
        return specs

    def register(self, spec: TopicSpec) -> None:
        self._write(spec.name, spec.to_json())
        with self._lock:
            self._specs[spec.name] = spec

    def unregister(self, name: str) -> None:
        """Forget a topic's entry (`topics delete`): a tombstone, which compaction keeps
        until every reader has seen it, then drops with the entry."""
        self._write(name, None)
        with self._lock:
            self._specs.pop(name, None)

    def _write(self, name: str, value: bytes | None) -> None:
        ensure_registry_topic(self._admin)
        # Not idempotent: one record, keyed, whose value is the whole entry, so a retry's
        # duplicate changes nothing; an idempotent producer's first send waits for its
        # producer id, 0.1-1 s (a test run creates over a thousand topics).
        producer = log_producer(self.bootstrap, **{"linger.ms": 0, "enable.idempotence": False})
        try:
            producer.produce(REGISTRY_TOPIC, key=name.encode(), value=value)
            if producer.flush(METADATA_TIMEOUT) != 0:
                raise TransportError(f"Kafka did not acknowledge the registry entry for {name!r}")
        finally:
            producer.close()

    def _read_all(self) -> dict[str, TopicSpec]:
        consumer = reader(self.bootstrap)
        try:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(REGISTRY_TOPIC, 0), timeout=METADATA_TIMEOUT
                )
            except KafkaException:
                return {}  # no registry topic yet: nothing registered
            specs: dict[str, TopicSpec] = {}
            if high <= low:
                return specs
            consumer.assign([TopicPartition(REGISTRY_TOPIC, 0, low)])
            deadline = time.monotonic() + METADATA_TIMEOUT
            while _position(consumer) < high:
                if time.monotonic() > deadline:
                    raise TransportError("timed out reading the topic registry")
                # returns once records arrive: consume's batch waits out its timeout
                for record in consume_available(consumer, 1000, 0.5):
                    if not record.error():
                        _apply(specs, record.key(), record.value())
            return specs
        finally:
            consumer.close()


def _position(consumer) -> int:
    offset = consumer.position([TopicPartition(REGISTRY_TOPIC, 0)])[0].offset
    return max(offset, 0)


def _apply(specs: dict[str, TopicSpec], key: bytes | None, value: bytes | None) -> None:
    if key is None:
        return
    if value is None:
        specs.pop(key.decode(), None)
        return
    try:
        specs[key.decode()] = TopicSpec.from_json(value)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, MessageError):
        return  # an entry this version can't read is ignored, not fatal


def ensure_registry_topic(admin) -> None:
    futures = admin.create_topics(
        [NewTopic(REGISTRY_TOPIC, 1, 1, config={"cleanup.policy": "compact"})],
        operation_timeout=METADATA_TIMEOUT,
    )
    try:
        futures[REGISTRY_TOPIC].result()
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise TransportError(f"can't create the topic registry: {exc}") from exc
