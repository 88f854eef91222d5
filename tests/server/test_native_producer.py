"""The gateway's compiled producer (log/native_producer.py, native/src/rdkafka_producer.rs)
held to confluent-kafka's, which the gateway uses without it: the same publishes give the
same records in the log and the same answers to the client, its refusals and reports are
confluent-kafka's, and it leaves nothing behind when a gateway stops."""

from __future__ import annotations

import gc
import json
import os
import threading
import weakref
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from hypothesis import HealthCheck, example, given, settings

import amps_on_kafka.server.gateway as gateway_module
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.kafka import client_config, log_producer_config, partitions_of, reader
from amps_on_kafka.log.native_producer import CompiledProducer, native_producer
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.native import core
from amps_on_kafka.protocol.frames import encode_frame, frame_of
from amps_on_kafka.server.delivery import BATCH_NUMBERS, batch_numbers
from tests.native.test_encoded_run import SPECS, run_all, runs
from tests.polling import until
from tests.server.test_publish_batches import flushed, logged_on

pytestmark = pytest.mark.skipif(
    core is None or not hasattr(core, "RdProducer"), reason="needs the compiled core"
)

PRODUCERS = ["compiled", "confluent"]


@pytest.fixture(params=PRODUCERS)
def producer_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Gateways made in the test use the compiled producer, or confluent-kafka's."""
    if request.param == "confluent":
        monkeypatch.setattr(gateway_module, "native_producer", lambda *args: None)
    return str(request.param)


def frames(topic: str, unknown: str) -> bytes:
    """One client's burst: plain publishes (the batch path) among ones the batch can't
    take — not JSON, no key, too large for Kafka, an unknown topic, acks asked, a
    delta_publish — each answered or written as the per-command path does."""
    burst = []
    for s in range(1, 120):
        header: dict[str, Any] = {"c": "publish", "t": topic, "s": s}
        payload = b'{"id": %d, "n": "%s"}' % (s % 17, b"x" * (s % 5))
        if s % 29 == 0:
            payload = b'{"id": 1'
        elif s % 31 == 0:
            payload = b'{"qty": 5}'
        elif s == 50:
            payload = b'{"id": 50, "big": "%s"}' % (b"y" * 1_100_000)
        elif s == 60:
            header["t"] = unknown
        elif s % 23 == 0:
            header["a"] = "processed,persisted"
        elif s % 37 == 0:
            header["c"] = "delta_publish"
        burst.append(encode_frame(header, payload))
    return b"".join(burst)


def answers(replies: list[dict], topic: str) -> list[tuple[Any, ...]]:
    """The replies, the topic's name (which differs between runs) replaced."""
    return sorted(
        (r.get("s"), r.get("a"), r.get("status"), str(r.get("reason")).replace(topic, "T"))
        for r in replies
    )


def records(bootstrap: str, topic: str) -> list[tuple[Any, ...]]:
    """Every record of `topic` as Kafka holds it: partition, key, value, headers."""
    consumer = reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions_of(consumer, topic)])
        read = []
        while batch := consumer.consume(1000, 2.0):
            read += [(m.partition(), m.key(), m.value(), m.headers()) for m in batch]
    finally:
        consumer.close()
    return sorted(read, key=lambda r: (r[0], dict(r[3])["s"]))


def test_the_same_publishes_give_the_same_records_and_answers(
    bootstrap: str, topic_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = {}
    for kind in PRODUCERS:
        if kind == "confluent":
            monkeypatch.setattr(gateway_module, "native_producer", lambda *args: None)
        topic = topic_factory(8, key=("/id",))
        with logged_on(bootstrap, "same-records", GatewayConfig()) as (gateway, wire):
            assert isinstance(gateway.producer, CompiledProducer) == (kind == "compiled")
            wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 0}, b'{"id": 0}'))
            assert flushed(wire, "known") == []  # the topic known: the batch path from here
            wire.send_raw(frames(topic, f"{topic}-unknown"))
            replies = flushed(wire, "after")
        seen[kind] = (answers(replies, topic), records(bootstrap, topic))
    assert seen["compiled"] == seen["confluent"]
    replies, written = seen["compiled"]
    assert {r[0] for r in replies} >= {29, 31, 50, 60, 23}  # each refusal answered
    assert len({r[0] for r in written}) > 1  # the keys spread over the partitions
    sequences = {int(dict(r[3])["s"]) for r in written}
    assert 1 in sequences and not sequences & {29, 31, 50, 60}


def test_a_gateway_stopped_with_publishes_in_flight_writes_them_all(
    bootstrap: str, topic_factory, producer_kind: str
) -> None:
    """Gateway.stop flushes the producer: every publish the gateway took is in the log,
    though the client never flushed."""
    topic = topic_factory(2)
    burst = [encode_frame({"c": "publish", "t": topic, "s": s}, b"{}") for s in range(1, 3001)]
    last = encode_frame({"c": "publish", "t": topic, "s": 3001, "a": "processed"}, b"{}")
    with logged_on(bootstrap, "stopped", GatewayConfig()) as (_, wire):
        wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 0}, b'{"id": 0}'))
        assert flushed(wire, "known") == []
        wire.send_raw(b"".join([*burst, last]))  # the processed ack: all of it produced
        wire.until(lambda f: f.header.get("s") == 3001 and f.header.get("a") == "processed")
    written = sorted(int(dict(r[3])["s"]) for r in records(bootstrap, topic))
    assert written == list(range(3002))


def test_gateways_started_and_stopped_leave_no_threads(
    bootstrap: str, topic_factory, producer_kind: str
) -> None:
    topic = topic_factory(1)

    def tasks() -> int:
        gc.collect()  # a client left in a reference cycle goes with its threads
        return len(os.listdir("/proc/self/task"))

    def served(name: str) -> None:
        with logged_on(bootstrap, name, GatewayConfig()) as (_, wire):
            wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 1}, b'{"id": 1}'))
            assert flushed(wire, "one") == []

    served("warm")  # the threads that live for good (uvloop's workers) start here
    before = tasks()
    for round_ in range(5):
        served(f"leak-{round_}")
    until(lambda: tasks() <= before)  # librdkafka's threads of every handle gone


def producers(**overrides: Any) -> tuple[CompiledProducer, Producer]:
    config = log_producer_config("127.0.0.1:1", **overrides)
    compiled = native_producer(config, client_config("127.0.0.1:1"))
    assert compiled is not None
    return compiled, Producer(config)


def test_a_producer_that_reports_only_failures_is_left_to_confluent_kafka() -> None:
    """With delivery.report.only.error a success is never reported, so a record's Python
    callback would never be freed: such settings keep confluent-kafka's producer."""
    for setting in (True, "true", "T", "1", 1, "bogus"):  # librdkafka reads "t" as true
        config = log_producer_config("127.0.0.1:1", **{"delivery.report.only.error": setting})
        assert native_producer(config, client_config("127.0.0.1:1")) is None
    compiled = native_producer(log_producer_config("127.0.0.1:1"), client_config("127.0.0.1:1"))
    assert compiled is not None  # (not its truth: len() of one with nothing queued is 0)
    compiled.close()


def refusal(produce: Any, *args: Any) -> tuple[type, str, int | None]:
    try:
        produce(*args)
    except KafkaException as exc:
        return KafkaException, exc.args[0].str(), exc.args[0].code()
    except BufferError as exc:
        return BufferError, str(exc), None
    raise AssertionError("not refused")


def test_its_refusals_and_failure_reports_are_confluent_kafkas() -> None:
    """Against no broker: a full queue, a record too large, and a report of a record
    Kafka never took, as confluent-kafka's producer gives them."""
    settings = {"queue.buffering.max.messages": 1, "message.timeout.ms": 300}
    compiled, confluent = producers(**settings)
    try:
        for producer in (compiled, confluent):
            producer.produce("t", b"first")
        full = [refusal(p.produce, "t", b"second") for p in (compiled, confluent)]
        assert full[0] == full[1] and full[0][0] is BufferError
        large = [refusal(p.produce, "t", b"x" * 2_000_000) for p in (compiled, confluent)]
        assert large[0] == large[1] and large[0][2] == KafkaError.MSG_SIZE_TOO_LARGE
        reports: dict[str, list[tuple[Any, ...]]] = {"compiled": [], "confluent": []}
        for name, producer in (("compiled", compiled), ("confluent", confluent)):
            producer.flush(5)
            producer.produce(
                "t",
                b"v",
                b"k",
                on_delivery=lambda e, m, seen=reports[name]: seen.append(
                    (e.code(), e.str(), m.topic(), m.partition(), m.offset())
                ),
                headers=[("p", b"me"), ("s", None)],
            )
            # librdkafka times a record out by a scan once a second: a loaded host (a
            # clean CI run) left one after a single flush(5)
            until(lambda p=producer: p.flush(1) == 0, f"{name}'s record reported", 30)
        assert reports["compiled"] == reports["confluent"]
        assert reports["compiled"][0][0] == KafkaError._MSG_TIMED_OUT
    finally:
        compiled.close()
    with pytest.raises(RuntimeError, match="closed"):
        compiled.produce("t", b"after")
    assert len(compiled) == 0 and compiled.poll(0) == 0


@pytest.fixture
def run_publishers(bootstrap, topic_factory):
    """A publisher on the compiled producer (publish_run is ProducerRun) and its twin's
    (publish_run is the loop over publish_encoded), numbering alike."""
    topics = {label: topic_factory(n, **spec) for label, (n, spec) in SPECS.items()}
    compiled = native_producer(log_producer_config(bootstrap), client_config(bootstrap))
    assert compiled is not None
    made = [
        LogPublisher(bootstrap, "same", first_sequence=7, producer=compiled),  # type: ignore[arg-type]
        LogPublisher(bootstrap, "same", first_sequence=7),
    ]
    made[1].publish_run = made[1]._run_twin()
    yield topics, made
    made[1].close(30)
    assert compiled.flush(30) == 0
    compiled.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(runs)
@example([("keyed", None, b'{"id":1}'), ("keyed", 2**64 - 1, b'{"id":"k"}')])
@example([("unkeyed", None, b"[1]"), ("unkeyed", 3, b"not json"), ("unkeyed", None, b"{}")])
@example([("composite", None, b'{"id":1,"n":2}'), ("keyed", 2**70, b'{"id":1}')])
def test_the_compiled_producers_run_takes_what_its_twin_takes(run_publishers, run):
    """Where each run stops and what it produced (the rest the per-command path takes)."""
    topics, (compiled, twin) = run_publishers
    events = [(topics[label], sequence, payload) for label, sequence, payload in run]
    assert run_all(compiled, events) == run_all(twin, events)


def test_batch_numbers_past_31_bits_are_still_answered(
    bootstrap: str, topic_factory, producer_kind: str
) -> None:
    """A compiled record's report carries its batch's number in 31 bits (its opaque is
    (batch << 32 | index) << 1 | 1): the gateway's batch numbers wrap before that, so a
    gateway that has written 2^31 batches (a day or two of one-publish reads) still
    finds each report's batch. They ran past it, and the pump died on a KeyError."""
    topic = topic_factory(1)
    with logged_on(bootstrap, "wrapped", GatewayConfig()) as (gateway, wire):
        wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 0}, b"{}"))
        assert flushed(wire, "known") == []
        gateway.pump.batch_numbers = batch_numbers(BATCH_NUMBERS - 2)  # the wrap's last two
        for s in range(1, 6):  # one batch a read: each its own number, across the wrap
            wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": s}, b"{}"))
            assert flushed(wire, f"after-{s}") == []
    written = sorted(int(dict(r[3])["s"]) for r in records(bootstrap, topic))
    assert written == list(range(6))


def test_the_pump_serves_on_after_a_report_handler_raised(
    bootstrap: str, topic_factory, producer_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in handling one poll's reports is logged, and the pump serves the next
    polls: it died, and every later publish waited for an answer for good."""
    topic = topic_factory(1)
    with logged_on(bootstrap, "pump-raised", GatewayConfig()) as (gateway, wire):
        post, raised = gateway.pump.post, []

        def post_then_raise(handler: Any, argument: Any) -> None:
            post(handler, argument)
            if not raised:
                raised.append(True)
                raise RuntimeError("a handler's bug")

        gateway.pump.post = post_then_raise  # type: ignore[method-assign]
        for s in range(1, 4):
            wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": s}, b"{}"))
            assert flushed(wire, f"after-{s}") == []
    assert raised and "a handler's bug" in caplog.text


def test_closing_with_records_in_flight_frees_their_callbacks() -> None:
    """librdkafka's destroy drops the records it still holds without a report: close
    purges them first, so each record's callback (the gateway's holds its session) is
    freed, not kept for good."""
    compiled, _ = producers()

    class Callback:
        def __call__(self, error: Any, message: Any) -> None:
            raise AssertionError("a purged record's callback is freed, not called")

    callbacks = [Callback() for _ in range(50)]
    for callback in callbacks:
        compiled.produce("t", b"v", on_delivery=callback)
    alive = [weakref.ref(callback) for callback in callbacks]
    del callbacks, callback
    assert len(compiled) >= 50  # librdkafka counts an event it queued too
    compiled.close()
    gc.collect()
    assert [ref for ref in alive if ref() is not None] == []


def test_close_waits_for_the_polls_under_way_and_ends_the_next() -> None:
    """A poll or flush waits in librdkafka without the GIL: close waits for it instead of
    destroying the handle under it, and what comes after close touches nothing."""
    compiled, _ = producers()
    compiled.produce("t", b"v")
    started, results = threading.Barrier(3), []

    def poll() -> None:
        started.wait()
        results.append(compiled.poll(0.5))
        results.append(compiled.flush(0.5))

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for thread in threads:
        thread.start()
    started.wait()
    compiled.close()
    for thread in threads:
        thread.join()
    assert compiled.poll(0) == 0 and compiled.flush(1) == 0 and len(compiled) == 0
    assert len(results) == 4
    with pytest.raises(RuntimeError, match="closed"):
        compiled.produce("t", b"after")


def test_hostile_publishes_are_each_answered_and_the_session_serves_on(
    bootstrap: str, topic_factory, producer_kind: str
) -> None:
    """Sequence numbers of every wrong kind, a key holding a NUL, a lone surrogate, a
    key that is an object, a topic name holding a NUL (librdkafka's C string raised
    ValueError, and the session was closed as if the gateway had a bug): each refused
    with its reason or written, the budget empty after, the next publish written."""
    topic = topic_factory(2, key=("/id",))
    bad_sequences = [-1, 1.5, "5", 2**70, True, [1], 2**64]
    burst = [
        frame_of(json.dumps({"c": "publish", "t": topic, "s": s}).encode(), b'{"id": "k"}')
        for s in bad_sequences
    ]
    burst += [
        encode_frame({"c": "publish", "t": topic, "s": 1}, b'{"id": "k\\u0000z"}'),
        encode_frame({"c": "publish", "t": topic, "s": 2}, b'{"id": "\\ud800"}'),
        encode_frame({"c": "publish", "t": topic, "s": 3}, b'{"id": {"a": 1}}'),
        encode_frame({"c": "publish", "t": f"{topic}\x00x", "s": 4}, b'{"id": 1}'),
    ]
    with logged_on(bootstrap, "hostile", GatewayConfig()) as (gateway, wire):
        wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 0}, b'{"id": 0}'))
        assert flushed(wire, "known") == []
        wire.send_raw(b"".join(burst))
        refused = {json.dumps(r["s"]): r["reason"] for r in flushed(wire, "after")}
        assert gateway.budget.commands == 0
        wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 5}, b'{"id": 5}'))
        assert flushed(wire, "again") == []
    assert len(refused) == len(bad_sequences) + 2
    assert "not valid JSON" in refused["2"] and "holds no NUL" in refused["4"]
    written = {int(dict(r[3])["s"]): r[1] for r in records(bootstrap, topic)}
    assert written == {0: b"0", 1: b"k\x00z", 3: b'{"a":1}', 5: b"5"}


def test_a_run_that_raises_frees_its_budget_share(
    bootstrap: str, topic_factory, producer_kind: str
) -> None:
    """A bug raising inside a read's run (here the report callback a record the run
    hands on asks for) closes that connection, as any bug does; the records it produced
    still finish their batch and the rest's share is freed. The batch was never sealed:
    its share of the worker's PublishBudget was held for good."""
    topic = topic_factory(1, key=("/id",))
    with logged_on(bootstrap, "run-raised", GatewayConfig()) as (gateway, wire):
        wire.send_raw(encode_frame({"c": "publish", "t": topic, "s": 0}, b'{"id": 0}'))
        assert flushed(wire, "known") == []
        (session,) = gateway._sessions

        def raising(number: int) -> Any:
            raise RuntimeError("a bug in a run")

        session.writes.delivery = raising  # asked for by a record the run hands on
        burst = [b'{"id": 1}', b'{"id": 2}', b'{"no key": 3}', b'{"id": 4}']
        wire.send_raw(
            b"".join(
                encode_frame({"c": "publish", "t": topic, "s": s}, payload)
                for s, payload in enumerate(burst, 1)
            )
        )
        until(lambda: not gateway._sessions)  # the bug closed the connection
        until(lambda: gateway.budget.commands == 0)
    written = sorted(int(dict(r[3])["s"]) for r in records(bootstrap, topic))
    assert written == ([0, 1, 2] if producer_kind == "compiled" else [0])  # (each asks it)
