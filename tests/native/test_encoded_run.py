"""The compiled run of a gateway read's plain publishes (native/src/publish_runs.rs,
EncodedRun) against its twin (log/one_frame_publishers.py, LogPublisher._run_twin: a loop over
publish_encoded), and the compiled report callbacks of its records (BatchDeliveries)
against theirs (server/writes.py, _batch_delivery).

Two publishers numbered alike produce the same runs — publishes with and without a
sequence (one past 64 bits), payloads whose key is an int, text, empty, a bool or
missing, payloads that are not an object or not JSON, to topics keyed by one field, by
two, unkeyed and placed by another partitioner (not routed) — through a real producer
whose `produce` is watched: each run must stop at the same publish, keep the same
publishes, and hand `produce` the same records (topic, value, key, partition, headers,
the report's number). Reports of batches, in any order, failed or not, of a batch
unknown, must count each batch down alike: the same failures kept (index and reason),
the same batch posted once, by its last report.
"""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.native import core
from amps_on_kafka.server.delivery import DeliveryPump
from amps_on_kafka.server.writes import BATCH_BITS, PublishBatch, _batch_delivery

SPECS = {
    "keyed": (3, {"key": ("/id",)}),
    "composite": (3, {"key": ("/id", "/n")}),
    "unkeyed": (1, {}),
    "placed": (3, {"key": ("/id",), "partitioner": "fnv1a"}),  # not routed
}
ids = st.integers(
    -(2**70), 2**70
)  # past 64 bits too: JSON as a client may send | st.booleans() | st.sampled_from(["", "é", "k"])
payloads = (
    st.builds(lambda i, n: json.dumps({"id": i, "n": n}).encode(), ids, st.integers(0, 3))
    | st.builds(lambda n: json.dumps({"n": n}).encode(), st.integers(0, 3))
    | st.sampled_from([b"[1]", b"not json", b"", b'{"id":1', b'{"id":"\\u00e9"}'])
)
sequences = st.none() | st.integers(0, 2**64 - 1)
runs = st.lists(st.tuples(st.sampled_from(list(SPECS)), sequences, payloads), max_size=8)


class Report(int):
    """A record's report callback, as the session's Delivery: its number."""

    __slots__ = ()

    def __call__(self, error: Any, message: Any) -> None:
        pass


def watched(publisher: LogPublisher, compiled: bool) -> list[tuple]:
    """The records publisher.publish_run hands to produce, each with its report's number;
    they are produced too."""
    produce, seen = publisher._produce_call, []

    def spy(topic, value=None, key=None, partition=-1, callback=None, on_delivery=None,
            timestamp=0, headers=None):  # fmt: skip
        seen.append((topic, value, key, partition, headers, int(callback)))
        produce(topic, value, key, partition, callback=callback, headers=headers)

    publisher._produce_call = spy
    publisher.publish_encoded = publisher._encoded_publisher()
    publisher.publish_run = publisher._run_publisher() if compiled else publisher._run_twin()
    return seen


@pytest.fixture
def publishers(bootstrap, topic_factory):
    topics = {label: topic_factory(n, **spec) for label, (n, spec) in SPECS.items()}
    made = [LogPublisher(bootstrap, "same", first_sequence=7) for _ in range(2)]
    seen = [watched(made[0], compiled=True), watched(made[1], compiled=False)]
    yield topics, made, seen
    for publisher in made:
        publisher.close(30)


def run_all(publisher: LogPublisher, events: list[tuple]) -> list[tuple[int, list]]:
    """Each run from where the last one stopped, as the session takes a read: where it
    stopped and what it kept (a publish it did not take is skipped, as the per-command
    path would take it)."""
    answers, start = [], 0
    while start < len(events):
        produced: list = []
        stop = publisher.publish_run(events, start, len(events), Report, 5 << 32, produced)
        answers.append((stop, produced))
        start = stop + 1
    return answers


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(runs)
@example([("keyed", None, b'{"id":1}'), ("keyed", 2**64 - 1, b'{"id":"k"}')])
@example([("unkeyed", None, b"[1]"), ("unkeyed", 3, b"not json"), ("unkeyed", None, b"{}")])
@example([("composite", None, b'{"id":1,"n":2}'), ("placed", None, b'{"id":1}')])
@example([("keyed", None, b'{"id":true}'), ("keyed", None, b'{"n":1}')])
def test_the_compiled_run_produces_what_its_twin_does(publishers, run):
    topics, (compiled, twin), (compiled_seen, twin_seen) = publishers
    del compiled_seen[:], twin_seen[:]
    events = [(topics[label], sequence, payload) for label, sequence, payload in run]
    assert run_all(compiled, events) == run_all(twin, events)
    assert compiled_seen == twin_seen


def test_a_stale_partition_count_ends_the_run_alike(bootstrap, topic_factory):
    """A keyed topic whose cached count is not the route's: publish_encoded declines it
    (the per-command path checks Kafka), so both runs stop there, numbering nothing."""
    topic = topic_factory(2, key=("/id",))
    made = [LogPublisher(bootstrap, "count", first_sequence=1) for _ in range(2)]
    try:
        seen = [watched(p, compiled) for p, compiled in zip(made, (True, False), strict=True)]
        events = [(topic, None, b'{"id":1}'), (topic, None, b'{"id":2}')]
        for publisher in made:
            assert run_all(publisher, events[:1]) == [(0, [])]  # no count known: declined
            publisher.partition_count(topic)  # read from Kafka, as the session's check does
            assert run_all(publisher, events[:1]) == [(1, [events[0]])]
            publisher._counts[topic] = (3, float("inf"))  # as if Kafka had 3 now
        assert run_all(made[0], events) == run_all(made[1], events) == [(0, []), (1, [])]
        assert seen[0] == seen[1] and len(seen[0]) == 1
    finally:
        for publisher in made:
            publisher.close(30)


class Pump:
    """What a batch's report callbacks use of the DeliveryPump: its failure reasons, and
    its posts, recorded."""

    _timeout = 5.0
    fatal = None  # no fatal error being recovered from
    failure_reason = DeliveryPump.failure_reason

    def __init__(self) -> None:
        self.posted: list[tuple[Any, int]] = []

    def post(self, handler: Any, batch: PublishBatch) -> None:
        self.posted.append((handler, batch.number))


def reported(make: Any, reports: list[tuple[int, int, int | None]]) -> tuple:
    """Three batches of 3 records (one sealed: expected 3), reported in the order given
    ((batch, index, error code)): what each report did, the failures kept, the posts."""
    batches = {n: PublishBatch(n, n, 0, 3) for n in range(3)}
    batches[1].expected = 3
    pump, finish = Pump(), object()
    delivery = make(batches, pump, finish)
    answers = []
    for batch, index, code in reports:
        callback = delivery((batch << BATCH_BITS) | index)
        assert int(callback) == (batch << BATCH_BITS) | index
        error = KafkaError(code) if code is not None else None
        answers.append(callback(error, None))
    failures = {n: b.failures for n, b in batches.items()}
    return answers, failures, [(handler is finish, n) for handler, n in pump.posted]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # batch 3 is none of the session's (answered already)
            st.integers(0, 2**32 - 1),
            st.none() | st.sampled_from([KafkaError._MSG_TIMED_OUT, KafkaError.MSG_SIZE_TOO_LARGE]),
        ),
        max_size=10,
    )
)
@example([(1, 0, None), (1, 1, KafkaError._MSG_TIMED_OUT), (1, 2, None), (1, 3, None)])
def test_compiled_batch_reports_count_down_as_the_twin(reports):
    compiled = reported(
        lambda b, p, f: core.BatchDeliveries(b, p.failure_reason, p.post, f), reports
    )
    assert compiled == reported(_batch_delivery, reports)


def test_a_batch_report_callback_is_not_tracked():
    deliveries = core.BatchDeliveries({}, str, print, None)
    assert not gc.is_tracked(deliveries(1 << BATCH_BITS))
