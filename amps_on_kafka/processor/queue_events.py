"""A queue's writer of its events records (and dead letters): Kafka transactions of a
producer whose transactional.id is the queue's own, `amps-queue.<Name>`, so that Kafka
itself fences one owner from the next (docs/scaling.md, Queues across workers).

The owner calls `open` (init_transactions) when it takes the queue, before it reads the
events topic: the broker aborts whatever transaction a previous holder left open and
refuses every later write of that holder (its producer is fenced). A holder that lost
the queue without knowing (a frozen process the election group dropped) learns it at its
next commit, and nothing it wrote after the new owner opened is ever read: the events
topic is read read_committed, and an ack is answered only once its transaction
committed.

Group commit: one thread per queue takes every record added since its last transaction
(and in the LINGER after the first) and commits them in one, so acks that arrive
meanwhile share it: the cost is a transaction per turn, not per message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.kafka import client_config

log = logging.getLogger(__name__)

TRANSACTIONAL_PREFIX = "amps-queue."
# The broker aborts a transaction left open longer (a holder frozen mid-commit; a new
# owner's init_transactions aborts it at once). It also bounds each record's delivery.
TRANSACTION_TIMEOUT = 60.0
COMMIT_TIMEOUT = 30.0  # seconds for init_transactions and for each commit
# Seconds the writer gathers records after the first before it commits them: a
# transaction costs the broker several requests and markers, and without this wait a
# queue acked at 13,000 messages a second ran 0.8x as fast (bench queues, 2 cores); an
# ack is answered up to this much later.
LINGER = 0.01
RETRY_FOR = 30.0  # seconds a batch is tried again after errors that are not fatal


@dataclass(slots=True)
class Pending:
    """A record to write: an events record has its sequence number, and may carry the
    deliveries that wait for it (sent once it is committed)."""

    topic: str
    value: bytes
    headers: list[tuple[str, bytes]] | None = None
    sequence: int = 0  # 0: not an events record (a dead letter)
    deferred: Any = None


# committed(last sequence, events offset after the last events record or None, deferred)
Committed = Callable[[int, int | None, list[Any]], None]


class EventsWriter:
    """The transactional writer of one queue, on a thread of its own."""

    def __init__(
        self,
        bootstrap: str,
        queue: str,
        committed: Committed,
        lost: Callable[[str], None],
        failed: Callable[[str], None],
    ) -> None:
        self.bootstrap = bootstrap
        self.transactional_id = f"{TRANSACTIONAL_PREFIX}{queue}"
        self._committed = committed
        self._lost = lost  # fatal (fenced): this worker must stop serving the queue
        self._failed = failed  # the batch could not be written: memory and logs disagree
        self._producer: Producer | None = None
        self._cond = threading.Condition()
        self._unsent: list[Pending] = []
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"amps-{queue}-events", daemon=True)

    def open(self) -> None:
        """Take the transactional id (fencing any earlier holder) and start writing."""
        self._producer = Producer(
            {
                **client_config(self.bootstrap),
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": int(TRANSACTION_TIMEOUT * 1000),
                "linger.ms": 1,
                "compression.type": "lz4",
            }
        )
        try:
            self._producer.init_transactions(COMMIT_TIMEOUT)
        except KafkaException as exc:
            raise TransportError(
                f"{self.transactional_id}: init_transactions failed: {exc}"
            ) from exc
        self._thread.start()

    def add(self, record: Pending) -> None:
        with self._cond:
            self._unsent.append(record)
            self._cond.notify()

    def drain(self, timeout: float) -> bool:
        """Until every record added so far is committed (or given up): False at timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not (self._unsent or self._busy) or not self._thread.is_alive(),
                timeout,
            )

    def close(self, timeout: float = COMMIT_TIMEOUT) -> None:
        """Write what is pending, then stop (records added later are dropped)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._unsent or self._closed)
                if not self._unsent:
                    return
                self._cond.wait_for(lambda: self._closed, LINGER)  # gather more
                batch, self._unsent = self._unsent, []
                self._busy = True
            try:
                written = self._write(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            if not written:
                return

    def _write(self, batch: list[Pending]) -> bool:
        """One transaction with the batch, tried again after errors that are not fatal
        for RETRY_FOR seconds; False once the writer can't go on."""
        producer = self._producer
        assert producer is not None
        ends: list[int] = []

        def reported(error: KafkaError | None, record: Message) -> None:
            offset = record.offset()
            if error is None and offset is not None:  # only events records ask for one
                ends.append(offset)

        deadline = time.monotonic() + RETRY_FOR
        while True:
            ends.clear()
            try:
                producer.begin_transaction()
                for record in batch:
                    _produce(producer, record, reported if record.sequence else None)
                producer.commit_transaction(COMMIT_TIMEOUT)
                producer.poll(0)  # the delivery reports not served yet
                break
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    self._lost(f"{self.transactional_id} fenced or failed: {error.str()}")
                    return False
                if not self._aborted(producer, error, deadline):
                    self._failed(f"the queue-events topic refused a transaction: {error.str()}")
                    return False
        sequences = [r.sequence for r in batch if r.sequence]
        following = max(ends) + 1 if ends else None
        self._committed(max(sequences, default=0), following, [r.deferred for r in batch])
        return True

    def _aborted(self, producer: Producer, error: KafkaError, deadline: float) -> bool:
        """Abort after an error that is not fatal: True when the batch may be tried again."""
        log.warning("%s: a transaction failed, trying again: %s", self.transactional_id, error)
        try:
            producer.abort_transaction(COMMIT_TIMEOUT)
        except KafkaException as exc:
            log.warning("%s: aborting failed: %s", self.transactional_id, exc)
        return time.monotonic() < deadline


Report = Callable[[KafkaError | None, Message], None]


def _produce(producer: Producer, record: Pending, reported: Report | None) -> None:
    """Produce to partition 0 (the events topic has one; a dead letter goes where its
    topic's partitioner puts it), waiting for room when the producer's queue is full."""
    headers: Any = record.headers
    while True:
        try:
            if record.sequence:
                producer.produce(record.topic, record.value, partition=0, on_delivery=reported)
            else:
                producer.produce(record.topic, record.value, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)
