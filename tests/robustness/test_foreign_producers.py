"""Defect 14: topics written by other producers keep one SOW key in one partition.

kcat (librdkafka's default partitioner, consistent_random: CRC-32 of the key) is the
foreign producer. A topic declares the partitioner its producers use (`Partitioner`), and
every publisher of this project places keys by it, so a key written by kcat and by the
client lives in one partition and the SOW holds it once. A topic that does not declare
it gets misplaced records refused by the worker (dead-lettered), never a key twice.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict

import orjson
import pytest
import yaml
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message, Producer
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config, SowConfig, load_config
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.keys import key_text, partition_for
from amps_on_kafka.log.publisher import LogPublisher
from amps_on_kafka.log.topics import repartition_topic
from amps_on_kafka.processor.repartition import H_SOURCE_BOOKMARK, Routes
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.state.sow import SowRules
from tests.conftest import delete_topics
from tests.log.conftest import records_of
from tests.log.test_placement import grow
from tests.polling import until
from tests.sow.conftest import wait_caught_up
from tests.sow.test_poison import set_max_message_bytes
from tests.sow.test_worker import sow_of
from tests.sow.worker_process import spawn

PARTITIONS = 3
IDS = range(30)


def kcat_produce(bootstrap: str, topic: str, records: list[tuple[str | None, dict]]) -> None:
    """Produce (key, document) records with kcat as any shell user would: `-K '|'` splits
    a keyed line at its first `|`; unkeyed lines go through a second run without -K."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail(
            "kcat is not installed; these tests use it as the foreign producer "
            "(scripts/bootstrap.sh installs it: apt-get install kcat)"
        )
    keyed = [f"{k}|{orjson.dumps(d).decode()}" for k, d in records if k is not None]
    unkeyed = [orjson.dumps(d).decode() for k, d in records if k is None]
    for lines, options in ((keyed, ["-K", "|"]), (unkeyed, [])):
        if lines:
            subprocess.run(
                [kcat, "-b", bootstrap, "-t", topic, "-P", *options],
                input="\n".join(lines) + "\n",
                text=True,
                check=True,
                timeout=60,
            )


def sow_config(topic: str, partitioner: str) -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": PARTITIONS, "Partitioner": partitioner}],
            "SOW": [{"Topic": topic, "Key": "/id"}],
        }
    )


@pytest.fixture
def run_worker(bootstrap, tmp_path):
    """run_worker(config, group=None) -> a ready Worker, stopped at the end of the test.
    Each one is in the test's consumer group unless told, with the test's state
    directory: a second one is a restart."""
    started: list[Worker] = []
    test_group = uuid.uuid4().hex

    def start(config: Config, group: str | None = None) -> Worker:
        worker = Worker(config, bootstrap, tmp_path / "state", group_id=group or test_group)
        worker.start()
        started.append(worker)
        worker.wait_ready(60)
        return worker

    yield start
    for worker in started:
        worker.stop()


def kcat_then_client(bootstrap: str, topic: str) -> None:
    """Every id written by kcat keyed by its id, then by the client."""
    kcat_produce(bootstrap, topic, [(str(i), {"id": i, "by": "kcat"}) for i in IDS])
    with Client(f"pub-{uuid.uuid4().hex[:6]}") as client:
        client.connect(f"kafka://{bootstrap}")
        for i in IDS:
            client.publish(topic, {"id": i, "by": "client"})
        client.publish_flush(30)


def test_keys_from_kcat_and_from_the_client_meet_in_one_partition(
    bootstrap, topic_factory, run_worker
):
    topic = topic_factory(PARTITIONS, key=("/id",), partitioner="crc32")
    kcat_then_client(bootstrap, topic)
    homes: dict[bytes, set[int]] = defaultdict(set)
    for record in records_of(bootstrap, topic):
        homes[record.key()].add(record.partition())
    assert all(len(partitions) == 1 for partitions in homes.values()), homes
    assert len(homes) == len(IDS)

    worker = run_worker(sow_config(topic, "crc32"))
    wait_caught_up(worker, bootstrap, topic, PARTITIONS)
    assert sow_of(worker, topic) == {str(i): {"id": i, "by": "client"} for i in IDS}
    assert not worker.rejected


def test_a_topic_that_does_not_declare_kcats_partitioner_refuses_its_misplaced_records(
    bootstrap, topic_factory, run_worker
):
    """The defect as reported: `sow_key 5` twice, one record per partition. Now the
    worker refuses each kcat record not where murmur2 puts its key; no key is held twice."""
    topic = topic_factory(PARTITIONS, key=("/id",))  # murmur2, the default
    kcat_then_client(bootstrap, topic)
    misplaced = [
        i
        for i in IDS
        if partition_for(str(i).encode(), PARTITIONS, "crc32")
        != partition_for(str(i).encode(), PARTITIONS, "murmur2")
    ]
    assert misplaced  # else this test would prove nothing

    worker = run_worker(sow_config(topic, "murmur2"))
    wait_caught_up(worker, bootstrap, topic, PARTITIONS)
    assert sow_of(worker, topic) == {str(i): {"id": i, "by": "client"} for i in IDS}
    assert worker.rejected == {"misplaced_key": len(misplaced)}
    held = [r.sow_key for r in worker.engine.query(topic, None).records]
    assert sorted(held) == sorted(set(held))


def wait_for_sow(worker: Worker, topic: str, expected: dict, timeout: float = 60.0) -> None:
    """Until the worker's SOW is `expected`, checked after each batch it applies. (Its
    offsets can't tell: a transaction's commit marker takes an offset no record has.)"""
    applied = threading.Event()
    worker.engine.add_listener(lambda _: applied.set())
    deadline = time.monotonic() + timeout
    while (found := sow_of(worker, topic)) != expected:
        worker.raise_if_failed()
        assert time.monotonic() < deadline, f"SOW after {timeout}s: {found}"
        applied.wait(0.5)
        applied.clear()


def repartitioned_doc(topic: str) -> dict:
    return {
        "Topics": [{"Name": topic, "Partitions": PARTITIONS}],
        "SOW": [{"Topic": topic, "Key": "/id", "Repartition": True}],
    }


def repartitioned_config(topic: str) -> Config:
    return Config.model_validate(repartitioned_doc(topic))


@pytest.fixture
def unkeyed_topic(bootstrap, topic_factory):
    """A SOW topic whose producers don't key by SOW key, and its repartition topic."""
    topic = topic_factory(PARTITIONS, key=("/id",), repartition=True)
    yield topic
    delete_topics(bootstrap, [repartition_topic(topic)])


def test_unkeyed_records_are_repartitioned_by_sow_key_exactly_once(
    bootstrap, unkeyed_topic, run_worker, tmp_path
):
    """Repartition: kcat writes each id unkeyed (anywhere) or keyed by something else;
    the SOW, kept from _amps_repartition.<topic>, holds every id once, and a restarted
    worker neither loses nor copies again a record."""
    topic = unkeyed_topic
    first = [(None, {"id": i, "v": 1}) for i in IDS] + [("x", {"id": 99, "v": 1})]
    kcat_produce(bootstrap, topic, first)
    worker = run_worker(repartitioned_config(topic))
    (repartitioner,) = worker.repartitioners
    repartitioner.wait_forwarded(len(first))
    wait_for_sow(worker, topic, {str(i): {"id": i, "v": 1} for i in [*IDS, 99]})
    worker.stop()

    kcat_produce(bootstrap, topic, [(None, {"id": i, "v": 2}) for i in IDS if i > 3])
    publisher = LogPublisher(bootstrap, "deleter")
    publisher.sow_delete(topic, keys=["2", "3"])
    publisher.sow_delete(topic, filter="/id = 1")
    publisher.close(30)
    again = run_worker(repartitioned_config(topic))
    again.repartitioners[0].wait_forwarded(len(IDS) - 4 + 2 + PARTITIONS)
    expected = {str(i): {"id": i, "v": 2} for i in IDS if i > 3}
    expected.update({"0": {"id": 0, "v": 1}, "99": {"id": 99, "v": 1}})
    wait_for_sow(again, topic, expected)

    copies = records_of(bootstrap, repartition_topic(topic))
    sources = [dict(r.headers())[H_SOURCE_BOOKMARK].decode() for r in copies]
    assert len(sources) == len(set(sources)) == len(records_of(bootstrap, topic))
    for record in copies:
        if record.key() is not None:
            assert record.partition() == partition_for(record.key(), PARTITIONS)


def test_a_repartitioner_killed_mid_stream_neither_loses_nor_doubles_a_record(
    bootstrap, unkeyed_topic, run_worker, tmp_path
):
    """SIGKILL the worker while its repartitioner copies a stream kcat wrote; the
    restarted one (same group, same state directory, so the same transactional id)
    aborts what was open, and the committed copies hold every source record once. Both
    workers have the same InstanceId (static membership, as the repartitioner's consumer
    has): the restarted one takes the dead one's partitions at once instead of waiting
    for the group to time it out."""
    topic, count = unkeyed_topic, 15_000  # three transactions of BATCH_SIZE
    kcat_produce(bootstrap, topic, [(None, {"id": i}) for i in range(count)])
    config_file = tmp_path / "worker.yaml"
    group = f"crash-{uuid.uuid4().hex[:8]}"
    doc = {**repartitioned_doc(topic), "Worker": {"InstanceId": group}}
    config_file.write_text(yaml.safe_dump(doc))
    process = spawn(config_file, bootstrap, tmp_path / "state", group)
    try:
        assert process.stdout.readline().startswith("applied")  # copying has begun
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
    worker = run_worker(load_config(config_file), group=group)  # the same group
    wait_for_sow(worker, topic, {str(i): {"id": i} for i in range(count)}, timeout=120)
    copies = records_of(bootstrap, repartition_topic(topic), committed_only=True)
    sources = [dict(r.headers())[H_SOURCE_BOOKMARK] for r in copies]
    assert len(sources) == len(set(sources)) == count


def test_the_gateway_counts_a_delete_by_filter_of_a_repartitioned_topic_exactly(
    bootstrap, unkeyed_topic, run_worker
):
    """The processed ack of a delete by filter sums one result per internal partition:
    the publisher writes one record per partition of _amps_repartition.<topic>."""
    topic = unkeyed_topic
    kcat_produce(bootstrap, topic, [(None, {"id": i}) for i in IDS])
    worker = run_worker(repartitioned_config(topic))
    wait_for_sow(worker, topic, {str(i): {"id": i} for i in IDS})
    gateway = Gateway(worker.engine, bootstrap, listen="127.0.0.1:0")
    try:
        with Client(f"deleter-{uuid.uuid4().hex[:6]}") as client:
            client.connect(f"tcp://{gateway.start()}/amps/json")
            client.logon()
            assert client.sow_delete(topic, filter="/id < 20").matches == 20
            assert client.sow_delete(topic, keys=["25", "26"]).matches == 2
            assert sorted(client.sow(topic), key=lambda r: int(r.sow_key))[0].sow_key == "20"
    finally:
        gateway.stop()
    left = [i for i in IDS if i >= 20 and i not in (25, 26)]
    assert sow_of(worker, topic) == {str(i): {"id": i} for i in left}


# -- where the repartitioner sends each record: a property over any record ----------------
payloads = st.one_of(
    st.builds(lambda i: orjson.dumps({"id": i}), st.integers(0, 50) | st.text(min_size=1)),
    st.just(b'{"no_id": 1}'),
    st.binary(max_size=8),
    st.none(),
)
commands = st.one_of(
    st.just([]),
    st.just([("c", b"delta_publish")]),
    st.just([("c", b"sow_delete")]),
    st.builds(
        lambda target: [("c", b"sow_delete"), ("f", b"/id > 1"), *target],
        st.just([])
        | st.builds(
            lambda n: [("rp", n)],
            st.binary(max_size=3) | st.integers(-2, 9).map(lambda n: str(n).encode()),
        ),
    ),
    st.builds(
        lambda keys: [("c", b"sow_delete"), ("ks", orjson.dumps(keys))],
        st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=5),
    ),
    st.builds(lambda junk: [("c", junk)], st.binary(max_size=6)),
    st.builds(lambda junk: [("c", b"sow_delete"), ("ks", junk)], st.binary(max_size=6)),
)
records = st.builds(
    lambda value, headers, key, where: Message(
        topic="src",
        partition=where[0],
        offset=where[1],
        key=key,
        value=value,
        headers=headers or None,
        timestamp=(TIMESTAMP_LOG_APPEND_TIME, 1_700_000_000_000),
    ),
    payloads,
    commands,
    st.none() | st.binary(max_size=6),
    st.tuples(st.integers(0, 5), st.integers(0, 10**9)),
)


@given(record=records, count=st.integers(1, 8))
def test_every_record_is_copied_where_its_key_lives_and_none_is_dropped(record, count):
    """Repartition routing: each copy is in range and carries the source bookmark; a
    keyed copy is where murmur2 puts its key; a delete by keys is one copy per key; a
    delete by filter goes to the partition it names, else to all; what can't be keyed
    goes to partition 0 unchanged, for the worker to refuse. No record has no copy."""
    sow = SowConfig.model_validate({"Topic": "src", "Key": "/id"})
    copies = list(Routes(SowRules(sow, JSON), count).copies(record))
    source = f"src|{record.partition()}|{record.offset()}|".encode()
    assert copies
    for partition, key, headers in copies:
        assert 0 <= partition < count and (H_SOURCE_BOOKMARK, source) in headers
        if key is not None and key != record.key():
            assert partition == partition_for(key, count)
    raw = dict(record.headers() or [])
    if raw.get("c") == b"sow_delete" and "f" in raw:
        named = raw.get("rp", b"")
        wanted = [int(named)] if named.isdigit() and int(named) < count else list(range(count))
        assert [p for p, _, _ in copies] == wanted
    elif raw.get("c") == b"sow_delete" and _key_list(raw.get("ks")) is not None:
        keys = list(dict.fromkeys(_key_list(raw["ks"])))
        assert [k for _, k, _ in copies] == [k.encode() for k in keys]
        assert [dict(h)["ks"] for _, _, h in copies] == [orjson.dumps([k]) for k in keys]
    else:
        key = _sow_key(record, raw)
        if key is None:  # to partition 0 as it is, for the worker to refuse
            unchanged = [*(record.headers() or []), (H_SOURCE_BOOKMARK, source)]
            assert copies == [(0, record.key(), unchanged)]
        else:
            assert [(p, k) for p, k, _ in copies] == [(partition_for(key, count), key)]


def _sow_key(record: Message, headers: dict) -> bytes | None:
    """The record's SOW key by Key /id, or None when it has none a worker would accept."""
    if headers.get("c") not in (None, b"delta_publish", b"sow_delete") or "ks" in headers:
        return None
    try:
        document = orjson.loads(record.value()) if record.value() is not None else None
    except orjson.JSONDecodeError:
        return None
    value = document.get("id") if isinstance(document, dict) else None
    return None if value in (None, "") else key_text(value).encode()


def _key_list(raw: bytes | None) -> list[str] | None:
    try:
        keys = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    ok = isinstance(keys, list) and all(isinstance(k, str) for k in keys)
    return keys if ok else None


def test_records_too_large_to_copy_are_dead_lettered_not_retried_forever(
    bootstrap, unkeyed_topic, run_worker
):
    """Two copies Kafka can never take: one the producer refuses (a record just under
    Kafka's limit is over it with its source bookmark header), one the broker refuses
    (over the internal topic's max.message.bytes, which aborted the transaction, every
    time). Each is dead-lettered with its reason and source bookmark, and the records
    after them are copied."""
    topic = unkeyed_topic
    dead = f"{topic}-dead"
    set_max_message_bytes(bootstrap, repartition_topic(topic), 20_000)
    producer = Producer({"bootstrap.servers": bootstrap})  # kcat's own input limit is lower
    producer.produce(topic, orjson.dumps({"id": 0, "pad": "x" * 999_940}), partition=0)
    noise = base64.b64encode(os.urandom(30_000)).decode()  # lz4 can't make it smaller
    producer.produce(topic, orjson.dumps({"id": 1, "pad": noise}), partition=1)
    assert producer.flush(30) == 0
    kcat_produce(bootstrap, topic, [(None, {"id": i}) for i in IDS[2:]])
    doc = repartitioned_doc(topic)
    doc["SOW"][0].update({"DeadLetterTopic": dead, "CreateDeadLetterTopic": True})
    try:
        worker = run_worker(Config.model_validate(doc))
        worker.repartitioners[0].wait_forwarded(len(IDS))
        wait_for_sow(worker, topic, {str(i): {"id": i} for i in IDS[2:]})
        assert worker.repartitioners[0].refused == 2
        until(lambda: len(records_of(bootstrap, dead)) >= 2, what="two dead letters")
        refused = [dict(letter.headers()) for letter in records_of(bootstrap, dead)]
        sources = sorted(letter[H_SOURCE_BOOKMARK].decode() for letter in refused)
        assert sources == [f"{topic}|0|0|", f"{topic}|1|0|"]
        assert all(b"too large to repartition" in letter["reason"] for letter in refused)
    finally:
        delete_topics(bootstrap, [dead])


def test_a_worker_says_when_a_topic_has_other_partitions_than_its_config(
    bootstrap, topic_factory, run_worker, caplog
):
    """Partitions added to a keyed topic move its keys: the worker says so clearly."""
    topic = topic_factory(PARTITIONS, key=("/id",))
    grow(bootstrap, topic, PARTITIONS + 1)
    with caplog.at_level(logging.ERROR, logger="amps_on_kafka.processor.worker"):
        run_worker(sow_config(topic, "murmur2"))
    assert f"topic {topic} has 4 partitions in Kafka, its config 3" in caplog.text
