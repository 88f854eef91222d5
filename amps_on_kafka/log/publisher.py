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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from amps_on_kafka.errors import MessageError, PublishError
from amps_on_kafka.log.codecs import JsonCodec, check_topic, encode_payload
from amps_on_kafka.log.envelope import (
    H_PUBLISHER,
    H_SEQUENCE,
    H_SOW_KEY,
    Command,
    Envelope,
    check_expiration,
    command_headers,
)
from amps_on_kafka.log.kafka import PRODUCER_PARTITIONER, log_producer, partitions_of
from amps_on_kafka.log.keys import KeyExtractor, partition_for
from amps_on_kafka.log.registry import TopicRegistry, TopicSpec
from amps_on_kafka.log.topics import H_TARGET_PARTITION, repartition_topic
from amps_on_kafka.native import core

POLL_EVERY = 500  # serve delivery callbacks every so many produces, not on each
# Kafka's partition count of a topic is read again after this long, as often as the
# producer refreshes its own metadata (log/kafka.py): a topic given more partitions is
# noticed, and its keyed publishes refused, within that time.
PARTITION_COUNT_TTL = 30.0

Persisted = Callable[[PublishError | None, Message], None]
# A topic as LogPublisher.publish_document writes to it: its name, its key extractor and
# the key's field if it is a single top-level one, and the partition count its keyed
# records are checked against (0: no check).
Route = tuple[str, KeyExtractor | None, str | None, int]
# publish_run(events, start, end, delivery, base, produced) -> the first not produced
RunPublisher = Callable[[list[Any], int, int, Callable[[int], Any], int, list[Any]], int]


@dataclass(frozen=True)
class FailedWrite:
    """A command Kafka refused or never acknowledged."""

    topic: str
    sequence: int | None
    reason: str


class LogPublisher:
    """Encodes commands as log records and produces them with persisted acks."""

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
        config = {"delivery.report.only.error": not report_successes, **(producer_config or {})}
        self._shared = producer is not None
        self._producer = producer if producer is not None else log_producer(bootstrap, **config)
        self._produce_call = self._producer.produce  # bound once, not per record
        self._closed = False
        self._delivery = _delivery_type(self._delivered)
        self._routes: dict[str, Route | None] = {}
        self.publish_document = self._document_publisher()
        self.publish_encoded = self._encoded_publisher()
        self.publish_run = self._run_publisher()

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

    def _document_publisher(self) -> Callable[..., int]:
        """`publish(topic, data, expiration=None, **kw)` with no Python frame for the
        common case — a dict published to a JSON topic whose SOW key (if any) is placed by
        the producer's own partitioner, with no expiration and no options — and through
        publish() for anything else (docs/performance.md: the call layers and per-record
        objects of the general path cost as much as produce itself). The compiled core's
        DocumentPublisher (native/src/publish.rs) when it is loaded, else its twin."""
        if core is None:
            return self._document_twin()
        return core.DocumentPublisher(  # type: ignore[no-any-return]
            self.publish,
            self._routes,
            self._route,
            check_topic,
            orjson.dumps,
            self._sequences,
            self._publisher_header,
            H_SEQUENCE,
            H_SOW_KEY,
            self._counts,
            time.monotonic,
            self._recheck_partition,
            self._produce_call,
            (BufferError, KafkaException),
            self._produce,
            self._delivered,
            self._producer.poll,
            POLL_EVERY,
        )

    def _document_twin(self) -> Callable[..., int]:
        """publish_document in one Python frame: it writes the record publish() would,
        with the same headers, key, partition check and delivery report."""
        general, routes, route_of = self.publish, self._routes, self._route
        produce, counts, monotonic = self._produce_call, self._counts, time.monotonic
        dumps, sequences, publisher = orjson.dumps, self._sequences, self._publisher_header
        delivery, poll = self._delivery, self._producer.poll

        def publish(topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
            try:  # free unless it raises (3.11's zero-cost try)
                route = routes[topic] if topic in routes else route_of(topic)
            except TypeError:  # an unhashable topic (a list): named as any wrong type is
                check_topic(topic)
                raise
            if route is None or kw or expiration is not None or type(data) is not dict:
                return general(topic, data, expiration, **kw)
            name, extract, field, partitions = route
            try:
                value = dumps(data)
            except TypeError:
                return general(topic, data)  # raises the codec's MessageError
            if extract is None:
                key = None
                sequence = next(sequences)  # numbered once valid, as publish() does
                headers = [publisher, (H_SEQUENCE, b"%d" % sequence)]
            else:
                known = data.get(field) if field is not None else None
                if type(known) is int:  # an int or a text read here; the rest by `extract`
                    key = str(known)
                elif type(known) is str and known:
                    key = known
                else:
                    key = extract(data)
                sequence = next(sequences)
                headers = [publisher, (H_SEQUENCE, b"%d" % sequence), (H_SOW_KEY, key.encode())]
                if partitions:  # the count Kafka has, refreshed as _partition does
                    cached = counts.get(name)
                    if cached is None or cached[1] <= monotonic() or cached[0] != partitions:
                        self._recheck_partition(topic, key)  # refused if it changed
            try:  # by position: partition -1, timestamp 0 are its defaults (keywords cost more)
                produce(name, value, key, -1, delivery(sequence), None, 0, headers)
            except (BufferError, KafkaException):  # full, or refused: the general handling
                self._produce(name, key, value, headers, sequence, None)
                return sequence
            if not sequence % POLL_EVERY:
                poll(0)
            return sequence

        return publish

    def _encoded_publisher(self) -> Callable[[str, bytes, int | None, Any], int | None]:
        """`publish(topic, payload, sequence, on_delivery)` of a JSON payload already
        encoded (the gateway's plain publishes), forwarded untouched, in one Python frame:
        the record publish() writes for it, reported to `on_delivery(error, message)` as
        Kafka gives it. None, having produced nothing, when publish() must take it: a
        topic publish_document would not route, a payload that is not valid JSON or has
        no key, a partition count to check, a producer queue full or a refusal — publish()
        then raises the error it always has. The key is read as publish_document reads it.
        It never polls: the producer is a shared one, whose owner serves the reports."""
        routes, route_of, counts = self._routes, self._route, self._counts
        monotonic = time.monotonic
        loads, produce, sequences = orjson.loads, self._produce_call, self._sequences
        publisher, key_of = self._publisher_header, PAYLOAD_KEY

        def publish(
            topic: str, payload: bytes, sequence: int | None, on_delivery: Any
        ) -> int | None:
            route = routes[topic] if topic in routes else route_of(topic)
            if route is None:
                return None
            name, extract, field, partitions = route
            key = key_of(payload, field) if extract is None or field else False
            if key is False:  # not JSON, or a key `extract` reads: decoded here
                try:
                    document = loads(payload)
                except orjson.JSONDecodeError:
                    return None
                try:
                    key = extract(document) if extract is not None else None
                except MessageError:
                    return None
            if partitions:  # keyed: the count Kafka has, refreshed as _partition does
                cached = counts.get(name)
                if cached is None or cached[1] <= monotonic() or cached[0] != partitions:
                    return None
            if sequence is None:
                sequence = next(sequences)
            headers = [publisher, (H_SEQUENCE, b"%d" % sequence)]
            if key is not None:
                headers.append((H_SOW_KEY, key.encode()))
            try:  # by position: partition -1, timestamp 0 are its defaults (keywords cost more)
                produce(name, payload, key, -1, on_delivery, None, 0, headers)
            except (BufferError, KafkaException):
                return None
            return sequence

        return publish

    def _run_publisher(self) -> RunPublisher:
        """publish_run: `run(events, start, end, delivery, base, produced)` produces the
        plain publishes `events[start:end]` ((topic, s, payload) tuples, a gateway read's
        run) in order with publish_encoded, each reported to `delivery(base | index)`, its
        index in `produced`, where each one produced is appended; it returns the index of
        the first publish_encoded did not take (`end` when it took all). The compiled one
        (native/src/publish.rs, EncodedRun) produces the common case itself and hands
        publish_encoded the rest; `_run_twin` is its twin."""
        if core is None:
            return self._run_twin()
        return core.EncodedRun(  # type: ignore[no-any-return]
            self.publish_encoded,
            self._routes,
            PAYLOAD_KEY,
            self._counts,
            time.monotonic,
            self._sequences,
            self._publisher_header,
            H_SEQUENCE,
            H_SOW_KEY,
            self._produce_call,
            (BufferError, KafkaException),
        )

    def _run_twin(self) -> RunPublisher:
        """publish_run as a Python loop over publish_encoded."""
        publish = self.publish_encoded

        def run(
            events: list[Any],
            start: int,
            end: int,
            delivery: Callable[[int], Any],
            base: int,
            produced: list[Any],
        ) -> int:
            position = start
            while position < end:
                event = events[position]
                if publish(event[0], event[2], event[1], delivery(base | len(produced))) is None:
                    break
                produced.append(event)
                position += 1
            return position

        return run

    def _recheck_partition(self, topic: str, key: str) -> None:
        """The partition check of publish() for a keyed publish_document whose cached
        partition count is missing, expired or changed: refused if Kafka's count changed."""
        self._partition(self.spec(topic), key)

    def routed(self, topic: str) -> bool:
        """Whether publish_document and publish_encoded write `topic`'s publishes
        themselves (else they hand every one to publish())."""
        route = self._routes[topic] if topic in self._routes else self._route(topic)
        return route is not None

    def _route(self, topic: str) -> Route | None:
        """What publish_document needs of a topic (a Route), or None when its publishes
        take the general path."""
        spec = self.spec(topic)
        extract = spec.key_extractor
        keyed = extract is not None and not spec.repartition
        field = extract.single_field if extract is not None else None
        route: Route | None = (spec.name, extract, field, spec.partitions if keyed else 0)
        if (
            type(spec.codec) is not JsonCodec
            or (extract is None and spec.key_from_publish)
            or (keyed and spec.partitioner != PRODUCER_PARTITIONER)
        ):
            route = None
        self._routes[topic] = route
        return route

    def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        keys: Iterable[str] | None = None,
        data: Any = None,
        correlation_id: str | None = None,
        on_persisted: Persisted | None = None,
        sequence: int | None = None,
    ) -> list[int]:
        """Produce a sow_delete by filter, by SOW keys or by data (exactly one of them).

        The records go where the state lives: a delete by filter to every partition, a
        delete by keys one record per key, routed by the key like the publishes it
        deletes. Returns the sequence of every record written: with an explicit
        `sequence` (a republish), the records are numbered from it, one apart.
        """
        check_delete_target(filter, keys, data)
        spec = self.spec(topic)
        common = {"correlation_id": correlation_id, "message_type": spec.message_type}
        numbers = self._sequences if sequence is None else itertools.count(sequence)
        if filter is not None:
            return [
                self._delete_record(
                    topic,
                    None,
                    None,
                    Envelope(filter=filter, sequence=next(numbers), **common),
                    on_persisted,
                    partition,
                    extra,
                )
                for partition, extra in self._fan_out(spec)
            ]
        if keys is not None:
            return [
                self._delete_record(
                    topic,
                    key,
                    None,
                    Envelope(sow_keys=(key,), sequence=next(numbers), **common),
                    on_persisted,
                    self._partition(spec, key),
                )
                for key in (str(k) for k in keys)
            ]
        value, document = encode_payload(spec.codec, data)
        key = self._sow_key(spec, document, None)
        return [
            self._delete_record(
                topic,
                key,
                value,
                Envelope(sow_key=key, sequence=next(numbers), **common),
                on_persisted,
                self._partition(spec, key),
            )
        ]

    def _delete_record(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        envelope: Envelope,
        on_persisted: Persisted | None,
        partition: int | None = None,
        extra: list[tuple[str, bytes]] | None = None,
    ) -> int:
        stamped = replace(envelope, command=Command.SOW_DELETE, publisher_id=self.publisher_id)
        sequence: int = stamped.sequence  # type: ignore[assignment]
        headers = stamped.to_headers() + (extra or [])
        self._produce(topic, key, value, headers, sequence, on_persisted, partition)
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

    def _fan_out(self, spec: TopicSpec) -> list[tuple[int | None, list[tuple[str, bytes]]]]:
        """(partition, extra headers) of each record of a delete by filter: one per
        partition that holds state. That is every partition Kafka has now, or, on a
        repartitioned topic, every partition of its internal topic: each record names
        its own (header `rp`) for the repartitioner, so the gateway's processed ack
        still counts one result per record written."""
        if not spec.repartition:
            return [(p, []) for p in range(self.partition_count(spec.name))]
        count = self.partition_count(repartition_topic(spec.name))
        return [(None, [(H_TARGET_PARTITION, str(p).encode())]) for p in range(count)]

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
                self._producer.poll(0.05)  # the local queue is full: let deliveries drain
            except KafkaException as exc:  # refused before sending, e.g. too large
                raise PublishError(
                    f"Kafka refused a publish to {topic!r}: {exc.args[0].str()}"
                ) from exc
        if self._shared:  # its owner serves the reports (the gateway's DeliveryPump)
            return
        self._unpolled += 1
        if self._unpolled >= POLL_EVERY:
            self._unpolled = 0
            self._producer.poll(0)

    def _delivered(self, sequence: int, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        failure = FailedWrite(message.topic(), sequence, error.str())
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
        self._producer.poll(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged everything; raise on failures or a timeout."""
        remaining = self._producer.flush(-1 if timeout is None else timeout)
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            first = failures[0]
            raise PublishError(
                f"{len(failures)} publish(es) not persisted; first: topic {first.topic!r} "
                f"sequence {first.sequence}: {first.reason}"
            )
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
        self._producer.close()


def payload_key(payload: bytes, field: str | None) -> str | Literal[False] | None:
    """The SOW key of a JSON payload whose key is its top-level `field`, read as
    publish_document reads it (an int's digits, or non-empty text), or, with no `field`,
    None for any JSON; False when the caller must decode it (not JSON, or another value).
    The compiled core's publish_key answers the same, or False where it is not sure."""
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    if field is None:
        return None
    known = document.get(field) if type(document) is dict else None
    if type(known) is int:
        return str(known)
    return known if type(known) is str and known else False


PAYLOAD_KEY = core.publish_key if core is not None else payload_key


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


def check_delete_target(filter: str | None, keys: Iterable[str] | None, data: Any) -> None:
    """A sow_delete deletes by exactly one of filter, keys or data: MessageError if not.
    The client checks before it sends, so both transports refuse alike."""
    given = [
        name for name, v in (("filter", filter), ("keys", keys), ("data", data)) if v is not None
    ]
    if len(given) != 1:
        raise MessageError(
            f"sow_delete takes exactly one of filter, keys or data (got {given or 'none'})"
        )
    if isinstance(keys, str | bytes):  # its characters would each be a key to delete
        raise MessageError(
            f"sow_delete keys= takes a list of keys, not a string: keys=[{keys!r}] "
            f"deletes that one key"
        )
