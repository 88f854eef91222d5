"""Which worker's gateway holds which partitions: announced in a compacted Kafka topic.

Every worker of a group writes one record to WORKERS_TOPIC (one partition, compacted),
keyed by group and worker id: its gateway's address and, per SOW topic, the partitions
it holds now. It writes again whenever its assignment changes and a tombstone when it
stops cleanly. Every gateway of the group reads the topic from its beginning and keeps
the latest record of each worker: a Directory.

Two records may claim one partition (a worker that died without a word, and the one
that took its partitions over): the claim written later wins, because the topic has one
partition and its offsets order every claim. A claim may still be stale (the worker
holding it died and nobody took over yet, or its successor's record is still on the
way): the peer asked checks that it holds what it is asked for, and a dead one doesn't
answer, so a stale claim makes a query fail with a retryable error, never answer part
of the topic (docs/scaling.md).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    client_config,
    partitions_of,
    reader,
)
from amps_on_kafka.log.topics import create_topics
from amps_on_kafka.processor.engine import SowEngine

log = logging.getLogger(__name__)

WORKERS_TOPIC = "_amps_workers"
POLL_WAIT = 0.1  # seconds the reader waits for a record; bounds how late a change is seen
PARTITION_CACHE = 10.0  # seconds a topic's partition count is trusted


@dataclass(frozen=True)
class Member:
    """One worker's latest announcement."""

    worker: str
    address: str
    parts: dict[str, frozenset[int]]
    offset: int  # where it stands in WORKERS_TOPIC: a later claim of a partition wins
    queues: frozenset[str] = frozenset()  # the queues it owns (processor/queue_owner.py)


class Directory:
    """The latest announcement of each worker of one group (any thread)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def apply(self, key: bytes | None, value: bytes | None, offset: int) -> bool:
        """One record of WORKERS_TOPIC; whether it concerned this group."""
        group, _, worker = (key or b"").decode(errors="replace").partition("\x00")
        if group != self.group or not worker:
            return False
        member = _member(worker, value, offset)
        with self._lock:
            if member is None:
                self._members.pop(worker, None)
            else:
                self._members[worker] = member
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
        return True

    def on_change(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def owners(self, topic: str) -> dict[int, Member]:
        """For each partition of `topic` some worker claims, the latest claimant."""
        with self._lock:
            members = sorted(self._members.values(), key=lambda m: m.offset)
        owners: dict[int, Member] = {}
        for member in members:
            for partition in member.parts.get(topic, ()):
                owners[partition] = member
        return owners

    def queue_owner(self, queue: str) -> Member | None:
        """The latest worker to claim `queue`, if any."""
        with self._lock:
            claims = [m for m in self._members.values() if queue in m.queues]
        return max(claims, key=lambda m: m.offset, default=None)


def _member(worker: str, value: bytes | None, offset: int) -> Member | None:
    if value is None:
        return None
    try:
        entry = orjson.loads(value)
        parts = {t: frozenset(int(p) for p in ps) for t, ps in entry["parts"].items()}
        queues = frozenset(str(q) for q in entry.get("queues", ()))
        return Member(worker, str(entry["address"]), parts, offset, queues)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        log.warning("ignoring an unreadable announcement of worker %s", worker)
        return None


class Membership:
    """Announces this worker and follows the others, on a thread of its own.

    The engine's assignment changes (on the worker's thread) only set a flag; this
    thread writes the announcement, so the worker never waits for Kafka here.
    """

    def __init__(
        self, engine: SowEngine, bootstrap: str, group: str, worker: str | None = None
    ) -> None:
        self.engine = engine
        self.bootstrap = bootstrap
        self.worker = worker or uuid.uuid4().hex[:12]
        self.directory = Directory(group)
        self.address: str | None = None
        self.ready = threading.Event()  # set once the topic was read up to its end
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = None
        self._counts: dict[str, tuple[float, int]] = {}
        self.queues: Callable[[], list[str]] = list  # the queues owned here, announced too

    def changed(self, *_: object) -> None:
        """Any thread: announce again (what this worker serves has changed)."""
        self._changed.set()

    @property
    def key(self) -> bytes:
        return f"{self.directory.group}\x00{self.worker}".encode()

    def start(self, address: str) -> None:
        """Announce `address` (the gateway's) and follow the group; returns once the
        directory holds every announcement written so far."""
        from confluent_kafka import Producer

        self.address = address
        ensure_workers_topic(self.bootstrap)
        self._producer = Producer(client_config(self.bootstrap, **{"linger.ms": 0}))
        self.engine.on_assignment(self._changed.set)
        self._changed.set()
        self._thread = threading.Thread(target=self._run, name="amps-membership", daemon=True)
        self._thread.start()
        if not self.ready.wait(METADATA_TIMEOUT * 3):
            raise TransportError(f"can't read {WORKERS_TOPIC} to find the other workers")

    def stop(self) -> None:
        """A tombstone: the others stop sending this worker queries at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._producer is not None:
            self._producer.produce(WORKERS_TOPIC, key=self.key, value=None)
            self._producer.flush(5.0)

    def partition_count(self, topic: str) -> int:
        """How many partitions Kafka has for `topic` (cached PARTITION_CACHE seconds)."""
        now = time.monotonic()
        cached = self._counts.get(topic)
        if cached is None or cached[0] < now:
            cached = (now + PARTITION_CACHE, len(partitions_of(self._producer, topic)))
            self._counts[topic] = cached
        return cached[1]

    # -- the membership thread --------------------------------------------------------
    def _run(self) -> None:
        consumer = reader(self.bootstrap, **{"fetch.wait.max.ms": 50})
        try:
            end = self._end(consumer, TopicPartition(WORKERS_TOPIC, 0))
            consumer.assign([TopicPartition(WORKERS_TOPIC, 0, OFFSET_BEGINNING)])
            position = 0
            while not self._stop.is_set():
                if self._changed.is_set():
                    self._changed.clear()
                    self._announce()
                for record in consumer.consume(500, timeout=POLL_WAIT):  # rides out outages
                    if record.error():
                        continue
                    self.directory.apply(record.key(), record.value(), record.offset())
                    position = record.offset() + 1
                if position >= end:
                    self.ready.set()
        except KafkaException as exc:
            log.error("membership stopped following %s: %s", WORKERS_TOPIC, exc)
        finally:
            consumer.close()

    def _end(self, consumer: Consumer, tp: TopicPartition) -> int:
        """The directory's log end. Just after ensure_workers_topic made the topic, this
        client's metadata may not know it yet (Unknown partition): ask again until the
        start's own deadline, rather than give up on the first answer."""
        deadline = time.monotonic() + METADATA_TIMEOUT * 3
        while True:
            try:
                return consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT)[1]
            except KafkaException as exc:
                if self._stop.is_set() or time.monotonic() > deadline:
                    raise
                log.debug("%s not known yet (%s): asking again", WORKERS_TOPIC, exc)
                self._stop.wait(0.2)

    def _announce(self) -> None:
        """Write what this worker serves now; if Kafka doesn't take it within
        METADATA_TIMEOUT (an outage), the next turn writes it again."""
        parts = {sow.topic: self.engine.serving(sow.topic) for sow in self.engine.config.sow}
        queues = self.queues()
        value = orjson.dumps(
            {"address": self.address, "parts": parts, "queues": queues, "at": time.time()}
        )
        producer = self._producer
        try:
            producer.produce(WORKERS_TOPIC, key=self.key, value=value)  # type: ignore[union-attr]
        except (BufferError, KafkaException) as exc:
            log.warning("can't announce %s yet: %s", self.worker, exc)
            self._changed.set()
            return
        if producer.flush(METADATA_TIMEOUT):  # type: ignore[union-attr]
            log.warning("announcement of %s not yet acknowledged; writing it again", self.worker)
            self._changed.set()
            return
        log.info("announced %s at %s: %s, queues %s", self.worker, self.address, parts, queues)


def ensure_workers_topic(bootstrap: str) -> None:
    """WORKERS_TOPIC: one partition (its offsets order the claims), compacted, with the
    broker's default replication factor."""
    topic = NewTopic(WORKERS_TOPIC, 1, -1, config={"cleanup.policy": "compact"})
    create_topics(admin_client(bootstrap), [topic])
