"""The worker's partitions coming and going (processor/worker.py): an assigned partition
opens its store (restored from its changelog first when it has none, or copied into a
changelog that lacks it), resumes at the offset stored in it and serves once it reached
the log's end as of its assignment; a revoked one is closed. Also the changelog topics'
upkeep while the worker runs (one deleted by hand is created again and filled).

A mixin of Worker: it reads the worker's state (its config, rules, engine, consumer).
"""

from __future__ import annotations

import logging

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    TopicPartition,
)

from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    partitions_of,
)
from amps_on_kafka.log.keys import Placement
from amps_on_kafka.processor.changelog import (
    ChangelogFailed,
    changelog_topic,
    restore,
)
from amps_on_kafka.processor.repartition import consumed_topic
from amps_on_kafka.state.sow import ExpirySchedule, SowRules
from amps_on_kafka.state.store import PartitionStore, store_path

# the worker's log lines keep its logger name, which operators filter on
# (docs/operations.md, Logging)
log = logging.getLogger("amps_on_kafka.processor.worker")


class Assignment:
    """The partitions part of Worker (its attributes are set by Worker.__init__)."""

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
        while self._expire_store(store, rules):  # seed 000: those due at startup go first
            pass
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
            store.mark_changelogged(None)  # told once: a copy that fails is retried quietly
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
            # where the consumer was counts for this assignment only (Worker._next_offset)
            self._reached.pop((self._logical[tp.topic], tp.partition), None)
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


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{tp.topic}|{tp.partition}" for tp in partitions]
