"""The processor worker: consumes the SOW topics' log and keeps their state in RocksDB.

One thread runs the loop: consume a batch, apply it partition by partition with the
SOW rules, write each partition's changes and its next offset in one WriteBatch, tell
the listeners (the gateway), then expire what is due. Partitions come and go with the
Kafka consumer group: an assigned partition opens its store and resumes at the offset
stored in it (or rebuilds from the start of the log when there is none); a revoked one
is closed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from amps_on_kafka.config import Config
from amps_on_kafka.errors import AmpsError, ConfigError, TransportError
from amps_on_kafka.log.envelope import EnvelopeError
from amps_on_kafka.log.kafka import (
    CONSUMER_TUNING,
    METADATA_TIMEOUT,
    OutageWatch,
    client_config,
    consume_available,
    partitions_of,
    with_properties,
)
from amps_on_kafka.log.keys import Placement
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.topics import spec_from_config
from amps_on_kafka.processor.changelog import (
    Changelog,
    ChangelogFailed,
    Entry,
    changelog_topic,
    encoded_pairs,
    restore,
    state_changes,
)
from amps_on_kafka.processor.collections import collections_paused
from amps_on_kafka.processor.dead_letters import (
    DeadLetterFailed,
    DeadLetters,
    Letter,
    ensure_dead_letter_topics,
)
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.processor.repartition import Repartitioner, consumed_topic
from amps_on_kafka.processor.staging import log_messages, replace_blind, stage, stage_expiry
from amps_on_kafka.processor.standby import Standby
from amps_on_kafka.processor.startup import StateDirLock, check_serves_something, check_topics
from amps_on_kafka.state.events import BatchApplied, Change, ChangeKind, CommandResult
from amps_on_kafka.state.sow import ExpirySchedule, SowRules, fill_previous
from amps_on_kafka.state.store import PartitionStore, Replacements, store_path

log = logging.getLogger(__name__)

DEFAULT_GROUP = "amps-kafka-workers"
BATCH_SIZE = 5000
MAX_IDLE_WAIT = 0.05  # seconds: bounds expiration lag when no records arrive
ENDS_EVERY = 0.5  # seconds between notes of the log ends, which lag() reports against
RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # seconds a partition waits to retry its dead letters


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Worker:
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
                    records = consume_available(consumer, BATCH_SIZE, self._wait_time())
                    if records:
                        self._apply(records)
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

    # -- partitions ---------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for topic in {tp.topic for tp in partitions}:
            self._place(consumer, topic)
        if self._standby is not None:  # their warm copies become the active stores
            for tp in partitions:
                self._standby.release(self._logical[tp.topic], tp.partition)
        self._restore_new(consumer, partitions)
        resumed = []
        for tp in partitions:
            store = self._open(self._logical[tp.topic], tp.partition, self._end_of(consumer, tp))
            stored = store.next_offset()
            tp.offset = stored if stored is not None else OFFSET_BEGINNING
            where = f"at {stored}" if stored is not None else "from the start of the log"
            resumed.append(f"{tp.topic}|{tp.partition} {where}")
        if resumed:  # a cooperative rebalance may assign nothing new: no line then
            log.info(
                "rebalance: assigned %d partition(s): %s",
                len(resumed),
                ", ".join(resumed),
                extra={"event": "assigned", "partitions": _names(partitions)},
            )
        consumer.incremental_assign(partitions)
        self.engine.ready.set()

    def _end_of(self, consumer: Consumer, tp: TopicPartition) -> int:
        """The log end a newly assigned partition must reach before it serves queries
        spread over the workers (SowEngine.serving); 0 (at once) if Kafka can't say."""
        try:
            _, end = consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT, cached=False)
        except KafkaException as exc:
            log.warning(
                "%s|%s: log end unknown (%s); serving it at once", tp.topic, tp.partition, exc
            )
            return 0
        return max(end, 0)

    def _check_restored(self, consumer: Consumer) -> None:
        """Partitions restoring from the log serve once the consumer reached their end
        (its position: a transaction marker after the last record counts)."""
        for topic, partition in self.engine.restoring():
            store = self.engine.store(topic, partition)
            if store is None:
                continue
            tp = TopicPartition(self._consumed(topic), partition)
            position = consumer.position([tp])[0].offset
            self.engine.restored(topic, partition, max(position, store.next_offset() or 0))

    def _place(self, consumer: Consumer, topic: str) -> None:
        """Where the topic's keys belong, by its partition count as Kafka has it now (a
        topic given more partitions is rebalanced, which brings the worker back here)."""
        count = len(partitions_of(consumer, topic))
        declared = self.config.topic(topic)  # its Partitioner: how its producers place keys
        partitioner = declared.partitioner if declared else "murmur2"  # a repartitioner's
        self.rules[self._logical[topic]].placement = Placement(count, partitioner)
        if declared is not None and count != declared.partitions:
            log.error(
                "topic %s has %d partitions in Kafka, its config %d: its SOW keys now belong "
                "in other partitions than their earlier records, which are refused when "
                "applied again (docs/operations.md, The rule: one SOW key, one partition)",
                topic,
                count,
                declared.partitions,
            )

    def _consumed(self, topic: str) -> str:
        """The Kafka topic a SOW topic's stores are kept from (its own, or its internal
        repartition topic): where their offsets point."""
        return consumed_topic(self.config.sow_for(topic))  # type: ignore[arg-type]

    def _usable_store(self, consumer: Consumer, tp: TopicPartition) -> PartitionStore:
        """A partition's store, emptied when the log no longer holds the records after
        its offset (retention deleted them while the worker was away): it is then
        restored from the changelog, which is ahead of it, instead of skipping them."""
        topic = self._logical[tp.topic]
        store = self.store_of(topic, tp.partition)
        stored = store.next_offset()
        if stored is None:
            return store
        try:
            start, _ = consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT, cached=False)
        except KafkaException:
            return store  # can't tell: resume from the store, as without a changelog
        if stored >= start:
            return store
        log.warning(
            "%s|%s: its store is at offset %d but the log now starts at %d: restoring it "
            "from its changelog instead",
            topic,
            tp.partition,
            stored,
            start,
        )
        store.close()
        PartitionStore.destroy(store.path)
        return self.store_of(topic, tp.partition)

    def _report_lost_to_retention(self, consumer: Consumer, store: PartitionStore) -> None:
        """Records that retention deleted from the log before any worker applied them are
        in neither the changelog nor the log: the SOW can't have them. Say so once, with
        the offsets, and count them (rejected[lost_to_retention]), never silently."""
        tp = TopicPartition(self._consumed(store.topic), store.partition)
        try:
            start, _ = consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT, cached=False)
        except KafkaException:
            return
        reached = store.next_offset() or 0
        if reached >= start:
            return
        self.rejected["lost_to_retention"] += start - reached
        log.error(
            "%s|%s: offsets %d to %d were deleted from the log before any worker applied "
            "them, and its changelog reaches only offset %d: those records are not in the "
            "SOW (keep the log longer than a partition may go unserved)",
            store.topic,
            store.partition,
            reached,
            start - 1,
            reached,
        )

    def store_of(self, topic: str, partition: int) -> PartitionStore:
        """Open the store of a partition of a SOW topic (the worker's or a standby copy).
        Without a changelog, one it had is marked out of step: were the changelog turned
        on again, it would be copied into it (Changelog.seed)."""
        store = PartitionStore(
            store_path(self.state_dir, self._consumed(topic), partition),
            topic,
            partition,
            self.rules[topic].codec,
            self.config.state.write_buffer_bytes,
        )
        if topic not in self._changelogged and store.changelogged() is not None:
            store.mark_changelogged(None)
        return store

    def _open(self, topic: str, partition: int, restore_to: int = 0) -> PartitionStore:
        rules = self.rules[topic]
        store = self.store_of(topic, partition)
        rules.schedules[partition] = self._expiry_schedule(store, rules)
        self._expire_store(store, rules)  # seed 000: expirations due at startup go first
        self.engine.attach(store, restore_to)
        return store

    def restore(self, stores: list[PartitionStore]) -> None:
        """Those of the stores with no position, of topics with a changelog, are loaded
        from it (the worker's and the standby copies' alike), in one read: the log is
        then read from where the changelog was."""
        empty = [s for s in stores if s.topic in self._changelogged and s.next_offset() is None]
        if empty:
            restore(self.bootstrap, self.group_id, empty)
        for store in empty:  # restored from it, or starting with it (it had nothing)
            store.mark_changelogged(self._changelog.ids[store.topic])  # type: ignore[union-attr]

    def _restore_new(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Restore the newly assigned partitions that have a changelog, all at once
        before they are opened (a read of Kafka takes about 0.5 s to start)."""
        stores = [
            self._usable_store(consumer, tp)
            for tp in partitions
            if self._logical[tp.topic] in self._changelogged
        ]
        try:
            self.restore(stores)
            for store in stores:
                self._report_lost_to_retention(consumer, store)
                self._bring_into_step(store)
        finally:
            for store in stores:
                store.close()

    def _log_changes(self, turn: list[Staged]) -> None:
        """Those batches of a turn whose topic has a changelog are committed to it, in one
        transaction, before any store is written: ChangelogFailed otherwise (counted),
        and the stores are left as they were."""
        logged = [staged for staged in turn if staged.store.topic in self._changelogged]
        if self._changelog is None or not logged:
            return
        for staged in logged:
            self._bring_into_step(staged.store)
        batches = [(s.store, s.changes, s.end, self._consumed(s.store.topic)) for s in logged]
        self._changelog.send_all(batches, self._group_consumer)  # type: ignore[arg-type]

    def _bring_into_step(self, store: PartitionStore) -> None:
        """Copy a store into its changelog (Changelog.seed) unless that changelog has had
        every change of it: its state predates the changelog, or was written to a
        changelog topic deleted by hand since (another topic id: an error, counted)."""
        changelog = self._changelog
        mark, current = store.changelogged(), changelog.ids[store.topic]  # type: ignore[union-attr]
        if mark == current:
            return
        if mark is not None:
            self.changelog_lost += 1
            log.error(
                "%s|%s was written to another changelog topic than %s now is (it was deleted "
                "by hand): copying the store into it, so that it holds the whole state again",
                store.topic,
                store.partition,
                changelog_topic(self.group_id, store.topic),
                extra={
                    "event": "changelog_lost",
                    "topic": store.topic,
                    "partition": store.partition,
                },
            )
        consumed = self._consumed(store.topic)
        changelog.seed(store, self._group_consumer, consumed)  # type: ignore[union-attr, arg-type]

    def _watch_changelogs(self) -> None:
        """A changelog topic deleted while the worker runs is created again, and every
        store of its SOW topic here copied into it (_bring_into_step; one that fails now
        is copied before its next batch): a restore from it then has the whole state."""
        if self._changelog is None:
            return
        for topic in self._changelog.replaced():
            log.error(
                "the changelog topic %s was deleted while this worker ran: creating it again",
                changelog_topic(self.group_id, topic),
                extra={"event": "changelog_lost", "topic": topic},
            )
            try:
                self._changelog.ensure(self.config)
            except TransportError as exc:  # still being deleted: the next look tries again
                log.warning("the changelog of %s is not created again yet: %s", topic, exc)
                continue
            for store in self.engine.stores():
                if store.topic == topic:
                    try:
                        self._bring_into_step(store)
                    except ChangelogFailed as exc:
                        log.warning("%s|%s copied later: %s", topic, store.partition, exc)

    def _expiry_schedule(self, store: PartitionStore, rules: SowRules) -> ExpirySchedule:
        """Seed 000: a stored deadline is never recalculated. A crash makes the worker
        apply again what it applied since the last flush, so how a record is applied
        (its default deadline; whether the record it updates had expired) must not
        depend on the config of the run that applies it: an expiration config that
        differs from the one the store last recorded is in force only from the log's end
        as of now, and the records before (even those written while no worker ran) keep
        the old one. The store records it on disk before anything is applied."""
        entries = store.expiry_history()
        config = (rules.default_ms, rules.expiring)
        if not entries or entries[-1][1:] != config:
            start = 0 if not entries else self._log_end(store, entries[-1][0])
            entries = store.record_expiry(*config, start)
        return ExpirySchedule(tuple(entries))

    def _log_end(self, store: PartitionStore, at_least: int) -> int:
        """Where the partition's log ends now (never before the store's offset or the
        last recorded boundary, so the boundaries only rise)."""
        tp = TopicPartition(self._consumed(store.topic), store.partition)
        try:
            _, end = self._group_consumer.get_watermark_offsets(  # type: ignore[union-attr]
                tp, timeout=METADATA_TIMEOUT, cached=False
            )
        except KafkaException as exc:
            raise TransportError(
                f"can't read the log end of {store.topic}|{store.partition} to record its "
                f"new default expiration: {exc}"
            ) from exc
        return max(end, store.next_offset() or 0, at_least)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        closed = []
        for tp in partitions:
            self._held.pop((tp.topic, tp.partition), None)
            store = self.engine.detach(self._logical[tp.topic], tp.partition)
            if store is not None:
                closed.append(store)
        offsets = self._applied_offsets(closed)
        for store in closed:
            store.close()  # which puts what it holds on disk
        if closed:
            names = [f"{store.topic}|{store.partition}" for store in closed]
            log.info(
                "rebalance: revoked %d partition(s): %s",
                len(names),
                ", ".join(names),
                extra={"event": "revoked", "partitions": names},
            )
        self._commit_offsets(offsets, asynchronous=False)

    # -- applying the log -------------------------------------------------------------
    def _apply(self, records: list[Message]) -> None:
        """Stage every partition's batch of the turn, commit those with a changelog in one
        transaction, then write them: a failed transaction holds its partitions (they try
        the same batches again), and the others are written."""
        turn = self._stage_turn(records)
        try:
            self._log_changes([staged for _, staged in turn])
        except ChangelogFailed as exc:
            for batch, staged in turn:
                if staged.store.topic in self._changelogged:
                    self._hold(batch[0].topic(), batch[0].partition(), batch[0].offset(), exc)  # type: ignore[arg-type]
            turn = [(b, s) for b, s in turn if s.store.topic not in self._changelogged]
        for batch, staged in turn:
            self._commit(staged)
            self._held.pop((batch[0].topic(), batch[0].partition()), None)  # type: ignore[arg-type]
            self.applied += len(batch)

    def _stage_turn(self, records: list[Message]) -> list[tuple[list[Message], Staged]]:
        """Each owned partition's records, staged; one whose dead letters failed is held."""
        by_partition: dict[tuple[str, int], list[Message]] = defaultdict(list)
        for record in records:
            if record.error():
                self._consumer_error(record.error())
                continue
            by_partition[(record.topic(), record.partition())].append(record)
        turn = []
        for (topic, partition), batch in by_partition.items():
            store = self.engine.store(self._logical[topic], partition)
            if store is None:
                continue
            try:
                turn.append((batch, self._stage_batch(store, self.rules[store.topic], batch)))
            except DeadLetterFailed as exc:
                self._hold(topic, partition, batch[0].offset(), exc)
        return turn

    def _stage_batch(self, store: PartitionStore, rules: SowRules, batch: list[Message]) -> Staged:
        unreadable: dict[int, EnvelopeError] = {}
        replacements = self._replace_blind(store, rules, batch, unreadable)
        if replacements is not None:
            return _replaced(store, replacements, batch[-1].offset() + 1)
        messages = log_messages(store, rules, batch, unreadable)
        previous = rules.expiring or self.engine.wants_previous(store.topic)
        state, applied = stage(store, rules, messages, previous)
        self._report_rejections(applied.results, messages)  # dead letters durable first
        changes = BatchApplied(applied.changes, applied.results)
        write = partial(store.write, state)
        return Staged(store, state_changes(state), state.next_offset, write, changes, not previous)

    def _replace_blind(
        self,
        store: PartitionStore,
        rules: SowRules,
        records: list[Message],
        unreadable: dict[int, EnvelopeError],
    ) -> Replacements | None:
        """The fast path: a batch of plain publishes where a publish replaces its record
        unread (SowRules.blind_publishes, and no oof subscriber wants old records) is
        staged as records to store, with no envelope, SowRecord or Change object per
        record (staging.replace_blind). Returns None unless every record is a plain
        publish with a valid payload whose key belongs in this partition: then the
        general path applies the batch, and rejects what it must.
        """
        if not rules.blind_publishes or self.engine.wants_previous(rules.topic):
            return None
        if rules.schedules[store.partition].expires_from(records[0].offset()):
            return None  # records from before expiration was turned off keep it
        return replace_blind(store, rules, records, unreadable)

    def _commit(self, staged: Staged) -> None:
        """Write a batch and tell the listeners, under the engine lock. A batch computed
        `blind` (without old records) that meets an oof subscription which came meanwhile
        is given them from the store first, before the write replaces them."""
        store = staged.store
        with self.engine.lock:
            if staged.blind and self.engine.wants_previous(store.topic):
                _fill_previous_from(store, staged.applied.changes)
            staged.write()
            self.engine.notify(staged.applied)

    def _report_rejections(self, results: list[CommandResult], messages: list[LogMessage]) -> None:
        """Log each refused record with its bookmark and write its dead letter; the batch
        is written only once Kafka holds every letter (DeadLetterFailed otherwise), so
        the offset never moves past a record whose letter was lost."""
        rejected = [r for r in results if r.error is not None]
        if not rejected:
            return
        target = self.config.sow_for(messages[0].topic).dead_letter_topic  # type: ignore[union-attr]
        by_offset = {m.offset: m for m in messages}
        letters = []
        for result in rejected:
            bookmark = f"{result.topic}|{result.partition}|{result.offset}|"
            log.warning(
                "skipped record %s: %s%s",
                bookmark,
                result.error,
                f" (dead letter to {target})" if target is not None else "",
                extra={
                    "event": "skipped",
                    "topic": result.topic,
                    "partition": result.partition,
                    "offset": result.offset,
                    "reason": result.rejection or "bad_record",
                    "dead_letter_topic": target,
                },
            )
            if target is not None:
                letters.append(_letter(target, by_offset[result.offset], result, bookmark))
        if letters:
            self._dead_letters.send(letters)
        reasons = [r.rejection or "bad_record" for r in rejected]
        self.rejected.update(reasons)
        if target is not None:
            self.dead_lettered.update(reasons)

    def _hold(
        self, topic: str, partition: int, offset: int, error: DeadLetterFailed | ChangelogFailed
    ) -> None:
        """Keep a partition on the batch whose dead letters (or changelog) failed: rewind
        it there and pause it until its retry is due, while the other partitions go on."""
        if isinstance(error, DeadLetterFailed):
            self.dead_letter_failures += 1
        _, wait = self._held.get((topic, partition), (0.0, RETRY_FIRST / 2))
        wait = min(wait * 2, RETRY_MAX)
        self._held[(topic, partition)] = (time.monotonic() + wait, wait)
        log.error(
            "%s|%s stays at offset %s, retrying in %.0fs: %s",
            topic,
            partition,
            offset,
            wait,
            error,
            extra={
                "event": "changelog_failed"
                if isinstance(error, ChangelogFailed)
                else "dead_letter_failed",
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "retry_seconds": wait,
            },
        )
        tp = TopicPartition(topic, partition, offset)
        consumer = self._group_consumer
        consumer.pause([tp])  # type: ignore[union-attr]
        consumer.seek(tp)  # type: ignore[union-attr]

    def _release_held(self) -> None:
        """Resume the held partitions whose retry is due. Each keeps its wait until a
        batch of its own gets through, so a failure again waits twice as long."""
        now = time.monotonic()
        due = [tp for tp, (at, _) in self._held.items() if at <= now]
        for tp in due:
            self._held[tp] = (math.inf, self._held[tp][1])  # resumed: not due again
        if due:
            self._group_consumer.resume([TopicPartition(t, p) for t, p in due])  # type: ignore[union-attr]

    def _consumer_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:  # would be retried forever
            raise ConfigError(
                f"Worker SessionTimeout {self.config.worker.session_timeout:g}s is outside "
                "what the brokers allow (group.min.session.timeout.ms, 6 s by default, to "
                f"group.max.session.timeout.ms): {error.str()}"
            )
        log.warning("consumer error: %s", error.str())

    # -- expiration -------------------------------------------------------------------
    def _wait_time(self) -> float:
        """Until the next deadline a sweep will act on. Only expiring topics count: with
        expiration disabled a message's own deadline is kept, never due, and a passed one
        must not turn the loop into a spin."""
        stores = [s for s in self.engine.stores() if self.rules[s.topic].expiring]
        next_due = min(
            (d for d in (s.next_deadline() for s in stores) if d is not None), default=None
        )
        if next_due is None:
            return MAX_IDLE_WAIT
        return max(0.0, min(MAX_IDLE_WAIT, (next_due - self.clock()) / 1000))

    def _flush_due(self) -> None:
        """Every State.FlushEvery, put the stores on disk (see state/store.py): a crash
        then re-applies at most that much of the log, which retention still holds."""
        now = time.monotonic()
        if now < self._next_flush:
            return
        self._next_flush = now + self.config.state.flush_every
        stores = self.engine.stores()
        for store in stores:
            store.flush()
        self._commit_offsets(self._applied_offsets(stores), asynchronous=True)

    def _applied_offsets(self, stores: list[PartitionStore]) -> list[TopicPartition]:
        return [
            TopicPartition(self._consumed(store.topic), store.partition, offset)
            for store in stores
            if (offset := store.next_offset()) is not None
        ]

    def _commit_offsets(self, offsets: list[TopicPartition], *, asynchronous: bool) -> None:
        """Tell the consumer group what the stores hold on disk, for Kafka's lag tools
        (kafka-consumer-groups, exporters): called after a flush or a store's close. The
        stores stay the source of truth: a restart resumes from their own offsets."""
        if not offsets or self._group_consumer is None:
            return
        try:
            self._group_consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as exc:  # lost partitions, a broker away: the next one will do
            log.warning("committing applied offsets to the consumer group failed: %s", exc)

    def _expire_due(self) -> None:
        for store in self.engine.stores():
            self._expire_store(store, self.rules[store.topic])

    def _expire_store(self, store: PartitionStore, rules: SowRules) -> None:
        if not rules.expiring:
            return
        staged = stage_expiry(store, rules, self.clock())
        if staged is None:
            return
        state, changes = staged
        sweep = Staged(
            store,
            state_changes(state),
            None,
            partial(store.write, state),
            BatchApplied(changes, []),
            False,
        )
        try:
            self._log_changes([sweep])
        except ChangelogFailed as exc:  # the sweep is due again at the next turn
            log.warning("%s|%s: expirations wait: %s", store.topic, store.partition, exc)
            return
        self.expired += len(changes)
        self._commit(sweep)


@dataclass(slots=True)
class Staged:
    """A partition's batch (or sweep) computed in memory and not written yet: what goes
    to the changelog (its entries and the offset they bring the store to; None for a
    sweep), then the store's write and what the listeners are told. `blind`: computed
    without the old records (see Worker._commit)."""

    store: PartitionStore
    changes: Iterable[Entry]
    end: int | None
    write: Callable[[], None]
    applied: BatchApplied
    blind: bool


def _replaced(store: PartitionStore, replacements: Replacements, end: int) -> Staged:
    """A batch of blind replacements (Worker._replace_blind), staged up to `end`."""
    write = partial(store.write_replacements, replacements, end)
    changes = BatchApplied(replacements.pairs, [], partial(_replaced_change, store))
    return Staged(store, encoded_pairs(replacements.pairs), end, write, changes, True)


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{tp.topic}|{tp.partition}" for tp in partitions]


def _letter(target: str, message: LogMessage, result: CommandResult, bookmark: str) -> Letter:
    try:
        headers = message.headers
    except Exception:  # headers the client library cannot read: the letter goes without
        headers = None
    return Letter.of(target, message.raw, headers, result.error or "", bookmark)


def _replaced_change(store: PartitionStore, sow_key: str, stored: bytes) -> Change:
    return Change(store.topic, sow_key, ChangeKind.UPSERT, None, store.record_of(sow_key, stored))


def _fill_previous_from(store: PartitionStore, changes: list[Change]) -> None:
    """The old records an oof subscriber needs, from what the store holds before the
    batch is written."""
    before = {r.sow_key: r for r in store.get_many({change.sow_key for change in changes})}
    fill_previous(changes, before.get)
