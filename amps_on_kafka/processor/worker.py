"""The processor worker: consumes the SOW topics' log and keeps their state in RocksDB.

One thread runs the loop: consume a batch, apply it (processor/applying.py: staged
partition by partition with the SOW rules, committed to the changelog, written with
each partition's next offset in one WriteBatch, told to the listeners, the gateway),
then expire what is due. Partitions come and go with the Kafka consumer group
(processor/assignment.py): an assigned partition opens its store and resumes at the
offset stored in it (or rebuilds from the start of the log when there is none); a
revoked one is closed. Worker holds the state both mixins read, runs the loop and
reports its progress (lag, wait_caught_up).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import (
    Consumer,
    TopicPartition,
)

from amps_on_kafka.config import Config
from amps_on_kafka.errors import AmpsError, TransportError
from amps_on_kafka.log.kafka import (
    CONSUMER_TUNING,
    OutageWatch,
    client_config,
    consume_available,
    with_properties,
)
from amps_on_kafka.log.topics import spec_from_config
from amps_on_kafka.processor.applying import Applying
from amps_on_kafka.processor.assignment import Assignment
from amps_on_kafka.processor.changelog import (
    Changelog,
)
from amps_on_kafka.processor.collections import collections_paused
from amps_on_kafka.processor.dead_letters import (
    DeadLetters,
    ensure_dead_letter_topics,
)
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.memory import IdleTrim
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.processor.repartition import Repartitioner, consumed_topic
from amps_on_kafka.processor.standby import Standby
from amps_on_kafka.processor.startup import StateDirLock, check_serves_something, check_topics
from amps_on_kafka.state.events import BatchApplied
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore

log = logging.getLogger(__name__)

DEFAULT_GROUP = "amps-kafka-workers"
ENDS_EVERY = 0.5  # seconds between notes of the log ends, which lag() reports against


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Worker(Assignment, Applying):
    """A worker for the SOW topics of one configuration."""

    def __init__(
        self,
        config: Config,
        bootstrap: str,
        state_dir: str | Path,
        *,
        group_id: str | None = None,
        instance_id: str | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        """`instance_id` (else the config's Worker InstanceId): static group membership."""
        self.config = config
        # Every client below (consumers, producers, admin clients, the repartitioner's
        # and the queue engine's) connects with the config's Kafka Properties.
        bootstrap = with_properties(bootstrap, config.kafka.properties)
        self.bootstrap = bootstrap
        self.state_dir = Path(state_dir)
        self.group_id = group_id or DEFAULT_GROUP
        self.instance_id = instance_id or config.worker.instance_id
        self.clock = clock
        self.rules = {
            sow.topic: SowRules(sow, spec_from_config(config, config.topic(sow.topic)).codec)  # type: ignore[arg-type]
            for sow in config.sow
        }
        self.engine = SowEngine(config, self.rules, clock)
        # The topic read for each SOW topic: a Repartition SOW is kept from its internal
        # topic, which a Repartitioner fills (processor/repartition.py).
        self._logical = {consumed_topic(sow): sow.topic for sow in config.sow}
        self.repartitioners = [
            Repartitioner(config, sow, bootstrap, self.group_id, self.state_dir)
            for sow in config.sow
            if sow.repartition
        ]
        self.queues = (
            QueueEngine(config, bootstrap, self.state_dir, clock=clock) if config.queues else None
        )
        # Records refused since start, by category (state/sow.py `_kind`): misplaced_key,
        # bad_envelope, bad_filter, bad_record, apply_error; lost_to_retention: deleted
        # from the log before any worker applied them (_report_lost_to_retention).
        self.rejected: Counter[str] = Counter()
        self.dead_lettered: Counter[str] = Counter()  # those of them written to a dead letter
        self.expired = 0  # SOW records expired since start
        self.applied = 0  # log records applied since start: a resumed worker applies none twice
        self.dead_letter_failures = 0  # writes of dead letters Kafka did not acknowledge
        # stores found written to a changelog since deleted, so copied into the new one
        self.changelog_lost = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dead_letters = DeadLetters(bootstrap)
        self._lock = StateDirLock(self.state_dir)
        self.outage = OutageWatch(bootstrap)  # logs an outage of the consumer's brokers
        self.idle_trim = IdleTrim()  # memory a burst of large records left, handed back
        self._group_consumer: Consumer | None = None
        self._standby: Standby | None = None
        # SOW topics whose batches go to a changelog first (processor/changelog.py)
        self._changelogged = {sow.topic for sow in config.sow if sow.changelog}
        self._changelog = (
            Changelog(bootstrap, self.group_id, self.instance_id) if self._changelogged else None
        )
        # Partitions held on a record whose dead letter failed: when each tries again, and
        # the wait after that (doubling up to RETRY_MAX).
        self._held: dict[tuple[str, int], tuple[float, float]] = {}
        self._failure: BaseException | None = None
        self._next_flush = time.monotonic() + config.state.flush_every
        # each owned partition's log end, as last fetched (lag()); noted by _note_ends
        self._ends: dict[tuple[str, int], int] = {}
        # each owned partition's offset where the consumer goes on, when known (_note_ends)
        self._reached: dict[tuple[str, int], int] = {}
        self._next_ends = 0.0

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop in a background thread. A config Kafka can't serve (a missing
        dead-letter topic, a topic or queue pattern Kafka lacks, a state directory
        another worker holds, nothing to serve) raises here, in the caller's thread,
        before anything runs (processor/startup.py)."""
        check_serves_something(self.config)
        self._lock.acquire()
        try:
            check_topics(self.bootstrap, self.config)
            ensure_dead_letter_topics(self.bootstrap, self.config)  # SOW and queues alike
            if self._changelog is not None:
                self._changelog.ensure(self.config)
        except BaseException:
            self._lock.release()
            raise
        self._thread = threading.Thread(target=self._run_guarded, name="amps-worker", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the first assignment is open and its expirations are processed."""
        deadline = time.monotonic() + timeout
        while not self.engine.ready.wait(0.05):
            self.raise_if_failed()
            if time.monotonic() > deadline:
                raise TransportError(f"worker not ready after {timeout}s (no partitions assigned)")
        if self.queues is not None:
            self.queues.wait_ready(timeout)

    @property
    def changelog_failures(self) -> int:
        """Changelog transactions that aborted or failed since start."""
        return 0 if self._changelog is None else self._changelog.failures

    def next_offsets(self, topic: str) -> dict[int, int | None]:
        """The next offset each owned partition of a topic will apply."""
        with self.engine.lock:
            return {
                p: self._next_offset(self.engine.store(topic, p))  # type: ignore[arg-type]
                for p in self.engine.partitions(topic)
            }

    def _next_offset(self, store: PartitionStore) -> int | None:
        """The store's offset, or where the consumer goes on in the log when that is
        further: the records before it were deleted (retention, delete-records) before
        any worker applied them, or are a transaction's marker. Nothing before it is left
        to apply, so a partition restored below the log's start with nothing to consume is
        caught up (wait_caught_up) and has no lag (/ready)."""
        stored = store.next_offset()
        reached = self._reached.get((store.topic, store.partition), -1)
        return reached if reached > (stored or 0) else stored

    def lag(self) -> dict[tuple[str, int], int]:
        """Per owned partition, the records between its store and the log end as the
        consumer last heard it from the broker (noted by the loop, _note_ends), so any
        thread may ask, at any rate. A partition whose end isn't known yet is left out.
        Under the engine lock: a revoked store is closed only once detached from it."""
        ends = self._ends
        lags = {}
        with self.engine.lock:
            for store in self.engine.stores():
                end = ends.get((store.topic, store.partition))
                if end is not None:
                    lags[(store.topic, store.partition)] = max(
                        0, end - (self._next_offset(store) or 0)
                    )
        return lags

    def _note_ends(self) -> None:
        """Every ENDS_EVERY (and while a partition's end is not known), note each owned
        partition's log end as the consumer last fetched it (a cached watermark: no
        request), for lag(). Here, on the loop's own thread: the consumer must not be
        called from others while it consumes (a cached get_watermark_offsets from another
        thread waited 40 s behind consume())."""
        now, stores, known = time.monotonic(), self.engine.stores(), self._ends
        if now < self._next_ends and all((s.topic, s.partition) in known for s in stores):
            return
        self._next_ends = now + ENDS_EVERY
        consumer, ends, reached = self._group_consumer, {}, {}
        for store in stores:
            tp = TopicPartition(self._consumed(store.topic), store.partition)
            start, end = consumer.get_watermark_offsets(tp, cached=True)  # type: ignore[union-attr]
            key = (store.topic, store.partition)
            if end >= 0:
                ends[key] = end
            reached[key] = max(start, self._position(tp))
        self._ends, self._reached = ends, reached

    def _position(self, tp: TopicPartition) -> int:
        """The consumer's position in a partition (negative when unknown: nothing consumed
        since it was assigned). Not a held partition's: it was rewound to a batch that
        is not applied."""
        if (tp.topic, tp.partition) in self._held:
            return -1
        return self._group_consumer.position([tp])[0].offset  # type: ignore[union-attr]

    def wait_caught_up(
        self, topic: str, ends: dict[int, int], timeout: float = 60.0, owned_only: bool = False
    ) -> None:
        """Block until the stores hold every record before `ends` (per partition; with
        owned_only, of the partitions this worker owns). Each batch written wakes it."""
        progressed = threading.Event()

        def listener(_: BatchApplied) -> None:
            progressed.set()

        self.engine.add_listener(listener)
        deadline = time.monotonic() + timeout
        try:
            while True:
                progressed.clear()
                stored = self.next_offsets(topic)
                wanted = {p: o for p, o in ends.items() if p in stored or not owned_only}
                if all((stored.get(p) or 0) >= offset for p, offset in wanted.items()):
                    return
                self.raise_if_failed()
                if time.monotonic() > deadline:
                    raise TransportError(f"worker at {stored}, log end {ends} after {timeout}s")
                progressed.wait(0.5)
        finally:
            self.engine.remove_listener(listener)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise TransportError(f"worker failed: {self._failure}") from self._failure

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.outage.close()
        self._lock.release()

    def _run_guarded(self) -> None:
        try:
            self.run()
        except (AmpsError, OSError) as exc:  # a reason for the operator (a damaged store,
            self._failure = exc  # a state path that is a file): raise_if_failed reports it;
            log.error("worker loop failed: %s", exc)  # two tracebacks would bury it
        except BaseException as exc:
            self._failure = exc
            log.exception("worker loop failed")
            raise

    def run(self) -> None:
        """The loop, in the calling thread (start() checks the config with Kafka first)."""
        if self.queues is not None:
            self.queues.start()
        if not self.rules:  # a queues-only worker: no SOW topic to consume
            self.engine.ready.set()
            self._stop.wait()
            if self.queues is not None:
                self.queues.stop()
            return
        if self._changelog is not None and not self._changelog.ids:  # run without start()
            self._changelog.ensure(self.config)
        consumer = self._group_consumer = self._consumer()
        if self.config.worker.standby:  # warm copies of the others' partitions
            self._standby = Standby(self)
        try:
            for repartitioner in self.repartitioners:
                repartitioner.start()  # stopped with the loop, in the finally below
            consumer.subscribe(
                list(self._logical),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
            while not self._stop.is_set():
                with collections_paused():  # consumed records die inside it too
                    due = self._next_due()
                    records = consume_available(
                        consumer, self._turn_size(due), self._wait_time(due)
                    )
                    if records:
                        self._apply(records)
                        self.idle_trim.applied()
                    else:
                        self.idle_trim.idle()
                    del records
                    self._expire_due()
                self._flush_due()
                self._note_ends()
                self._release_held()
                self._check_restored(consumer)
                self._watch_changelogs()
                if self._standby is not None:
                    self._standby.step()
        finally:
            for repartitioner in self.repartitioners:
                repartitioner.stop()
            if self._standby is not None:
                self._standby.close()
            consumer.close()  # revokes, which closes every store
            self._dead_letters.close()
            if self._changelog is not None:
                self._changelog.close()
            if self.queues is not None:
                self.queues.stop()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        super()._on_assign(consumer, partitions)
        self.idle_trim.mark()

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                **client_config(self.bootstrap, error_cb=self.outage.error),
                "group.id": self.group_id,
                "client.id": f"amps-worker-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "fetch.wait.max.ms": 50,
                "isolation.level": "read_committed",  # a repartitioner's aborted writes
                **CONSUMER_TUNING,
                **self._membership(),
            }
        )

    def _membership(self) -> dict[str, object]:
        """How fast the group notices a dead worker (SessionTimeout; heartbeats at a
        third of it) and, with an instance id, static membership (docs/scaling.md)."""
        timeout_ms = int(self.config.worker.session_timeout * 1000)
        settings: dict[str, object] = {
            "session.timeout.ms": timeout_ms,
            "heartbeat.interval.ms": max(100, timeout_ms // 3),
        }
        if self.instance_id is not None:
            settings["group.instance.id"] = self.instance_id
        return settings
