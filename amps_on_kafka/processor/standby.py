"""Standby replicas: warm copies of the partitions another worker owns (Worker: Standby).

A partition that moves to a worker with no copy of its state is restored from the log,
which takes as long as applying every record still in it (about 7 s for 200,000 records
on the development machine): the partition serves no query meanwhile. With Standby on,
each worker also applies the partitions it does not own into stores of its own, with
a second consumer, assigned (never in the group): when the group gives it one of them,
the standby store is closed and opened as the active one, resuming at its offset, so
only the records since are applied before it serves (Kafka Streams' standby replicas).

A standby copy applies records as the owner does (the same SowRules, expirations swept
at the same deadlines) but tells nobody: no subscription delivery, no sow_delete
result, no dead letter (the owner writes those). Its cost is applying every partition
on every worker: N workers do N times the work of one.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from amps_on_kafka.log.kafka import consume_available, partitions_of, reader
from amps_on_kafka.processor.staging import log_messages, stage, stage_expiry
from amps_on_kafka.state.store import PartitionStore

if TYPE_CHECKING:
    from amps_on_kafka.processor.worker import Worker

log = logging.getLogger(__name__)

BATCH_SIZE = 5000  # records applied per step: the active partitions' loop waits meanwhile


class Standby:
    """The standby copies of one worker, stepped by its loop (the worker's thread)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stores: dict[tuple[str, int], PartitionStore] = {}
        self.consumer = reader(
            worker.bootstrap,
            **{"auto.offset.reset": "earliest", "isolation.level": "read_committed"},
        )
        self._changed = True
        worker.engine.on_assignment(self._assignment_changed)

    def _assignment_changed(self) -> None:
        self._changed = True

    def step(self) -> None:
        """Follow the assignment, apply what arrived, sweep what is due."""
        if self._changed:
            self._changed = False
            self._reconcile()
        if not self.stores:
            return
        by_partition: dict[tuple[str, int], list[Message]] = defaultdict(list)
        for record in consume_available(self.consumer, BATCH_SIZE, 0):
            if not record.error():
                by_partition[(record.topic(), record.partition())].append(record)
        for (consumed, partition), batch in by_partition.items():
            store = self.stores.get((self.worker._logical[consumed], partition))
            if store is not None:
                self._apply(store, batch)
        for store in self.stores.values():
            self._expire(store)

    def release(self, topic: str, partition: int) -> None:
        """Before the worker opens a partition it was given: close its standby copy (it
        reaches disk), which the active store then resumes from."""
        store = self.stores.pop((topic, partition), None)
        if store is not None:
            tp = TopicPartition(self.worker._consumed(topic), partition)
            self.consumer.incremental_unassign([tp])
            log.info("standby %s|%s handed over at %s", topic, partition, store.next_offset())
            store.close()

    def close(self) -> None:
        self.consumer.close()
        for store in self.stores.values():
            store.close()
        self.stores.clear()

    def _reconcile(self) -> None:
        """Copies of every partition the engine does not hold, and no others."""
        worker = self.worker
        owned = {(s.topic, s.partition) for s in worker.engine.stores()}
        wanted = {
            (topic, partition)
            for consumed, topic in worker._logical.items()
            for partition in partitions_of(self.consumer, consumed)
        } - owned
        for key in [k for k in self.stores if k not in wanted]:
            self.release(*key)
        for topic, partition in sorted(wanted - set(self.stores)):
            self._adopt(topic, partition)

    def _adopt(self, topic: str, partition: int) -> None:
        worker = self.worker
        rules = worker.rules[topic]
        consumed = worker._consumed(topic)
        if rules.placement is None:  # no partition of it assigned here yet: keys are
            worker._place(self.consumer, consumed)  # checked as the owner checks them
        store = worker.store_of(topic, partition)
        worker.restore([store])  # from its changelog, if it has one
        rules.schedules[partition] = worker._expiry_schedule(store, rules)
        self.stores[(topic, partition)] = store
        stored = store.next_offset()
        offset = stored if stored is not None else OFFSET_BEGINNING
        self.consumer.incremental_assign([TopicPartition(consumed, partition, offset)])
        log.info("standby copy of %s|%s from %s", topic, partition, stored or "the start")

    def _apply(self, store: PartitionStore, batch: list[Message]) -> None:
        rules = self.worker.rules[store.topic]
        messages = log_messages(store, rules, batch)
        # previous as the owner computes it without subscribers: whether a record
        # updated had expired matters to an expiring topic
        state, _ = stage(store, rules, messages, previous=rules.expiring)
        store.write(state)

    def _expire(self, store: PartitionStore) -> None:
        rules = self.worker.rules[store.topic]
        staged = stage_expiry(store, rules, self.worker.clock()) if rules.expiring else None
        if staged is not None:
            store.write(staged[0])
