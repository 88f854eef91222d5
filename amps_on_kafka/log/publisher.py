"""Writing commands to the log: the one code path for every publish, whichever transport.

The client's `kafka://` transport and the gateway both publish through LogPublisher, so
a record looks the same however it got to Kafka. "Persisted" means Kafka acknowledged
the record with acks=all from an idempotent producer; until then a publish is pending,
and a failure is reported to the application, never dropped.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from amps_on_kafka.errors import MessageError, PublishError
from amps_on_kafka.log.codecs import check_topic, encode_payload
from amps_on_kafka.log.envelope import (
    H_PUBLISHER,
    H_SEQUENCE,
    H_SOW_KEY,
    Command,
    check_expiration,
    command_headers,
)
from amps_on_kafka.log.kafka import PRODUCER_PARTITIONER, partitions_of
from amps_on_kafka.log.keys import partition_for
from amps_on_kafka.log.native_producer import (
    PURGED,
    CompiledProducer,
    fatal_text,
    flush_all,
    own_producer,
)
from amps_on_kafka.log.one_frame_publishers import POLL_EVERY, OneFramePublishers, Route
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec
from amps_on_kafka.log.sow_deletes import SowDeletes

# Kafka's partition count of a topic is read again after this long, as often as the
# producer refreshes its own metadata (log/kafka.py): a topic given more partitions is
# noticed, and its keyed publishes refused, within that time.
PARTITION_COUNT_TTL = 30.0
# A producer that failed fatally is flushed this long before it is replaced: its records
# in flight get Kafka's verdict (within message.timeout.ms), those it purged a failure.
FLUSH_FAILED = 30.0

Persisted = Callable[[PublishError | None, Message], None]


@dataclass(frozen=True)
class FailedWrite:
    """A command Kafka refused or never acknowledged."""

    topic: str
    sequence: int | None
    reason: str


def not_persisted(failures: list[FailedWrite]) -> PublishError:
    """The error a flush raises for the writes that failed since the last one: both
    transports' publish_flush word it alike."""
    first = failures[0]
    return PublishError(
        f"{len(failures)} publish(es) not persisted; first: topic {first.topic!r} "
        f"sequence {first.sequence}: {first.reason}"
    )


class LogPublisher(OneFramePublishers, SowDeletes):
    """Encodes commands as log records and produces them with persisted acks.

    Its one-frame publishers (publish_document, publish_encoded, publish_run) are
    log/one_frame_publishers.py, sow_delete log/sow_deletes.py; both are mixins that
    read the state set here."""

    def __init__(
        self,
        bootstrap: str,
        publisher_id: str,
        *,
        registry: TopicRegistry | None = None,
        first_sequence: int | None = None,
        on_failed_write: Callable[[FailedWrite], None] | None = None,
        producer_config: dict[str, Any] | None = None,
        report_successes: bool = True,
        producer: Producer | None = None,
    ) -> None:
        """With report_successes False, Kafka reports only failures: a publisher that needs
        no per-message persisted callback (the client; publish_flush is its persisted ack)
        saves a Python call per message.

        A `producer` given is shared (the gateway's one per worker: a producer per
        connection cost 3 threads and up to 1 GiB of buffer each): this publisher only
        stamps its id and sequences on what it writes, and close() leaves the producer to
        its owner, who serves its delivery reports.
        """
        self.publisher_id = publisher_id
        self.registry = registry or TopicRegistry(bootstrap)
        self.on_failed_write = on_failed_write
        # Microseconds since the epoch: a restarted publisher keeps its sequence rising.
        first = first_sequence if first_sequence is not None else time.time_ns() // 1000
        self._sequences = itertools.count(first + 1)  # next() is atomic under the GIL
        self._publisher_bytes = publisher_id.encode()
        self._publisher_header = (H_PUBLISHER, self._publisher_bytes)  # the same on every record
        self._unpolled = 0
        self._specs: dict[str, TopicSpec] = {}
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (partitions, good until)
        self._failures: list[FailedWrite] = []
        self._lock = threading.Lock()
        self.report_successes = report_successes
        self._bootstrap = bootstrap
        self._config = {
            "delivery.report.only.error": not report_successes,
            **(producer_config or {}),
        }
        self._shared = producer is not None
        self._closed = False
        self._fatal: str | None = None  # the fatal error of the producer being replaced
        self._renewing = threading.Lock()
        self._retired: list[Producer] = []  # own producers replaced after a fatal error
        self._delivery = _delivery_type(self._delivered)
        self._routes: dict[str, Route | None] = {}
        self.use_producer(producer if producer is not None else self._own_producer())

    def _own_producer(self) -> Producer:
        # a CompiledProducer is a Producer as far as its users go
        return cast(Producer, own_producer(self._bootstrap, self._config))

    def use_producer(self, producer: Producer) -> None:
        """Write through `producer` from now on: at start, and when the gateway replaced
        its shared producer after a fatal error (server/delivery.py)."""
        self._producer = producer
        self._numbered = self._own_compiled()
        self._produce_call = self._producer.produce  # bound once, not per record
        self.publish_document = self._document_publisher()
        self.publish_encoded = self._encoded_publisher()
        self.publish_run = self._run_publisher()

    def _own_compiled(self) -> Any:
        """The compiled core's RdProducer when this publisher owns a compiled producer
        (log/native_producer.own_producer), its failures handed to _delivered; else None.
        publish_document numbers its records on it: a success costs no Python call."""
        if self._shared or not isinstance(self._producer, CompiledProducer):
            return None
        self._producer.core.serve_failures(self._delivered)
        return self._producer.core

    def spec(self, topic: str) -> TopicSpec:
        spec = self._specs.get(topic)
        if spec is None:
            check_topic(topic)  # once per topic: a known one is a str
            spec = self._specs[topic] = self.registry.spec(topic)
        return spec

    def publish(
        self,
        topic: str,
        data: Any,
        expiration: float | None = None,
        command: Command = Command.PUBLISH,
        *,
        sow_key: str | None = None,
        correlation_id: str | None = None,
        on_persisted: Persisted | None = None,
        sequence: int | None = None,
    ) -> int:
        """Produce a publish or delta_publish; returns its sequence number.

        An explicit `sequence` is for republishing: a publish store sends a message again
        with the number it had, so subscribers' duplicate detection recognises the copy.

        The per-message hot path of every publisher (docs/performance.md): a dict payload
        is encoded without the generic encode_payload, and a plain publish (no expiration,
        no correlation id, JSON) gets its headers from the precomputed publisher header
        instead of command_headers' seven tests.
        """
        try:
            spec = self._specs.get(topic) or self.spec(topic)
        except TypeError:  # an unhashable topic (a list): named as any wrong type is
            check_topic(topic)
            raise
        if type(data) is dict:
            value, document = spec.codec.encode(data), data
        else:
            value, document = encode_payload(spec.codec, data)
        extract = spec.key_extractor
        key = (
            extract(document)
            if extract and sow_key is None
            else self._sow_key(spec, document, sow_key)
        )
        if expiration is not None:
            check_expiration(expiration)  # a worker could not store it: refuse it here
        if sequence is None:
            sequence = next(self._sequences)
        if (
            expiration is None
            and command is Command.PUBLISH
            and correlation_id is None
            and spec.message_type == "json"
        ):
            headers = [self._publisher_header, (H_SEQUENCE, b"%d" % sequence)]
            if key is not None:
                headers.append((H_SOW_KEY, key.encode()))
        else:
            headers = command_headers(
                self._publisher_bytes,
                sequence,
                command,
                key,
                expiration,
                correlation_id,
                spec.message_type,
            )
        partition = self._partition(spec, key)
        self._produce(spec.name, key, value, headers, sequence, on_persisted, partition)
        return sequence

    def partition_count(self, topic: str) -> int:
        """The topic's partition count as Kafka has it (cached for PARTITION_COUNT_TTL),
        never the registry's: fan-outs must reach partitions added since creation."""
        now = time.monotonic()
        cached = self._counts.get(topic)
        if cached is None or cached[1] <= now:
            count = len(partitions_of(self._producer, topic))
            cached = self._counts[topic] = (count, now + PARTITION_COUNT_TTL)
        return cached[0]

    def partition_count_due(self, topic: str, margin: float = 0.0) -> bool:
        """Whether partition_count(topic) would ask Kafka within `margin` seconds: a
        blocking call (up to METADATA_TIMEOUT while Kafka is down) that the gateway
        makes off its event loop."""
        cached = self._counts.get(topic)
        return cached is None or cached[1] <= time.monotonic() + margin

    def _partition(self, spec: TopicSpec, key: str | None) -> int | None:
        """The partition of a keyed record, by the topic's partitioner (keys.partition_for);
        None lets the producer place it: an unkeyed record anywhere, and a murmur2 key by
        librdkafka's murmur2_random, the same function in C (tests/log/test_partitioners.py
        holds them equal) at a tenth of the Python hash's cost.

        A keyed record for a topic whose partition count is no longer the one it was
        created with is refused: its key would land in another partition than the key's
        earlier records, and the SOW would hold the key twice.
        """
        if key is None or spec.repartition:  # the worker's repartitioner places it
            return None
        count = self.partition_count(spec.name)
        if count != spec.partitions:
            raise PublishError(
                f"topic {spec.name!r} has {count} partitions in Kafka but was created with "
                f"{spec.partitions}: a keyed publish would put SOW key {key!r} in another "
                "partition than its earlier records (docs/operations.md, The rule: one SOW "
                "key, one partition)"
            )
        if spec.partitioner == PRODUCER_PARTITIONER:
            return None
        return partition_for(key.encode(), count, spec.partitioner)

    def _sow_key(self, spec: TopicSpec, document: Any, explicit: str | None) -> str | None:
        if explicit is not None:
            if spec.key and not spec.key_from_publish:
                raise MessageError(
                    f"topic {spec.name!r} computes SOW keys from {', '.join(spec.key)}; "
                    "an explicit sow key needs KeyFromPublish: true"
                )
            return explicit
        if spec.key_extractor is None:
            if spec.key_from_publish:
                raise MessageError(
                    f"topic {spec.name!r} needs an explicit sow key on every publish"
                )
            return None
        return spec.key_extractor(document)

    def _produce(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        sequence: int,
        on_persisted: Persisted | None,
        partition: int | None = None,
    ) -> None:
        delivered = self._delivery(sequence)  # a failure must name its publish
        if on_persisted is None:
            callback = delivered
        elif self.report_successes:
            callback = _chain(delivered, on_persisted)
        else:
            raise ValueError("on_persisted needs a LogPublisher made with report_successes=True")
        produce = self._produce_call
        while True:
            try:  # a str key is encoded as UTF-8 by the client, in C
                if partition is None:
                    produce(topic, value, key, headers=headers, on_delivery=callback)
                else:
                    produce(topic, value, key, partition, headers=headers, on_delivery=callback)
                break
            except BufferError:
                self._poll(0.05)  # the local queue is full: let deliveries drain
            except KafkaException as exc:  # refused before sending, e.g. too large
                raise self._refused(topic, exc.args[0]) from exc
        if self._shared:  # its owner serves the reports (the gateway's DeliveryPump)
            return
        self._unpolled += 1
        if self._unpolled >= POLL_EVERY:
            self._unpolled = 0
            self._poll(0)

    def _refused(self, topic: str, error: KafkaError) -> PublishError:
        """The error for a produce Kafka's producer refused. After a fatal error (every
        produce refused for good) this publisher's own producer is replaced first, so
        the next publish goes to a new one; a shared one is replaced by its owner."""
        reason = f"Kafka refused a publish to {topic!r}: {error.str()}"
        compiled = getattr(self._producer, "fatal", None)  # its refusal carries the cause
        if error.code() != KafkaError._FATAL and (compiled is None or compiled() is None):
            return PublishError(reason)
        if not self._shared:
            self._renew(self._producer)
        return PublishError(
            f"{reason} (the producer failed fatally and is replaced: publish again)"
        )

    def _poll(self, timeout: float) -> None:
        """Serve delivery reports; confluent-kafka's producer raises a fatal error here,
        once: this publisher's own producer is then replaced (_renew)."""
        try:
            self._producer.poll(timeout)
        except KafkaException as exc:
            if self._shared or not exc.args[0].fatal():
                raise
            self._renew(self._producer, exc.args[0])

    def _renew(self, failed: Producer, fatal: KafkaError | None = None) -> None:
        """Replace this publisher's own producer, which failed fatally: the records it
        holds are reported first (Kafka's verdict for those in flight, a failure naming
        the fatal error for those it purged, to on_failed_write or the next flush), so
        nothing written before lands after what the new producer writes."""
        with self._renewing:
            if failed is not self._producer:
                return  # another thread replaced it meanwhile
            compiled = getattr(failed, "fatal", None)
            fatal = fatal or (compiled() if compiled is not None else None)
            self._fatal = fatal.str() if fatal is not None else "Local: Fatal error"
            flush_all(failed, FLUSH_FAILED)
            # Kept open until close(): a publish_document bound before (Client.publish
            # binds it once) still produces to it, is refused at once, and hands the
            # record to _produce, which writes through the new producer.
            self._retired.append(failed)
            self.use_producer(self._own_producer())

    def _delivered(self, sequence: int, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        reason = error.str()
        fatal = (self._fatal or fatal_text(self._producer)) if error.code() in PURGED else None
        if fatal is not None:
            reason += f" (the producer failed fatally: {fatal}; publish again)"
        failure = FailedWrite(message.topic(), sequence, reason)
        if self.on_failed_write is not None:
            self.on_failed_write(failure)
        else:
            with self._lock:
                self._failures.append(failure)

    def pending(self) -> int:
        """Commands produced that Kafka has not acknowledged yet."""
        return len(self._producer)

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports (persisted callbacks) without waiting for all of them."""
        self._poll(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged everything; raise on failures or a timeout."""
        self._poll(0)  # a fatal error pending is raised here, not inside flush (flush_all)
        try:
            remaining = self._producer.flush(-1 if timeout is None else timeout)
        except KafkaException as exc:  # confluent-kafka's: a fatal error, raised once
            if self._shared or not exc.args[0].fatal():
                raise
            self._renew(self._producer, exc.args[0])
            remaining = 0  # every record it held was reported
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            raise not_persisted(failures)
        if remaining:
            raise PublishError(
                f"{remaining} publish(es) not yet acknowledged by Kafka after {timeout}s"
            )

    def close(self, timeout: float = 10.0) -> None:
        """Flush, then let the producer's connections and threads go now, not whenever the
        garbage collector frees it (an idle producer keeps reconnecting to a broker that
        went away). A publisher whose flush fails stays open, so nothing is dropped."""
        if self._closed:
            return
        if self._shared:
            self._closed = True
            return
        self.flush(timeout)
        self._closed = True
        for producer in (*self._retired, self._producer):
            producer.close()


def _delivery_type(
    delivered: Callable[[int, KafkaError | None, Message], None],
) -> Callable[[int], Callable[[KafkaError | None, Message], None]]:
    """The type of a publisher's delivery report callbacks: `Delivery(sequence)` is the
    sequence itself, an int, that calls `delivered(sequence, error, message)`.

    librdkafka holds one per record until Kafka answers, so up to a million are alive at
    once. Made by int's constructor in C, it costs a publish less than a slotted object
    with a Python __init__, or a partial (two objects for the garbage collector to count:
    its gen-0 passes, triggered by those survivors, cost a publisher 15-25% of its time;
    docs/performance.md).
    """

    class Delivery(int):
        __slots__ = ()

        def __call__(self, error: KafkaError | None, message: Message) -> None:
            delivered(int(self), error, message)

    return Delivery


def _chain(
    first: Callable[..., None], second: Persisted
) -> Callable[[KafkaError | None, Message], None]:
    def both(error: KafkaError | None, message: Message) -> None:
        if error is None:  # `first` reports failures only (_delivered): skip its calls
            second(None, message)
            return
        first(error, message)
        second(PublishError(error.str()), message)

    return both
