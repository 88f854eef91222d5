"""Recovering a queue when its runtime starts (processor/queue_runtime.py): the store,
or the recovery point its last owner committed to Kafka when there is none (or the events
it needs are gone), then the events recorded since, then the underlying topics read from
where the state ends. The events topic is created here first, and the writer opened, so
a previous owner is fenced before its events are read.

A mixin of QueueRuntime: it reads and sets the runtime's state (set by its __init__).
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from amps_on_kafka.errors import TransportError, UnknownTopic
from amps_on_kafka.log.bookmarks import watermarks
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    consume_available,
    partitions_matching,
    reader,
    reader_config,
)
from amps_on_kafka.log.native_reader import queue_consumer
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_store import (
    QueueStore,
    StoredQueue,
    UnstoredRuns,
    decode_events,
    queue_store_path,
)
from amps_on_kafka.state.queue_store_runs import members
from amps_on_kafka.state.queue_types import TP, QueueEntry, RecoveryPoint

# the runtime's log lines keep its logger name, which operators filter on
# (docs/operations.md, Logging)
log = logging.getLogger("amps_on_kafka.processor.queue_runtime")

GROUP_PREFIX = "amps-queue."
_NO_COMMITTED = -1001


class Recovery:
    """The recovery part of QueueRuntime (its attributes are set by QueueRuntime.__init__)."""

    def _recover(self) -> None:
        """Load the store (or start at the recovery point), replay the events log, then
        read the underlying topics from where the state ends."""
        admin = admin_client(self.engine.bootstrap)
        ensure_events_topic(admin, self.events_topic)
        self._writer.open()  # fences the previous owner before its events are read
        self._consumer = queue_consumer(  # the compiled reader where it reads as confluent's
            reader_config(
                self.engine.bootstrap,
                **{"group.id": f"{GROUP_PREFIX}{self.name}", "auto.offset.reset": "earliest"},
            )
        )
        self._admin = admin
        partitions = self._underlying(admin)
        if not partitions:
            raise UnknownTopic(f"no topic matches {self.config.underlying}")
        stored = self._open_store()
        if stored is not None:
            starts, events_from = stored.positions, stored.events_offset
        else:
            starts, events_from = self._committed(partitions)
        state = self.state
        for tp in partitions:
            state.start_at(tp, starts.get(tp, 0))
        if stored is not None:
            for entry in stored.entries:
                state.restore(entry)
            for message, early in stored.early.items():
                state.restore_early(message, early)
            state.next_seq = max(state.next_seq, stored.next_seq)
        self._read_again(stored)
        self._durable_next = self._replay_events(events_from)
        state.ev_next = self._durable_next
        self._read = True
        self._consumer.assign(
            [TopicPartition(t, p, state.positions[(t, p)]) for t, p in partitions]
        )
        log.info(
            "queue %s: %d messages after recovery, reading %d partitions",
            self.name,
            state.depth,
            len(partitions),
        )

    def _read_again(self, stored: StoredQueue | None) -> None:
        """The messages the checkpoint left in their topics (state/queue_store_runs.py):
        each partition is read again from its first (before the events are replayed, so
        an event about one waits for it as an ack that came early), and the queue keeps
        leaving such messages there unless a rule makes it admit in another order
        (a barrier, TargetQueueDepth)."""
        policy = self.state.policy
        kept = stored.runs if stored is not None else []
        if policy.barrier is None and policy.target_depth is None:
            self.runs = UnstoredRuns(policy.max_deliveries is not None, kept)
        if not kept:
            return
        point = self.store.recovery_point()  # type: ignore[union-attr]
        self._reread = Reread(members(kept), dict(self.state.positions), point, self.runs)
        for tp, front in self._reread.fronts().items():
            if tp in self.state.positions:
                self.state.start_at(tp, front)

    def _open_store(self) -> StoredQueue | None:
        """The store, unless the events since it are no longer all in the events topic
        (retention deleted some: a worker that owned the queue long ago): it is then
        emptied, and the queue rebuilt from the recovery point its last owner committed."""
        path = queue_store_path(self.engine.state_dir, self.name)
        self.store = QueueStore(path)
        stored = self.store.load(self._codecs.get)
        kept = watermarks(self._consumer, [(self.events_topic, 0)])[(self.events_topic, 0)].low  # type: ignore[arg-type]
        if stored is None or stored.events_offset >= kept:
            return stored
        log.warning(
            "queue %s: its store needs the events from offset %d, the events topic keeps "
            "them from %d: rebuilt from the recovery point instead",
            self.name,
            stored.events_offset,
            kept,
        )
        self.store.close()
        shutil.rmtree(path)
        self.store = QueueStore(path)
        return None

    def _underlying(self, admin) -> list[TP]:
        """Every partition of the topics UnderlyingTopic matches now, codecs known."""
        partitions = partitions_matching(admin, self.config.views)
        for topic in {t for t, _ in partitions} - self._codecs.keys():
            self._codecs[topic] = self.engine.registry.spec(topic).codec
        return partitions

    def _committed(self, partitions: list[TP]) -> tuple[dict[TP, int], int]:
        """The recovery point committed to Kafka; the start of the logs when there is none."""
        wanted = [TopicPartition(t, p) for t, p in [*partitions, (self.events_topic, 0)]]
        found = self._consumer.committed(wanted, timeout=METADATA_TIMEOUT)  # type: ignore[union-attr]
        marks = watermarks(self._consumer, [*partitions, (self.events_topic, 0)])  # type: ignore[arg-type]
        offsets = {
            (tp.topic, tp.partition): tp.offset
            if tp.offset != _NO_COMMITTED
            else marks[(tp.topic, tp.partition)].low
            for tp in found
        }
        events = offsets.pop((self.events_topic, 0))
        return offsets, events

    def _replay_events(self, start: int) -> int:
        """Apply the events committed after the state's events offset; returns the end.
        Read read_committed: what a fenced owner wrote after this one opened is aborted."""
        consumer = reader(self.engine.bootstrap, **{"isolation.level": "read_committed"})
        where = TopicPartition(self.events_topic, 0)
        try:
            end = watermarks(consumer, [(self.events_topic, 0)])[(self.events_topic, 0)]
            if start < end.low:
                log.error(
                    "queue %s: its state needs the events from offset %d, the events topic "
                    "keeps them from %d (retention): acks recorded before are lost, and "
                    "their messages may be delivered again",
                    self.name,
                    start,
                    end.low,
                )
            start = max(start, end.low)
            position = start
            if start < end.high:
                consumer.assign([TopicPartition(self.events_topic, 0, start)])
            deadline = time.monotonic() + 10 * METADATA_TIMEOUT
            while position < end.high:
                if time.monotonic() > deadline:
                    raise TransportError(f"queue {self.name}: timed out replaying its events")
                for record in consume_available(consumer, 1000, 0.1):
                    if record.error() is None and record.offset() < end.high:
                        for event in decode_events(record.value()):
                            self.state.apply_event(event)
                        position = record.offset() + 1
                if position < end.high:  # transaction markers are read past, never returned
                    position = max(position, consumer.position([where])[0].offset)
            return end.high
        finally:
            consumer.close()


def ensure_events_topic(admin, name: str) -> None:
    """The queue's one-partition events topic, made unless it exists: the owner election
    (processor/queue_owner.py) needs it as much as the runtime does."""
    futures = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=METADATA_TIMEOUT)
    try:
        futures[name].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TransportError(f"can't create the queue-events topic {name!r}: {exc}") from exc


class Reread:
    """A restart's reading again of the messages its checkpoint left in their topics: in
    each partition, from the first of them up to the offset the store had read to, a
    member of the stored runs is enqueued with its arrival number; any other record
    there is read past (a stored message, restored already; one that left the queue)."""

    def __init__(
        self,
        members: dict[TP, dict[int, int]],
        until: dict[TP, int],
        point: RecoveryPoint | None,
        runs: Any,
    ) -> None:
        # the partitions the queue still reads (a deleted topic's members are lost)
        self._members = {tp: found for tp, found in members.items() if found}
        self._until = {tp: until[tp] for tp in self._members if tp in until}
        # no event about a member is older than the stored recovery point's events offset
        self._ev_pos = None if point is None else point.events
        self._runs = runs  # the queue's UnstoredRuns, or None (its policy stores all)

    def fronts(self) -> dict[TP, int]:
        """Where each partition is read again from."""
        return {tp: min(self._members[tp]) for tp in self._until}

    def take(self, state: QueueState, read: list) -> list:
        """Under the engine lock: the members among `read` enqueued, the other records of
        the re-read range read past; what is past the range returned, in order."""
        rest = []
        for item in read:
            if type(item) is QueueEntry:
                topic, partition, offset = item.id
                tp = (topic, partition)
            else:
                tp, offset = item
            if offset >= self._until.get(tp, -1):
                rest.append(item)
                continue
            seq = self._members[tp].pop(offset, None)
            if seq is None or type(item) is not QueueEntry or item.id in state.entries:
                state.start_at(tp, max(state.positions[tp], offset + 1))
            elif not state.enqueue(item, seq, self._ev_pos) and self._runs is not None:
                self._runs.leave(*item.id)  # an event after the checkpoint removed it
        return rest

    def finish(self, state: QueueState, name: str) -> None:
        """Once the topics are read to their ends at startup: members not found are gone
        from the log (retention or compaction deleted them), said once, and the queue
        reads on from where the store had read."""
        for (topic, partition), lost in self._members.items():
            if lost:
                log.error(
                    "queue %s: %d waiting messages of %s|%d (offsets %d to %d) are no "
                    "longer in the topic (retention or compaction deleted them): lost",
                    name,
                    len(lost),
                    topic,
                    partition,
                    min(lost),
                    max(lost),
                    extra={
                        "event": "lost",
                        "queue": name,
                        "topic": topic,
                        "partition": partition,
                        "count": len(lost),
                    },
                )
                if self._runs is not None:
                    for offset in lost:
                        self._runs.leave(topic, partition, offset)
            tp = (topic, partition)
            if tp in self._until:
                state.start_at(tp, max(state.positions[tp], self._until[tp]))
        state.order_arrivals()
