"""One owner per queue across the workers of a group, elected by Kafka.

Every worker whose config names a queue joins the consumer group `amps-queue-owner.<Name>`,
subscribed to the queue's events topic `_amps_queue.<Name>`, which has one partition: the
member assigned partition 0 owns the queue and runs its QueueRuntime; when the partition
is revoked (a rebalance) it stops the runtime first, so the next owner starts from the
store and events this one left. A member that dies without a word leaves the group after
its session timeout, and the group gives partition 0 to another member, which rebuilds
the queue from its own store or the recovery point and the events log (queue_recovery.py):
the leases the dead owner held are not stored, so their messages are back in the queue,
and every ack it answered is in the events log, so none is delivered again.

The cooperative-sticky assignor keeps the partition where it is when a member joins, so
a worker starting does not take a queue away from its owner. The election consumers read
nothing: partition 0 is paused as soon as it is assigned.

The group alone can't stop a member that stops polling for longer than its session
timeout while alive (a frozen process): the group drops it and gives the queue to
another, and the frozen one resumes believing it still owns the queue. Kafka fences it:
the owner writes the queue's events through a transactional producer whose
transactional.id is the queue's (processor/queue_events.py), and a new owner's
init_transactions, before it reads the events, makes every later write of the old one
fail. The old owner learns so at its next commit, before it answers any ack, and stops
serving the queue at once: its waiting acks and its subscriptions end with `retry: queue
moving`, and it resigns from the group (`resign`: leaves and joins again), which keeps the
queue with the new owner. After a stall its deliveries wait for such a commit too
(queue_runtime.py, STALL), so it delivers nothing once the new owner has opened.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from amps_on_kafka.log.kafka import admin_client, reader
from amps_on_kafka.processor.queue_recovery import ensure_events_topic
from amps_on_kafka.processor.queue_runtime import events_topic

log = logging.getLogger(__name__)

OWNER_GROUP_PREFIX = "amps-queue-owner."
POLL_WAIT = 0.05  # seconds each election consumer waits in a turn: bounds how late a move is seen


class QueueOwnership:
    """The election of every queue of one worker, on a thread of its own: `acquire(name)`
    and `release(name)` are called on that thread when this worker gains or loses one."""

    def __init__(
        self,
        bootstrap: str,
        queues: list[str],
        session_timeout: float,
        acquire: Callable[[str], None],
        release: Callable[[str], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.queues = queues
        self.session_ms = int(session_timeout * 1000)
        self.acquire = acquire
        self.release = release
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="amps-queue-owner", daemon=True)
        self._consumers: dict[str, Consumer] = {}
        self._resigned: deque[str] = deque()  # queues to leave and join again (fenced)
        # set at each queue's first assignment (this worker's share, empty or not)
        self.settled = {name: threading.Event() for name in queues}

    def wait_settled(self, deadline: float) -> bool:
        """Until every queue's group gave this worker its share (False at `deadline`,
        monotonic): a worker is ready once it knows which queues it owns."""
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self.settled.values())

    def start(self) -> None:
        admin = admin_client(self.bootstrap)
        for name in self.queues:
            ensure_events_topic(admin, events_topic(name))
            self._consumers[name] = self._join(name)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Leave every group; the queues owned here are released first (on_revoke)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def resign(self, name: str) -> None:
        """Any thread: leave the queue's group and join it again (on the election's
        thread), once this worker stopped running the queue because its events writer
        was fenced: the group then gives the queue to whichever member it chooses (the
        new owner keeps it; this worker again, if it is alone)."""
        self._resigned.append(name)

    def _join(self, name: str) -> Consumer:
        consumer = reader(
            self.bootstrap,
            **{
                "group.id": f"{OWNER_GROUP_PREFIX}{name}",
                "session.timeout.ms": self.session_ms,
                "heartbeat.interval.ms": max(100, self.session_ms // 3),
                "partition.assignment.strategy": "cooperative-sticky",
                "auto.offset.reset": "latest",
            },
        )
        self._subscribe(name, consumer)
        return consumer

    def _subscribe(self, name: str, consumer: Consumer) -> None:
        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if partitions:
                consumer.incremental_assign(partitions)
                consumer.pause(partitions)  # the partition is a token: nothing is read
                log.info("queue %s: this worker owns it now", name)
                self.acquire(name)
            self.settled[name].set()

        def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if partitions:
                log.info("queue %s: ownership moves away from this worker", name)
                self.release(name)

        consumer.subscribe(
            [events_topic(name)], on_assign=assigned, on_revoke=revoked, on_lost=revoked
        )

    def _run(self) -> None:
        consumers = list(self._consumers.values())
        try:
            while not self._stop.is_set():
                for consumer in consumers:
                    consumer.poll(POLL_WAIT)  # paused: returns no records, runs callbacks
                while self._resigned:
                    name = self._resigned.popleft()
                    log.info("queue %s: leaving its owner group to join again", name)
                    self._consumers[name].unsubscribe()
                    self._subscribe(name, self._consumers[name])
        except KafkaException as exc:
            log.error("queue ownership stopped: %s", exc)
        finally:
            for consumer in consumers:
                consumer.close()  # revokes (and releases) what this worker owns
