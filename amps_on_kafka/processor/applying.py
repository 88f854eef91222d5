"""The worker's loop turn (processor/worker.py): each partition's records of the turn
are staged in memory with the SOW rules (processor/staging.py), the turn's batches with
a changelog committed to it in one transaction, then each written to its store in one
WriteBatch and told to the listeners (the gateway); a partition whose dead letters or
changelog failed is held on its batch and retried. Also the expiration sweeps and the
periodic flush of the stores.

A mixin of Worker: it reads the worker's state (its config, rules, engine, consumer).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from amps_on_kafka.errors import ConfigError
from amps_on_kafka.log.envelope import EnvelopeError
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.processor.changelog import (
    ChangelogFailed,
    Entry,
    encoded_pairs,
    state_changes,
)
from amps_on_kafka.processor.dead_letters import (
    DeadLetterFailed,
    Letter,
)
from amps_on_kafka.processor.staging import log_messages, replace_blind, stage, stage_expiry
from amps_on_kafka.state.events import BatchApplied, Change, ChangeKind, CommandResult
from amps_on_kafka.state.sow import SowRules, fill_previous
from amps_on_kafka.state.store import PartitionStore, Replacements

# the worker's log lines keep its logger name, which operators filter on
# (docs/operations.md, Logging)
log = logging.getLogger("amps_on_kafka.processor.worker")

# Seconds a turn waits for records when nothing is due sooner (a deadline, a held
# partition's retry): each idle turn wakes the loop's thread and takes the GIL for
# 0.1-0.3 ms, which a gateway answering in the same process waited on, at 20 turns a
# second (docs/performance.md, the look-up's ninth round). A stop waits for it at most.
MAX_IDLE_WAIT = 0.25
STANDBY_WAIT = 0.05  # ...while standby copies are kept: their consumer is read once a turn
BATCH_SIZE = 5000  # records a turn of the loop consumes at most
# ...and while a deadline is less than NEAR_DEADLINE_MS away: the records it lets due
# wait for the turn's apply (docs/performance.md, "Expiration lag")
EXPIRY_TURN, NEAR_DEADLINE_MS = 1000, 100
RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # seconds a partition waits to retry its dead letters


class Applying:
    """The applying part of Worker (its attributes are set by Worker.__init__)."""

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

    def _next_due(self) -> int | None:
        """The next deadline a sweep will act on (ms), or None. Only expiring topics
        count: with expiration disabled a message's own deadline is kept, never due, and
        a passed one must not turn the loop into a spin."""
        stores = [s for s in self.engine.stores() if self.rules[s.topic].expiring]
        return min((d for d in (s.next_deadline() for s in stores) if d is not None), default=None)

    def _wait_time(self, next_due: int | None) -> float:
        """How long the loop may wait for records: until the next deadline or a held
        partition's retry, at most MAX_IDLE_WAIT (STANDBY_WAIT with standby copies).
        Records, and the group's rebalances, end the wait as they arrive."""
        wait = MAX_IDLE_WAIT if self._standby is None else STANDBY_WAIT
        if next_due is not None:
            wait = min(wait, (next_due - self.clock()) / 1000)
        if self._held:
            retry = min(at for at, _ in self._held.values())
            wait = min(wait, retry - time.monotonic())
        return max(0.0, wait)

    def _turn_size(self, next_due: int | None) -> int:
        """Records one turn takes: EXPIRY_TURN while a deadline is near, so the sweep
        that follows the turn is not held behind a whole BATCH_SIZE of applying (the
        general path's ~20 us a record), else BATCH_SIZE."""
        if next_due is not None and next_due - self.clock() < NEAR_DEADLINE_MS:
            return EXPIRY_TURN
        return BATCH_SIZE

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
        """Sweep every store until nothing is due, a slice at a time (SWEEP_SLICE), each
        written and announced before the next is read."""
        for store in self.engine.stores():
            while self._expire_store(store, self.rules[store.topic]):
                pass

    def _expire_store(self, store: PartitionStore, rules: SowRules) -> bool:
        """Sweep one slice of the store's due deadlines (SWEEP_SLICE): whether it swept
        any (the next slice may be due at once)."""
        if not rules.expiring:
            return False
        staged = stage_expiry(store, rules, self.clock())
        if staged is None:
            return False
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
            return False
        self.expired += len(changes)
        self._commit(sweep)
        return True


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
