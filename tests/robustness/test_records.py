"""Issue 13: any record on the log, written straight to Kafka as any producer may.

Hypothesis makes batches of records, valid ones and ones spoiled in one way each (a
garbage value under every envelope header name, expirations of inf, nan or 1e308, bad
command names, bad SOW key lists, bad filters on deletes, payloads that are not JSON or
have no key, keys in the wrong partition), plus header names no one knows and headers
without a value. One worker reads each batch from a SOW topic, and its queue engine
from a queue topic holding the same records. Neither may fail; the worker refuses
exactly the spoiled records, each dead-lettered with its reason and source, and its
SOW is the fold of the valid ones; the queue takes exactly the records that are
messages and skips, counting them, those whose command or expiration is unreadable.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer, TopicPartition
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from amps_on_kafka.config import Config
from amps_on_kafka.log.envelope import (
    H_COMMAND,
    H_CORRELATION,
    H_EXPIRATION,
    H_FILTER,
    H_MESSAGE_TYPE,
    H_PUBLISHER,
    H_SEQUENCE,
    H_SOW_KEY,
    H_SOW_KEYS,
    H_TOPIC,
    MAX_EXPIRATION,
)
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.log.keys import partition_for
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.log.topics import repartition_topic
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.state.queue_store import decode_entry, encode_entry
from amps_on_kafka.state.queue_types import QueueEntry
from amps_on_kafka.state.sow import Applied, DictState
from tests.conftest import delete_topics
from tests.sow.conftest import wait_caught_up
from tests.sow.test_worker import sow_of

PARTITIONS = 2
KEYS = [str(i) for i in range(10)]
ENVELOPE = (
    H_COMMAND,
    H_TOPIC,
    H_SOW_KEY,
    H_EXPIRATION,
    H_PUBLISHER,
    H_SEQUENCE,
    H_CORRELATION,
    H_MESSAGE_TYPE,
    H_FILTER,
    H_SOW_KEYS,
)
TEXT_HEADERS = (H_TOPIC, H_SOW_KEY, H_PUBLISHER, H_CORRELATION, H_MESSAGE_TYPE, H_FILTER)
KINDS_WITH_DATA = ("publish", "delta", "delete_data")


@dataclass
class Made:
    """A generated record, what it is meant to do, and where it goes."""

    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    kind: str
    key: str | None  # None for a delete by filter
    effect: tuple  # for a valid record: what the fold does with it
    partition: int
    valid: bool = True


def home(key: str) -> int:
    return partition_for(key.encode(), PARTITIONS)


noise = st.lists(
    st.tuples(
        st.text(max_size=4).filter(lambda name: name not in ENVELOPE),
        st.none() | st.binary(max_size=12),
    ),
    max_size=2,
)
# Envelope headers that do not change what a valid record does: text the worker does not
# act on, any sequence number, and any envelope name without a value.
harmless = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from((H_PUBLISHER, H_CORRELATION, H_TOPIC, H_MESSAGE_TYPE, H_SOW_KEY)),
            st.text(max_size=8).map(str.encode),
        ),
        st.tuples(st.just(H_SEQUENCE), st.integers(0, 2**64).map(lambda n: b"%d" % n)),
        st.tuples(st.sampled_from(ENVELOPE), st.none()),
    ),
    max_size=3,
)
fields = st.dictionaries(
    st.sampled_from(("a", "b")), st.none() | st.integers(-9, 9) | st.text(max_size=4), max_size=2
)


@st.composite
def valid_record(draw) -> Made:
    key = draw(st.sampled_from(KEYS))
    key_value = draw(st.sampled_from((key, int(key))))  # a key field is compared as text
    kind = draw(st.sampled_from((*KINDS_WITH_DATA, "delete_keys", "delete_filter")))
    headers = draw(harmless) + draw(noise)
    value: bytes | None = None
    if kind == "publish":
        doc = {"id": key_value, "v": draw(st.integers(0, 9)), **draw(fields)}
        value, effect = orjson.dumps(doc), ("put", key, doc)
        headers += draw(st.sampled_from(([], [(H_COMMAND, b"publish")])))
        expiration = draw(st.sampled_from((None, b"0", b"3600", b"86400.5", b"1e6")))
        headers += [] if expiration is None else [(H_EXPIRATION, expiration)]
    elif kind == "delta":
        doc = {"id": key_value, "d": draw(st.integers(0, 9)), **draw(fields)}
        value, effect = orjson.dumps(doc), ("delta", key, doc)
        headers.append((H_COMMAND, b"delta_publish"))
    elif kind == "delete_data":
        value, effect = orjson.dumps({"id": key_value}), ("delete", key)
        headers.append((H_COMMAND, b"sow_delete"))
    elif kind == "delete_keys":
        effect = ("delete", key)
        headers += [(H_COMMAND, b"sow_delete"), (H_SOW_KEYS, orjson.dumps([key]))]
    else:
        bound = draw(st.integers(0, 9))
        effect = ("filter", bound)
        headers += [(H_COMMAND, b"sow_delete"), (H_FILTER, b"/v > %d" % bound)]
        key = None
    headers = list(draw(st.permutations(headers)))
    partition = home(key) if key is not None else draw(st.integers(0, PARTITIONS - 1))
    return Made(value, headers, kind, key, effect, partition)


bad_headers = st.one_of(
    st.tuples(
        st.just(H_COMMAND),
        st.text(max_size=8)
        .filter(lambda c: c not in ("publish", "delta_publish", "sow_delete"))
        .map(str.encode),
    ),
    st.tuples(
        st.just(H_EXPIRATION),
        st.sampled_from((b"inf", b"-inf", b"nan", b"1e17", b"1e308", b"-1", b"abc", b"", b"\xff"))
        | st.floats(min_value=MAX_EXPIRATION * 1.01, allow_infinity=True).map(
            lambda f: repr(f).encode()
        ),
    ),
    st.tuples(
        st.just(H_SOW_KEYS),
        st.sampled_from((b"{", b'"a"', b"[1]", b'{"a": 1}', b"[null]", b"\xff", b"")),
    ),
    st.tuples(st.just(H_SEQUENCE), st.sampled_from((b"x", b"1.5", b"", b"\xff", b"-"))),
    st.tuples(st.sampled_from(TEXT_HEADERS), st.binary(max_size=6).map(lambda b: b"\xff" + b)),
)
keyless = st.sampled_from(
    (b'{"v": 1}', b'{"id": null}', b'{"id": ""}', b"[1, 2]", b"5", b'"text"', b"null")
)
bad_filters = st.sampled_from((b"/id = '", b"(((", b"/v >> 1", b"", b"/v > "))


@st.composite
def spoiled_record(draw) -> Made:
    """A valid record spoiled in one way that makes it invalid whatever else it carries."""
    made = draw(valid_record())
    defects = ["header"]
    if made.kind in KINDS_WITH_DATA:
        defects += ["payload", "keyless"]
    if made.key is not None:
        defects.append("misplaced")
    else:
        defects.append("filter")
    defect = draw(st.sampled_from(defects))
    if defect == "header":
        at = draw(st.integers(0, len(made.headers)))
        made.headers.insert(at, draw(bad_headers))
    elif defect == "payload":
        made.value = b"\xff" + draw(st.binary(max_size=20))  # never UTF-8, so never JSON
    elif defect == "keyless":
        made.value = draw(keyless)
    elif defect == "misplaced":
        made.partition = 1 - made.partition
    else:
        made.headers = [h for h in made.headers if h[0] != H_FILTER] + [
            (H_FILTER, draw(bad_filters))
        ]
    made.valid, made.effect = False, ()
    return made


# Records of any bytes, whose validity nobody decided: for these the worker must agree
# with its own rules applied one record at a time (reference_of), whatever they are.
interesting = st.sampled_from(
    (b"inf", b"nan", b"1e308", b"publish", b"sow_delete", b"delta_publish", b'["1"]', b"/v > 1")
)
chaos_record = st.builds(
    Made,
    value=st.none()
    | st.binary(max_size=40)
    | st.sampled_from((b'{"id": 1}', b'{"id": "2", "v": 3}', b'{"id": 3}')),
    headers=st.lists(
        st.tuples(
            st.sampled_from(ENVELOPE) | st.text(max_size=3),
            st.none() | st.binary(max_size=10) | interesting,
        ),
        max_size=4,
    ),
    kind=st.just("chaos"),
    key=st.none(),
    effect=st.just(()),
    partition=st.integers(0, PARTITIONS - 1),
)


def reference_of(bootstrap: str, worker: Worker, topic: str) -> tuple[dict, set[str]]:
    """The SOW and the refused bookmarks of the worker's rules applied record by record
    (no batches, no fast path) to the topic's log, partition by partition."""
    rules = worker.rules[topic]
    states: dict[int, DictState] = {}
    refused = set()
    with Replay(bootstrap, topic, "0", until="0|1|", max_idle=10) as log:
        for message in log:
            if isinstance(message, LogMessage):
                out = Applied()
                rules.apply(states.setdefault(message.partition, DictState()), message, out)
                refused.update(message.bookmark for r in out.results if r.error is not None)
    sow = {k: r.data for state in states.values() for k, r in state.records.items()}
    return sow, refused


def fold(records: list[Made]) -> dict[str, Any]:
    """The SOW the valid records make, in log order (a key lives in one partition)."""
    sow: dict[str, dict] = {}
    for made in records:
        if not made.valid:
            continue
        action, *args = made.effect
        if action == "put":
            sow[args[0]] = args[1]
        elif action == "delta":
            sow[args[0]] = {**sow.get(args[0], {}), **args[1]}
        elif action == "delete":
            sow.pop(args[0], None)
        else:  # a delete by filter reaches only the records of its own partition
            for key in [k for k in sow if home(k) == made.partition]:
                v = sow[key].get("v")
                if isinstance(v, int) and v > args[0]:
                    del sow[key]
    return sow


def queue_view(made: Made) -> str:
    """What a queue makes of a record: a message, no message (a sow_delete), or skipped
    (its command or expiration does not read). A header without a value says nothing."""
    named = {name: value for name, value in made.headers if value is not None}
    command = named.get(H_COMMAND)
    if command == b"sow_delete":
        return "none"
    if command not in (None, b"publish", b"delta_publish"):
        return "skipped"
    expiration = named.get(H_EXPIRATION)
    if expiration is None:
        return "message"
    try:
        seconds = float(expiration)
    except ValueError:
        return "skipped"
    return "message" if math.isfinite(seconds) and 0 <= seconds <= MAX_EXPIRATION else "skipped"


def write(bootstrap: str, topic: str, records: list[Made]) -> list[str]:
    """Produce the records in order; their bookmarks."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    bookmarks: list[str] = [""] * len(records)

    def delivered(index: int, error, message) -> None:
        assert error is None, error
        bookmarks[index] = f"{topic}|{message.partition()}|{message.offset()}|"

    for index, made in enumerate(records):
        producer.produce(
            topic,
            made.value,
            headers=made.headers,
            partition=made.partition,
            on_delivery=lambda e, m, i=index: delivered(i, e, m),
        )
    assert producer.flush(30) == 0
    return bookmarks


def dead_letters(bootstrap: str, topic: str) -> list[LogMessage]:
    with Replay(bootstrap, topic, "0", until="0|1|", max_idle=10) as log:
        return [m for m in log if isinstance(m, LogMessage)]


# Each example runs a worker for seconds: shrinking a failure would take many minutes, so
# a failing batch is shown whole (note) instead.
@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    records=st.lists(st.one_of(valid_record(), spoiled_record()), min_size=30, max_size=90),
    chaos=st.lists(chaos_record, max_size=40),
)
def test_no_record_stops_the_worker_or_the_queue_and_only_the_invalid_are_dead_lettered(
    bootstrap, topic_factory, tmp_path, records, chaos
):
    note(repr(records))
    note(repr(chaos))
    sow_topic = topic_factory(PARTITIONS, key=("/id",))
    chaos_topic = topic_factory(PARTITIONS, key=("/id",))
    queue_topic = topic_factory(PARTITIONS)
    dead = topic_factory(1)
    sow_marks = write(bootstrap, sow_topic, records)
    queue_marks = write(bootstrap, queue_topic, records)
    write(bootstrap, chaos_topic, chaos)
    config = Config.model_validate(
        {
            "Topics": [
                {"Name": name, "Partitions": PARTITIONS}
                for name in (sow_topic, chaos_topic, queue_topic)
            ],
            "SOW": [
                {"Topic": name, "Key": "/id", "DeadLetterTopic": dead}
                for name in (sow_topic, chaos_topic)
            ],
            "Queues": [{"Name": queue_topic}],
        }
    )
    worker = Worker(config, bootstrap, tmp_path / uuid.uuid4().hex, group_id=uuid.uuid4().hex)
    try:
        worker.start()
        worker.wait_ready()  # the queue is ready once it has read its topic to the end
        wait_caught_up(worker, bootstrap, sow_topic, PARTITIONS)
        wait_caught_up(worker, bootstrap, chaos_topic, PARTITIONS)
        worker.raise_if_failed()
        assert sow_of(worker, sow_topic) == fold(records)
        chaos_sow, chaos_refused = reference_of(bootstrap, worker, chaos_topic)
        assert sow_of(worker, chaos_topic) == chaos_sow

        invalid = {mark for mark, made in zip(sow_marks, records, strict=True) if not made.valid}
        assert sum(worker.rejected.values()) == len(invalid) + len(chaos_refused)
        letters = dead_letters(bootstrap, dead)
        assert {dict(m.headers)["source"].decode() for m in letters} == invalid | chaos_refused
        originals = dict(zip(sow_marks, records, strict=True))
        for letter in letters:
            headers = dict(letter.headers)
            assert headers["reason"]
            source = headers["source"].decode()
            if source in originals:
                assert letter.raw == originals[source].value

        runtime = worker.queues.runtimes[queue_topic]  # type: ignore[union-attr]
        assert runtime.failure is None
        views = [queue_view(made) for made in records]
        queued = {m.bookmark for m in worker.queues.browse(queue_topic)}  # type: ignore[union-attr]
        assert queued == {
            mark for mark, view in zip(queue_marks, views, strict=True) if view == "message"
        }
        assert runtime.skipped == views.count("skipped")
    finally:
        worker.stop()
        delete_topics(bootstrap, [events_topic(queue_topic)])


def test_a_queue_stores_a_message_with_a_header_that_has_no_value():
    """Found by the test above: a header without a value (Kafka allows one) stopped the
    queue engine at its first checkpoint, since the store wrote each value as text."""
    headers = [("p", b"pub"), ("odd", None), ("bin", b"\xff\x00")]
    entry = QueueEntry(("t", 0, 5), 1000, b"{}", None, headers, None)
    assert decode_entry(entry.seq, encode_entry(entry), lambda _: None).headers == headers


def test_a_header_name_that_is_not_utf8_is_refused_by_the_worker_and_skipped_by_the_queue(
    bootstrap, topic_factory, tmp_path
):
    """confluent-kafka raises SystemError reading such a record's headers, and once the
    call site is warm CPython returns its broken list instead, which crashed the whole
    process: a run of such records gets there. Python's client can't write such a name;
    kcat, as any librdkafka producer, can."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/bootstrap.sh installs it)")
    sow_topic, queue_topic = topic_factory(1, key=("/id",)), topic_factory(1)
    dead = topic_factory(1)
    bad = 60
    producer = Producer({"bootstrap.servers": bootstrap})
    for topic in (sow_topic, queue_topic):
        command = [kcat.encode(), b"-b", bootstrap.encode(), b"-t", topic.encode(), b"-P"]
        lines = b'{"id": 1}\n' * bad
        subprocess.run([*command, b"-H", b"\xff\xfe=v"], input=lines, check=True, timeout=30)
        producer.produce(topic, b'{"id": 2}', partition=0)
    assert producer.flush(10) == 0
    config = Config.model_validate(
        {
            "Topics": [{"Name": sow_topic}, {"Name": queue_topic}],
            "SOW": [{"Topic": sow_topic, "Key": "/id", "DeadLetterTopic": dead}],
            "Queues": [{"Name": queue_topic}],
        }
    )
    worker = Worker(config, bootstrap, tmp_path / "state", group_id=uuid.uuid4().hex)
    try:
        worker.start()
        worker.wait_ready()
        wait_caught_up(worker, bootstrap, sow_topic, 1)
        worker.raise_if_failed()
        assert worker.rejected == {"bad_envelope": bad}
        assert sow_of(worker, sow_topic) == {"2": {"id": 2}}
        letters = dead_letters(bootstrap, dead)
        assert [dict(m.headers)["source"] for m in letters] == [  # type: ignore[arg-type]
            f"{sow_topic}|0|{offset}|".encode() for offset in range(bad)
        ]
        for letter in letters:
            assert b"not UTF-8" in dict(letter.headers)["reason"]  # type: ignore[arg-type]
            assert letter.raw == b'{"id": 1}'
        runtime = worker.queues.runtimes[queue_topic]  # type: ignore[union-attr]
        assert runtime.failure is None and runtime.skipped == bad
        queued = [m.bookmark for m in worker.queues.browse(queue_topic)]  # type: ignore[union-attr]
        assert queued == [f"{queue_topic}|0|{bad}|"]
    finally:
        worker.stop()
        delete_topics(bootstrap, [events_topic(queue_topic)])


def test_a_repartitioned_topic_refuses_a_header_name_that_is_not_utf8(
    bootstrap, topic_factory, tmp_path
):
    """The repartitioner read such a record's headers twice, the second time getting
    confluent-kafka's broken list (a crash of the worker's process). Its copy now names
    why, and the worker refuses it."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/bootstrap.sh installs it)")
    topic, bad = topic_factory(2, key=("/id",), repartition=True), 60
    command = [kcat.encode(), b"-b", bootstrap.encode(), b"-t", topic.encode(), b"-P"]
    lines = b'{"id": 1}\n' * bad
    subprocess.run([*command, b"-H", b"\xff\xfe=v"], input=lines, check=True, timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b'{"id": 2}')
    assert producer.flush(10) == 0
    config = Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": 2}],
            "SOW": [{"Topic": topic, "Key": "/id", "Repartition": True}],
        }
    )
    worker = Worker(config, bootstrap, tmp_path / "state", group_id=uuid.uuid4().hex)
    applied = threading.Event()
    worker.engine.add_listener(lambda _: applied.set())
    try:
        worker.start()
        worker.wait_ready()
        worker.repartitioners[0].wait_forwarded(bad + 1)
        deadline = time.monotonic() + 60
        while sum(worker.rejected.values()) < bad or not sow_of(worker, topic):
            worker.raise_if_failed()
            assert time.monotonic() < deadline, (worker.rejected, sow_of(worker, topic))
            applied.wait(0.5)
            applied.clear()
        assert worker.rejected == {"bad_envelope": bad}
        assert sow_of(worker, topic) == {"2": {"id": 2}}
    finally:
        worker.stop()
        delete_topics(bootstrap, [repartition_topic(topic)])


def test_a_spark_log_row_of_a_header_name_that_is_not_utf8_carries_the_error(
    bootstrap, topic_factory
):
    """The Spark source read headers with a direct call, which returns confluent-kafka's
    broken list once warm (a crash of the Spark task's Python worker)."""
    pytest.importorskip("pyspark", reason="the spark extra")
    from amps_on_kafka.spark.source import _row  # pyspark: only for this test

    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/bootstrap.sh installs it)")
    topic, bad = topic_factory(1), 60
    command = [kcat.encode(), b"-b", bootstrap.encode(), b"-t", topic.encode(), b"-P"]
    lines = b'{"id": 1}\n' * bad
    subprocess.run([*command, b"-H", b"\xff\xfe=v"], input=lines, check=True, timeout=30)
    consumer = reader(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list = []
        while len(records) < bad:
            records += [r for r in consumer.consume(bad, timeout=5) if r.error() is None]
        rows = [_row(topic, record) for record in records]
    finally:
        consumer.close()
    for row in rows:
        assert "not UTF-8" in row[-1] and row[-3] == b'{"id": 1}' and row[-2] == []
