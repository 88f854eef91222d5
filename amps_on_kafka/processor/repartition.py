"""Repartitioning: a SOW over a topic whose records are not placed by SOW key.

A SOW holds each key in the store of one partition, so every record of a key must be in
that partition. Producers that key records by something else, or not at all, break that
(defect 14). For such a topic (`Repartition: true` on its SOW) the worker runs a
Repartitioner, Kafka Streams' answer: it reads the source topic and writes each record
again to the internal topic `_amps_repartition.<topic>`, keyed by its SOW key and placed
by murmur2; the worker keeps the SOW from that topic instead of the source.

Exactly once: each batch is written in one Kafka transaction together with the source
offsets it consumed (send_offsets_to_transaction), and the worker reads the internal
topic read_committed. A crash aborts the open transaction (the restarted instance's
init_transactions fences it), so the batch is read and written again once: nothing is
lost, nothing doubled.

A copy keeps the record's value, headers and timestamp (the internal topic uses
CreateTime, so an expiration is computed from the source's LogAppendTime) and adds the
record's source bookmark in header `sb`. What can't be routed (a record whose envelope
or payload doesn't decode, or has no key) goes to partition 0 as it is: the worker
refuses it there with its reason, and dead-letters it, as it would have in the source.
A record too large to copy (its copy, with the added header, over the producer's
message.max.bytes or the internal topic's max.message.bytes) could never be written: in
its place goes a copy without its value whose command names why, to partition 0, which
the worker refuses and dead-letters the same way (the letter's source bookmark leads to
the record itself), instead of the copying being retried forever.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from amps_on_kafka.config import Config, SowConfig
from amps_on_kafka.errors import AmpsError, TransportError
from amps_on_kafka.log.bookmarks import format_bookmark
from amps_on_kafka.log.envelope import H_COMMAND, H_SOW_KEYS, Command, EnvelopeError, headers_of
from amps_on_kafka.log.kafka import (
    CONSUMER_TUNING,
    METADATA_TIMEOUT,
    client_config,
    consume_available,
    partitions_of,
)
from amps_on_kafka.log.keys import partition_for
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.log.topics import (
    H_TARGET_PARTITION,
    create_topics,
    new_repartition_topic,
    repartition_topic,
    spec_from_config,
)
from amps_on_kafka.state.sow import SowRules

log = logging.getLogger(__name__)

H_SOURCE_BOOKMARK = "sb"
BATCH_SIZE = 5000  # records per transaction: bounds what a crash makes the next one redo
RETRY_WAIT = 1.0  # seconds after a failed transaction before the batch is read again
TRANSACTION_TIMEOUT = 30.0  # seconds: init, offsets and commit of one transaction


def consumed_topic(sow: SowConfig) -> str:
    """The topic a worker reads for this SOW."""
    return repartition_topic(sow.topic) if sow.repartition else sow.topic


def ensure_repartition_topic(admin: AdminClient, spec: TopicSpec) -> None:
    """Create the internal topic if it is missing (a worker started before `topics
    create` made it), with as many partitions as the source has now."""
    count = len(partitions_of(admin, spec.name))
    create_topics(admin, [new_repartition_topic(TopicSpec(spec.name, count), 1, None)])


class Repartitioner:
    """Copies one source topic into its internal topic, keyed by SOW key, exactly once."""

    def __init__(
        self, config: Config, sow: SowConfig, bootstrap: str, group_id: str, state_dir: Path
    ) -> None:
        topic = config.topic(sow.topic)
        self.spec = spec_from_config(config, topic)  # type: ignore[arg-type]
        self.rules = SowRules(sow, self.spec.codec)  # placement None: keys only, no check
        self.bootstrap = bootstrap
        self.source = sow.topic
        self.target = repartition_topic(sow.topic)
        self.group_id = f"{group_id}.repartition"
        # Stable per worker (its state directory): a restarted worker's init_transactions
        # aborts what its crashed predecessor left open instead of waiting for a timeout,
        # and, as the consumer's static group.instance.id, takes its partitions back at
        # once instead of after the dead member's session timeout.
        place = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
        self.transactional_id = f"amps-repartition.{self.group_id}.{self.source}.{place}"
        self.forwarded = 0  # source records handled (copied, or refused) and committed
        self._progress = threading.Condition()
        self.failures = 0  # transactions aborted and retried since start
        self.refused = 0  # copies refused for good (too large): sent to be dead-lettered
        # Source records (partition, offset) whose copy the broker refused as too large.
        # It refuses a whole request, so those that shared it are only suspects: read
        # again, each is copied in a request of its own; refused alone, it is too large
        # (with the error), and in the next reading it is replaced (`_refuse`).
        self._suspects: set[tuple[int, int]] = set()
        self._too_large: dict[tuple[int, int], str] = {}
        self._refusing: list[tuple[tuple[int, int], str]] = []  # in the open transaction
        # Kafka refused a copy in the open transaction: its producer's sequence numbers
        # are broken (OUT_OF_ORDER_SEQUENCE_NUMBER after the abort), so it is replaced.
        self._producer_broken = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._routes: Routes | None = None  # once the internal topic's count is known
        # After a failed transaction the consumer must go back to the committed offsets
        # before it reads on: committing positions past records never written loses them.
        self._rewind_due = False

    def start(self) -> None:
        ensure_repartition_topic(AdminClient(client_config(self.bootstrap)), self.spec)
        self._thread = threading.Thread(
            target=self._run, name=f"amps-repartition-{self.source}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the loop -------------------------------------------------------------------
    def _run(self) -> None:
        """Never ends on an error: a failed transaction is aborted, the consumer goes back
        to the committed offsets, and the batch is read again after RETRY_WAIT."""
        consumer = self._consumer()
        producer: Producer | None = None
        try:
            consumer.subscribe([self.source])
            while not self._stop.is_set():
                try:
                    if self._rewind_due:
                        self._rewind(consumer)
                    producer = producer or self._producer()
                    records = consume_available(consumer, BATCH_SIZE, 0.1)
                    records = [r for r in records if r.error() is None]
                    if records:
                        self._forward(consumer, producer, records)
                except Exception as exc:  # any failure: retried, never the end of the copying
                    producer = self._recover(consumer, producer, exc)
        finally:
            consumer.close()
            if producer is not None:
                producer.close()

    def _forward(self, consumer: Consumer, producer: Producer, records: list[Message]) -> None:
        producer.begin_transaction()
        self._refusing.clear()
        if self._routes is None:
            self._routes = Routes(self.rules, len(partitions_of(consumer, self.target)))
        for record in records:
            self._copy(producer, record)
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        producer.send_offsets_to_transaction(
            positions, consumer.consumer_group_metadata(), TRANSACTION_TIMEOUT
        )
        producer.commit_transaction(TRANSACTION_TIMEOUT)
        for source, bookmark in self._refusing:  # committed: counted and said once
            log.error(
                "repartition %s: record %s %s", self.source, bookmark, self._too_large[source]
            )
            del self._too_large[source]
            self.refused += 1
        with self._progress:
            self.forwarded += len(records)
            self._progress.notify_all()

    def wait_forwarded(self, count: int, timeout: float = 60.0) -> None:
        """Block until `count` source records have been handled since start."""
        with self._progress:
            if not self._progress.wait_for(lambda: self.forwarded >= count, timeout):
                raise TransportError(
                    f"repartitioner of {self.source!r} copied {self.forwarded} of {count} "
                    f"records in {timeout}s"
                )

    def _copy(self, producer: Producer, record: Message) -> None:
        """Queue the copies of one record; one known too large is refused instead, and a
        suspect goes alone (the transaction is then aborted at once if it was refused)."""
        source = (record.partition(), record.offset())
        if source in self._too_large:
            self._refuse(producer, record)
            return
        alone = source in self._suspects
        if alone:
            producer.flush(TRANSACTION_TIMEOUT)  # the copies before it go without it
        for partition, key, headers in self._routes.copies(record):
            self._produce(producer, record, partition, key, headers, alone)
        if alone:
            producer.flush(TRANSACTION_TIMEOUT)
            if source in self._too_large:
                raise TransportError(
                    f"record {record.offset()} of partition "
                    f"{record.partition()} is too large to copy; copying again without it"
                )
            self._suspects.discard(source)

    def _produce(
        self,
        producer: Producer,
        record: Message,
        partition: int,
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        alone: bool,
    ) -> None:
        """Queue one copy. A copy too large for Kafka would fail the same way on every
        retry: one the producer refuses is replaced at once by a refusal to dead-letter
        (`_refuse`); one the broker refuses, once it is refused `alone`."""
        source = (record.partition(), record.offset())

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is None or error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                return
            self._producer_broken = True
            if alone:
                self._too_large[source] = _too_large(record, error.str())
            else:
                self._suspects.add(source)

        try:
            _produce(
                producer,
                self.target,
                record.value(),
                key,
                partition=partition,
                headers=headers,
                timestamp=record.timestamp()[1],
                on_delivery=delivered,
            )
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            self._too_large[source] = _too_large(record, exc.args[0].str())
            self._refuse(producer, record)

    def _refuse(self, producer: Producer, record: Message) -> None:
        """In place of a copy Kafka will not take: one without the value, to partition 0,
        whose command names why; the worker refuses it and dead-letters it with its
        source bookmark. Counted in `refused` and logged once the transaction commits."""
        source = (record.partition(), record.offset())
        bookmark = format_bookmark(record.topic(), record.partition(), record.offset())
        self._refusing.append((source, bookmark))
        reason = self._too_large[source]
        headers = [(H_COMMAND, reason.encode()), (H_SOURCE_BOOKMARK, bookmark.encode())]
        _produce(
            producer,
            self.target,
            None,
            record.key(),
            partition=0,
            headers=headers,
            timestamp=record.timestamp()[1],
        )

    def _recover(
        self, consumer: Consumer, producer: Producer | None, exc: Exception
    ) -> Producer | None:
        """Abort the open transaction and rewind to the committed offsets. A producer that
        can't abort (fenced, fatal) is dropped; the next one's init_transactions fences
        it for good."""
        self.failures += 1
        expected = isinstance(exc, KafkaException | AmpsError)
        log.log(
            logging.WARNING if expected else logging.ERROR,
            "repartition %s -> %s failed, retrying: %s",
            self.source,
            self.target,
            exc,
            exc_info=not expected,
        )
        if producer is not None:
            try:
                producer.abort_transaction(TRANSACTION_TIMEOUT)
            except KafkaException:
                producer.close()  # fenced or fatal: the next one takes its place
                producer = None
        if producer is not None and self._producer_broken:
            producer.close()  # its next transaction would fail: skipped sequence numbers
            producer = None
        self._producer_broken = False
        self._rewind_due = True
        self._stop.wait(RETRY_WAIT)
        return producer

    def _rewind(self, consumer: Consumer) -> None:
        assigned = consumer.assignment()
        if assigned:
            for tp in consumer.committed(assigned, timeout=METADATA_TIMEOUT):
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING  # none committed
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        self._rewind_due = False

    # -- clients ----------------------------------------------------------------------
    def _consumer(self) -> Consumer:
        return Consumer(
            client_config(
                self.bootstrap,
                **{
                    "group.id": self.group_id,
                    "group.instance.id": self.transactional_id,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                    "partition.assignment.strategy": "cooperative-sticky",
                    "fetch.wait.max.ms": 50,
                    **CONSUMER_TUNING,
                },
            )
        )

    def _producer(self) -> Producer:
        producer = Producer(
            client_config(
                self.bootstrap,
                **{
                    "transactional.id": self.transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "transaction.timeout.ms": int(TRANSACTION_TIMEOUT * 1000),
                },
            )
        )
        producer.init_transactions(TRANSACTION_TIMEOUT)
        return producer


def _too_large(record: Message, error: str) -> str:
    return f"too large to repartition ({len(record.value() or b''):,} bytes): {error}"


def _produce(producer: Producer, topic: str, value: bytes | None, key: bytes | None, **kw) -> None:
    """produce(), waiting while the local queue is full for deliveries to drain."""
    while True:
        try:
            producer.produce(topic, value, key, **kw)
            return
        except BufferError:
            producer.poll(0.05)


Copy = tuple[int, bytes | None, list[tuple[str, bytes]]]  # partition, key, headers


class Routes:
    """Where the copies of a source record go among `count` internal partitions.

    Every record gets at least one copy, so nothing is lost on the way: what can't be
    keyed goes to partition 0 unchanged, for the worker to refuse with its reason.
    """

    def __init__(self, rules: SowRules, count: int) -> None:
        self.rules = rules
        self.count = count

    def copies(self, record: Message) -> Iterator[Copy]:
        """(partition, key, headers) of each copy of a source record."""
        source = format_bookmark(record.topic(), record.partition(), record.offset()).encode()
        try:
            read = headers_of(record)  # once: a second read can crash (envelope.read_headers)
        except EnvelopeError as exc:  # not copied; the copy's command says why it's refused
            yield 0, record.key(), [(H_COMMAND, exc.reason.encode()), (H_SOURCE_BOOKMARK, source)]
            return
        headers = [*(read or []), (H_SOURCE_BOOKMARK, source)]
        message = LogMessage(
            record.topic(),
            record.partition(),
            record.offset(),
            record.timestamp()[1],
            record.value(),
            read,
            self.rules.codec,
        )
        try:
            envelope = message.envelope
            if envelope.command is Command.SOW_DELETE and envelope.filter is not None:
                for partition in self._targets(headers):
                    yield partition, None, headers
                return
            if envelope.command is Command.SOW_DELETE and envelope.sow_keys is not None:
                yield from self._per_key(envelope.sow_keys, headers)
                return
            key = self.rules.key_of(message, envelope).encode()
        except AmpsError:
            yield 0, record.key(), headers  # the worker refuses it there, with its reason
            return
        yield partition_for(key, self.count), key, headers

    def _targets(self, headers: list[tuple[str, bytes]]) -> range:
        """The partitions a delete by filter goes to: the one our publisher named (it
        writes one record per internal partition), else every one."""
        named = dict(headers).get(H_TARGET_PARTITION)
        try:
            partition = int(named)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            partition = -1
        if 0 <= partition < self.count:
            return range(partition, partition + 1)
        return range(self.count)

    def _per_key(self, keys: tuple[str, ...], headers: list[tuple[str, bytes]]) -> Iterator[Copy]:
        """A delete by keys becomes one delete per key, each where its key lives (the
        worker refuses a delete naming a key of another partition)."""
        others = [(n, v) for n, v in headers if n != H_SOW_KEYS]
        for key in dict.fromkeys(keys):
            raw = key.encode()
            yield partition_for(raw, self.count), raw, [*others, (H_SOW_KEYS, orjson.dumps([key]))]
