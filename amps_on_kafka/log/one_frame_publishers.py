"""The one-frame publishers of LogPublisher (log/publisher.py): publish_document (the
client's Client.publish on kafka://), publish_encoded and publish_run (the gateway's plain
publishes). Each writes the record publish() writes, with the same headers, key,
partition check and delivery report, in one Python frame or none (the compiled core's
DocumentPublisher, native/src/publish.rs; EncodedRun, native/src/publish_runs.rs), and
hands publish() anything else. They are apart from publish() because they are its copies
for speed: the call layers and per-record objects of the general path cost as much as
produce itself (docs/performance.md); tests/native holds the compiled ones to their twins
here.

A mixin of LogPublisher: it reads the publisher's state, set by LogPublisher.__init__.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import JsonCodec, check_topic
from amps_on_kafka.log.envelope import H_PUBLISHER, H_SEQUENCE, H_SOW_KEY
from amps_on_kafka.log.kafka import PRODUCER_PARTITIONER
from amps_on_kafka.log.keys import KeyExtractor
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.native import core

POLL_EVERY = 500  # serve delivery callbacks every so many produces, not on each

# A topic as LogPublisher.publish_document writes to it: its name, its key extractor and
# the key's field if it is a single top-level one, and the partition count its keyed
# records are checked against (0: no check).
Route = tuple[str, KeyExtractor | None, str | None, int]
# publish_run(events, start, end, delivery, base, produced) -> the first not produced
RunPublisher = Callable[[list[Any], int, int, Callable[[int], Any], int, list[Any]], int]


class OneFramePublishers:
    """publish_document, publish_encoded and publish_run, and the route table they share
    (LogPublisher's attributes and methods, declared here for the type checker)."""

    _routes: dict[str, Route | None]
    _counts: dict[str, tuple[int, float]]  # topic -> (partitions, good until)
    _sequences: Iterator[int]
    _publisher_header: tuple[str, bytes]
    _producer: Producer
    _produce_call: Callable[..., None]
    _delivery: Callable[[int], Callable[[KafkaError | None, Message], None]]
    publish: Callable[..., int]
    publish_encoded: Callable[[str, bytes, int | None, Any], int | None]
    spec: Callable[[str], TopicSpec]
    _partition: Callable[[TopicSpec, str | None], int | None]
    _produce: Callable[..., None]
    _delivered: Callable[[int, KafkaError | None, Message], None]
    _poll: Callable[[float], None]
    _numbered: Any  # the RdProducer publish_document numbers records on, or None
    _shared: bool  # the producer is the gateway's, shared (its pump serves reports)

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
            self._poll,  # a fatal error replaces an own producer (LogPublisher._poll)
            POLL_EVERY,
            self._numbered,
        )

    def _document_twin(self) -> Callable[..., int]:
        """publish_document in one Python frame: it writes the record publish() would,
        with the same headers, key, partition check and delivery report."""
        general, routes, route_of = self.publish, self._routes, self._route
        produce, counts, monotonic = self._produce_call, self._counts, time.monotonic
        dumps, sequences, publisher = orjson.dumps, self._sequences, self._publisher_header
        delivery, poll = self._delivery, self._poll

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
        (native/src/publish_runs.rs, EncodedRun) produces the common case itself and hands
        publish_encoded the rest; `_run_twin` is its twin. On the gateway's compiled
        producer (log/native_producer.py) it is ProducerRun (the same loop, same module),
        whose records are reported as the batch's (base | index) without a callback; a
        publisher's own compiled producer has no batches' handler, so it runs EncodedRun."""
        if core is None:
            return self._run_twin()
        if self._shared and getattr(self._producer, "compiled", False):  # its pump serves batches
            return core.ProducerRun(  # type: ignore[no-any-return]
                self._producer.core,  # type: ignore[attr-defined]
                self.publish_encoded,
                self._routes,
                self._counts,
                time.monotonic,
                self._sequences,
                self._publisher_header[1],
                [H_PUBLISHER, H_SEQUENCE, H_SOW_KEY],
            )
        return core.EncodedRun(  # type: ignore[no-any-return]
            self.publish_encoded,
            self._routes,
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
