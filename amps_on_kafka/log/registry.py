"""The topic registry: what every client must know about a log topic, kept in Kafka.

AMPS clients learn a topic's message type and SOW key from the server's configuration.
Here there is no server between a `kafka://` publisher and the log, so `topics create`
records each topic's spec in a compacted topic, `_amps_topics`, and every client and
worker reads it. The publisher needs the Key paths to put a record's SOW key in its
Kafka key: that keeps one SOW key in one partition, in one order.
"""

from __future__ import annotations

import inspect
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

import orjson
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic, OffsetSpec  # type: ignore[attr-defined]

from amps_on_kafka.errors import MessageError, TransportError
from amps_on_kafka.log.codecs import Codec, codec_for
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    consume_available,
    log_producer,
    partitions_of,
    reader,
    topic_names,
    unknown_topic,
)
from amps_on_kafka.log.keys import KeyExtractor

REGISTRY_TOPIC = "_amps_topics"
# A name that is neither registered nor a topic in Kafka is remembered as unknown for
# UNKNOWN_TOPIC_TTL seconds, at most UNKNOWN_NAMES of them (the oldest forgotten first):
# a client publishing to a misspelt topic in a loop is refused at once, with no registry
# read and no metadata request each time. A topic created meanwhile (by another process)
# is usable at most UNKNOWN_TOPIC_TTL seconds after it was created.
UNKNOWN_TOPIC_TTL = 1.0
UNKNOWN_NAMES = 4096
# Kafka's topic list, read to tell a new name from a topic, is read at most this often
# (every caller waiting meanwhile shares the next read): a flood of random names costs
# the brokers at most one metadata request per interval, and no registry read at all.
TOPIC_LIST_INTERVAL = 0.1

T = TypeVar("T")


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


class Covering(Generic[T]):
    """`fetch()` shared by the threads asking at once: a caller gets the result (or the
    error) of a call that began after it asked, so it sees whatever happened before it
    asked, and every caller waiting meanwhile shares the next call. Calls begin at most
    every `interval` seconds: the caller due to make one waits out the rest first, and
    those asking meanwhile share its call."""

    def __init__(self, fetch: Callable[[], T], interval: float = 0.0) -> None:
        # a registry's bound method held weakly: no cycle keeping a registry (its admin
        # client and that client's threads) alive until the garbage collector runs
        self._fetch: Callable[[], Callable[[], T] | None] = (
            weakref.WeakMethod(fetch) if inspect.ismethod(fetch) else lambda: fetch
        )
        self._interval = interval
        self._changed = threading.Condition()
        self.calls = 0  # begun
        self._done = 0  # the number of the last call that ended, whose result is kept
        self._busy = False  # a caller is making the next call (or waiting to)
        self._began = -interval
        self._result: tuple[bool, Any] = (False, None)

    def get(self) -> T:
        with self._changed:
            needed = self.calls + 1  # the first call to begin after this one asked
            while self._done < needed and self._busy:
                self._changed.wait()
            if self._done >= needed:
                return self._outcome()
            self._busy = True
        time.sleep(max(0.0, self._began + self._interval - time.monotonic()))
        with self._changed:
            self.calls += 1
            number, self._began = self.calls, time.monotonic()
        try:
            result: tuple[bool, Any] = (True, self._fetch()())  # type: ignore[misc]
        except Exception as exc:  # every caller sharing this call is told
            result = (False, exc)
        with self._changed:
            self._done, self._result, self._busy = number, result, False
            self._changed.notify_all()
            return self._outcome()

    def _outcome(self) -> T:
        fetched, value = self._result
        if not fetched:
            raise value
        return value  # type: ignore[no-any-return]


class TopicRegistry:
    """Reads the registry once and again on a miss; thread-safe for the gateway.

    A miss costs one look at Kafka (Covering: shared, at most one per
    TOPIC_LIST_INTERVAL): its topic list and where the registry topic ends. The registry
    is read again (one read shared by the misses waiting for it) only for a name Kafka
    has, or when the registry grew since it was last read; a name that is neither is
    remembered as unknown (UNKNOWN_TOPIC_TTL)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._specs: dict[str, TopicSpec] = {}
        self._unknown: dict[str, float] = {}  # name -> until when it is refused at once
        self._read_end = -2  # where the registry ended when last read (-1: no registry)
        self._lock = threading.Lock()
        self._admin = admin_client(bootstrap)
        self.reads = Covering(self._read_all)
        self.looks = Covering(self._look, TOPIC_LIST_INTERVAL)

    def spec(self, name: str) -> TopicSpec:
        """The spec of an existing topic; UnknownTopic when Kafka lacks it.

        A topic created by other tools has no registry entry: it is JSON without a key.
        A queue's name whose publishes go elsewhere (seed 001) gives its target's spec.
        """
        with self._lock:
            found = self._specs.get(name)
        if found is None:
            found = self._missed(name)
        if found is not None and found.publish_target not in (None, name):
            return self.spec(found.publish_target)  # type: ignore[arg-type]
        partitions = partitions_of(self._admin, name)
        if found is None:
            return TopicSpec(name=name, partitions=len(partitions))
        return found

    def _missed(self, name: str) -> TopicSpec | None:
        """The registered spec of a name not known here yet; None for a topic Kafka has
        without an entry; UnknownTopic for neither (remembered UNKNOWN_TOPIC_TTL)."""
        with self._lock:
            until = self._unknown.get(name)
        if until is not None and until > time.monotonic():
            raise unknown_topic(name)
        try:
            topics, end = self.looks.get()
        except TransportError as exc:  # shared by the callers: each is told its topic
            raise TransportError(
                f"can't reach Kafka for metadata of {name!r}: {exc.__cause__ or exc}"
            ) from exc
        if name in topics or end != self._read_end:  # registered since it was read?
            specs, self._read_end = self.reads.get()
            with self._lock:
                self._specs.update(specs)
        with self._lock:
            found = self._specs.get(name)
            self._unknown.pop(name, None)
            if found is None and name not in topics:
                while len(self._unknown) >= UNKNOWN_NAMES:  # the oldest is first
                    del self._unknown[next(iter(self._unknown))]
                self._unknown[name] = time.monotonic() + UNKNOWN_TOPIC_TTL
        if found is None and name not in topics:
            raise unknown_topic(name)
        return found

    def unknown_names(self) -> int:
        """Names remembered as unknown now (at most UNKNOWN_NAMES)."""
        return len(self._unknown)

    def _look(self) -> tuple[frozenset[str], int]:
        """Kafka's topic names, and the offset the registry topic ends at (-1: none)."""
        latest = {TopicPartition(REGISTRY_TOPIC, 0): OffsetSpec.latest()}  # type: ignore[no-untyped-call]
        ends = self._admin.list_offsets(latest, request_timeout=METADATA_TIMEOUT)
        topics = frozenset(topic_names(self._admin, internal=True))
        try:
            end = next(iter(ends.values())).result().offset
        except KafkaException:
            end = -1  # no registry topic yet: nothing registered
        return topics, end

    def entries(self) -> dict[str, TopicSpec]:
        """Every entry of the registry, read afresh (what `topics create` compares with)."""
        specs, _ = self._read_all()
        with self._lock:
            self._specs.update(specs)
        return specs

    def register(self, spec: TopicSpec) -> None:
        self._write(spec.name, spec.to_json())
        with self._lock:
            self._specs[spec.name] = spec
            self._unknown.pop(spec.name, None)

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

    def _read_all(self) -> tuple[dict[str, TopicSpec], int]:
        """Every entry, and the offset the registry topic ended at (-1: no registry)."""
        consumer = reader(self.bootstrap)
        try:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(REGISTRY_TOPIC, 0), timeout=METADATA_TIMEOUT
                )
            except KafkaException:
                return {}, -1  # no registry topic yet: nothing registered
            specs: dict[str, TopicSpec] = {}
            if high <= low:
                return specs, high
            consumer.assign([TopicPartition(REGISTRY_TOPIC, 0, low)])
            deadline = time.monotonic() + METADATA_TIMEOUT
            while _position(consumer) < high:
                if time.monotonic() > deadline:
                    raise TransportError("timed out reading the topic registry")
                # returns once records arrive: consume's batch waits out its timeout
                for record in consume_available(consumer, 1000, 0.5):
                    if not record.error():
                        _apply(specs, record.key(), record.value())
            return specs, high
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
