"""Issue 13: records the worker cannot apply, and where their dead letters go.

Defect 1: an expiration a stored record cannot hold (inf, nan, 1e308, 1e17) crashed the
worker, and again on every restart, since the record stays in the log. Defect 4: a
DeadLetterTopic missing from Kafka was accepted, and each letter to it was dropped while
the offset moved past its record. Defect 3 (the worker's side): a SOW key found in a
partition where it does not belong split that key's state over two partitions.
"""

from __future__ import annotations

import math
import uuid

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.cli import main
from amps_on_kafka.client import Client
from amps_on_kafka.config import Config, SowConfig
from amps_on_kafka.errors import ConfigError, MessageError
from amps_on_kafka.log.codecs import JSON, codec_for
from amps_on_kafka.log.envelope import MAX_EXPIRATION
from amps_on_kafka.log.kafka import admin_client, end_offsets, partitions_of
from amps_on_kafka.log.keys import Placement, murmur2, partition_for
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.processor.dead_letters import ensure_dead_letter_topics
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import Worker, now_ms
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.state.sow import Applied, DictState, SowRules
from tests.conftest import delete_topics
from tests.polling import until
from tests.server.helpers import Wire
from tests.sow.conftest import sow_config, wait_caught_up
from tests.sow.test_worker import sow_of

BAD_EXPIRATIONS = [b"inf", b"nan", b"1e308", b"1e17", b"-1"]


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, list | None, int]]):
    """Write (value, headers, partition) records straight to Kafka, as any producer may."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for value, headers, partition in records:
        producer.produce(topic, value, headers=headers, partition=partition)
    assert producer.flush(10) == 0


def letters(bootstrap: str, topic: str) -> list[LogMessage]:
    with Replay(bootstrap, topic, "0", until="0|1|", max_idle=10) as log:
        return [m for m in log if isinstance(m, LogMessage)]


def header(message: LogMessage, name: str) -> str:
    return dict(message.headers)[name].decode()  # type: ignore[arg-type]


# -- defect 1: an expiration no stored record can hold -----------------------------------
def test_an_expiration_no_record_can_hold_is_dead_lettered_and_a_restart_goes_on(
    bootstrap, topic_factory, publisher, start_worker, tmp_path
):
    topic = topic_factory(partitions=1, key=("/id",))
    dead = topic_factory(partitions=1)
    produce(bootstrap, topic, [(b'{"id": 1}', [("e", value)], 0) for value in BAD_EXPIRATIONS])
    publisher.publish(topic, {"id": 2}, expiration=60)
    publisher.publish_flush(10)
    config = sow_config(topic, partitions=1, DeadLetterTopic=dead)
    worker = start_worker(config, tmp_path / "s", group="g-poison")
    wait_caught_up(worker, bootstrap, topic, 1)
    assert sow_of(worker, topic) == {"2": {"id": 2}}
    assert worker.rejected == {"bad_envelope": len(BAD_EXPIRATIONS)}
    got = letters(bootstrap, dead)
    assert [header(m, "source") for m in got] == [f"{topic}|0|{i}|" for i in range(5)]
    for letter, value in zip(got, BAD_EXPIRATIONS, strict=True):
        reason = header(letter, "reason")
        assert "header 'e'" in reason and repr(float(value)) in reason, reason
        assert letter.raw == b'{"id": 1}' and dict(letter.headers)["e"] == value
    worker.stop()
    again = start_worker(config, tmp_path / "s", group="g-poison")  # the records are still there
    wait_caught_up(again, bootstrap, topic, 1)
    again.raise_if_failed()
    assert again.applied == 0 and sow_of(again, topic) == {"2": {"id": 2}}


def test_a_deadline_past_64_bits_from_the_log_timestamp_is_refused_naming_the_header():
    """A CreateTime topic may carry any timestamp: the sum must still fit the record."""
    rules = SowRules(SowConfig.model_validate({"Topic": "t", "Key": "/id"}), JSON)
    message = LogMessage("t", 0, 7, 2**63 - 1000, b'{"id": 1}', [("e", b"5")], JSON)
    state, out = DictState(), Applied()
    rules.apply(state, message, out)
    assert state.records == {} and out.changes == []
    (result,) = out.results
    assert "'e'" in result.error and str(2**63 - 1000) in result.error  # type: ignore[operator]
    assert result.rejection == "bad_record"


def test_a_key_field_no_key_text_can_hold_is_a_refusal_with_a_reason_not_an_apply_error():
    """An Avro `bytes` field has no text form: key_text raised a bare TypeError, which the
    rules only caught as an unexpected error."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "bytes"}]}
    codec = codec_for("avro", schema)
    rules = SowRules(SowConfig.model_validate({"Topic": "t", "Key": "/id"}), codec)
    message = LogMessage("t", 0, 3, 1000, codec.encode({"id": b"\x01"}), None, codec)
    out = Applied()
    rules.apply(DictState(), message, out)
    (result,) = out.results
    assert result.rejection == "bad_record" and "SOW key field" in result.error  # type: ignore[operator]


def test_a_topic_default_expiration_is_bounded_by_the_same_maximum():
    document = {"Topics": [{"Name": "t"}], "SOW": [{"Topic": "t", "Key": "/id"}]}
    document["SOW"][0]["Expiration"] = math.inf  # type: ignore[index]
    with pytest.raises(ValueError, match="less than or equal to 3155760000"):
        Config.model_validate(document)
    assert MAX_EXPIRATION == 3_155_760_000


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e308, 1e17, -1.0])
def test_the_kafka_client_refuses_an_expiration_no_record_can_hold(publisher, sow_topic, value):
    with pytest.raises(MessageError, match=r"expiration must be 0 \(never\) or a positive"):
        publisher.publish(sow_topic, {"id": 1}, expiration=value)


def test_the_gateway_and_the_tcp_client_refuse_an_expiration_no_record_can_hold(
    bootstrap, topic_factory
):
    topic = topic_factory(1, key=("/id",))
    with Gateway(SowEngine(Config(), {}, now_ms), bootstrap, listen="127.0.0.1:0") as gateway:
        address = gateway.address
        with Wire(address) as wire:
            wire.logon()
            for number, value in enumerate((1e308, 1e17, -1)):
                header = {"c": "publish", "cid": str(number), "t": topic, "e": value}
                reply = wire.request(header, b'{"id": 1}')
                assert reply.header["status"] == "failure"
                assert "expiration must be" in reply.header["reason"]
        with Client(f"tcp-{uuid.uuid4().hex[:6]}") as client:
            client.connect(f"tcp://{address}/amps/json")
            client.logon()
            for value in (math.inf, math.nan, 1e17):
                with pytest.raises(MessageError, match="expiration must be"):
                    client.publish(topic, {"id": 1}, expiration=value)
    assert end_offsets(bootstrap, topic) == {0: 0}  # nothing reached the log


@pytest.mark.parametrize("value", ["inf", "nan", "1e17", "-1"])
def test_the_cli_refuses_an_expiration_no_record_can_hold(value):
    result = CliRunner().invoke(main, ["publish", "T", '{"id": 1}', "--expiration", value])
    assert result.exit_code == 2
    assert "Invalid value for '--expiration'" in result.output
    assert "expiration must be 0 (never)" in result.output


# -- defect 4: dead letters must not be lost ---------------------------------------------
def test_a_dead_letter_topic_missing_from_kafka_stops_the_worker_at_startup_naming_it(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1, key=("/id",))
    missing = f"no-such-dead-letters-{uuid.uuid4().hex[:8]}"
    worker = Worker(sow_config(topic, 1, DeadLetterTopic=missing), bootstrap, tmp_path)
    with pytest.raises(ConfigError, match=f"DeadLetterTopic '{missing}' does not exist"):
        worker.start()
    assert worker._thread is None  # nothing started
    with pytest.raises(Exception, match="does not exist"):
        partitions_of(admin_client(bootstrap), missing)  # and the check did not create it


def test_CreateDeadLetterTopic_creates_a_missing_dead_letter_topic(
    bootstrap, topic_factory, start_worker
):
    topic = topic_factory(1, key=("/id",))
    made = f"made-dead-letters-{uuid.uuid4().hex[:8]}"
    try:
        config = sow_config(topic, 1, DeadLetterTopic=made, CreateDeadLetterTopic=True)
        start_worker(config)
        assert partitions_of(admin_client(bootstrap), made) == [0]
    finally:
        delete_topics(bootstrap, [made])


def queue_with_dead_letters(topic: str, target: str, **queue) -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic}],
            "Queues": [{"Name": topic, "DeadLetterTopic": target, **queue}],
        }
    )


def test_a_queue_dead_letter_topic_missing_from_kafka_stops_the_worker_naming_it(
    bootstrap, topic_factory, tmp_path
):
    """The queue's DeadLetterTopic (for expired messages) follows the SOW rule."""
    topic = topic_factory(1)
    missing = f"no-such-queue-letters-{uuid.uuid4().hex[:8]}"
    worker = Worker(queue_with_dead_letters(topic, missing), bootstrap, tmp_path)
    expected = f"queue {topic}: DeadLetterTopic '{missing}' does not exist"
    with pytest.raises(ConfigError, match=expected):
        worker.start()
    assert worker._thread is None


def test_a_queue_CreateDeadLetterTopic_creates_its_missing_dead_letter_topic(
    bootstrap, topic_factory, tmp_path
):
    topic = topic_factory(1)
    made = f"made-queue-letters-{uuid.uuid4().hex[:8]}"
    config = queue_with_dead_letters(topic, made, CreateDeadLetterTopic=True)
    try:
        ensure_dead_letter_topics(bootstrap, config)  # what Worker.start runs first
        assert partitions_of(admin_client(bootstrap), made) == [0]
    finally:
        delete_topics(bootstrap, [made])


def set_max_message_bytes(bootstrap: str, topic: str, value: int) -> None:
    entry = ConfigEntry(
        "max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_dead_letter_kafka_refuses_holds_its_partition_on_the_record_until_kafka_takes_it(
    bootstrap, topic_factory, publisher, start_worker
):
    topic = topic_factory(2, key=("/id",))
    dead = topic_factory(1)
    set_max_message_bytes(bootstrap, dead, 64)  # smaller than any letter: each is refused
    worker = start_worker(sow_config(topic, 2, DeadLetterTopic=dead))
    produce(bootstrap, topic, [(b"{not json", None, 0)])
    for i in range(20):
        publisher.publish(topic, {"id": i})
    publisher.publish_flush(10)
    ends = end_offsets(bootstrap, topic)
    until(lambda: worker.dead_letter_failures >= 2, what="a retried dead letter")
    worker.wait_caught_up(topic, {1: ends[1]})  # the other partition goes on meanwhile
    assert worker.next_offsets(topic)[0] is None  # partition 0 stays on its first record
    assert not worker.rejected and letters(bootstrap, dead) == []
    set_max_message_bytes(bootstrap, dead, 1_048_588)  # Kafka takes letters again
    worker.wait_caught_up(topic, ends)
    worker.raise_if_failed()
    assert worker.rejected == {"bad_record": 1}
    (letter,) = letters(bootstrap, dead)
    assert letter.raw == b"{not json" and header(letter, "source") == f"{topic}|0|0|"
    assert sorted(sow_of(worker, topic), key=int) == [str(i) for i in range(20)]


@pytest.mark.timing
def test_a_dead_letter_topic_deleted_while_the_worker_runs_fails_each_try_at_once(
    bootstrap, topic_factory, start_worker, caplog
):
    """Each try wrote to the deleted topic for DELIVERY_TIMEOUT (10 s) while the worker's
    loop, every partition, waited. Now a try fails at once, naming the topic, and the
    partition stays on its record until the topic is back."""
    topic, dead = topic_factory(2, key=("/id",)), topic_factory(1)
    worker = start_worker(sow_config(topic, 2, DeadLetterTopic=dead))
    delete_topics(bootstrap, [dead])
    produce(bootstrap, topic, [(b"{not json", None, 0)])
    until(lambda: worker.dead_letter_failures >= 3, "three tries (backoff 1 s, 2 s)", 8.0)
    assert f"DeadLetterTopic {dead!r} does not exist on Kafka" in caplog.text
    assert worker.next_offsets(topic)[0] is None  # still on its record
    admin = admin_client(bootstrap)  # held: the future fails if its client is freed
    admin.create_topics([NewTopic(dead, 1)])[dead].result(30)
    worker.wait_caught_up(topic, end_offsets(bootstrap, topic))
    (letter,) = letters(bootstrap, dead)
    assert header(letter, "source") == f"{topic}|0|0|"


# -- defect 3, the worker's side: a key where it does not belong -------------------------
def test_a_sow_key_in_a_partition_where_it_does_not_belong_is_reported_and_dead_lettered(
    bootstrap, topic_factory, publisher, start_worker
):
    topic = topic_factory(2, key=("/id",))
    dead = topic_factory(1)
    wrong = {k: 1 - partition_for(str(k).encode(), 2) for k in range(3)}
    produce(
        bootstrap,
        topic,
        [
            (b'{"id": 0, "v": "stray"}', None, wrong[0]),  # a plain publish: the fast path
            (b'{"id": 1, "v": "stray"}', [("c", b"delta_publish")], wrong[1]),
            (None, [("c", b"sow_delete"), ("ks", b'["2"]')], wrong[2]),
        ],
    )
    for i in range(3):
        publisher.publish(topic, {"id": i, "v": "home"})
    publisher.publish_flush(10)
    worker = start_worker(sow_config(topic, 2, DeadLetterTopic=dead))
    wait_caught_up(worker, bootstrap, topic, 2)
    assert worker.rejected == {"misplaced_key": 3}
    assert sow_of(worker, topic) == {str(i): {"id": i, "v": "home"} for i in range(3)}
    got = letters(bootstrap, dead)
    assert len(got) == 3
    for letter in got:
        assert "belongs in partition" in header(letter, "reason")


def test_murmur2_is_kafkas():
    """Vectors from Kafka's UtilsTest.testMurmur2 (signed there)."""
    cases = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }
    for text, signed in cases.items():
        assert murmur2(text.encode()) == signed % 2**32, text


@given(
    st.lists(st.binary(max_size=90), max_size=40),
    st.integers(min_value=1, max_value=12),
    st.data(),
)
def test_a_batch_check_finds_exactly_the_keys_partition_for_puts_elsewhere(keys, count, data):
    partition = data.draw(st.integers(min_value=0, max_value=count - 1))
    expected = [i for i, k in enumerate(keys) if partition_for(k, count) != partition]
    assert Placement(count).misplaced(keys, partition) == expected


def test_a_refused_record_larger_than_a_client_default_is_dead_lettered_whole(
    bootstrap, topic_factory, start_worker
):
    """The dead-letter producer takes any letter its topic takes: with librdkafka's
    default message.max.bytes (1 MB) a larger refused record held its partition for good."""
    topic = topic_factory(1, key=("/id",))
    dead = topic_factory(1)
    for name in (topic, dead):
        set_max_message_bytes(bootstrap, name, 4_000_000)
    big = b"{not json " + b"x" * 1_500_000
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    producer.produce(topic, big, partition=0)
    assert producer.flush(30) == 0
    worker = start_worker(sow_config(topic, 1, DeadLetterTopic=dead))
    wait_caught_up(worker, bootstrap, topic, 1)
    assert worker.rejected == {"bad_record": 1} and worker.dead_letter_failures == 0
    (letter,) = letters(bootstrap, dead)
    assert letter.raw == big


def test_a_batch_placement_check_refuses_exactly_the_keys_of_other_partitions():
    """SowRules.place checks a general-path batch at once; it must refuse what key_of's
    own check would, and let every other record through unchanged."""
    rules = SowRules(SowConfig.model_validate({"Topic": "t", "Key": "/id"}), JSON)
    rules.placement = Placement(3)
    keys = [str(i) for i in range(40)]
    messages = [
        LogMessage("t", 1, n, 1000, b'{"id": "%s"}' % k.encode(), [("c", b"delta_publish")], JSON)
        for n, k in enumerate(keys)
    ]
    rules.place(messages, 1)
    state, out = DictState(), Applied()
    for message in messages:
        rules.apply(state, message, out)
    home = [k for k in keys if partition_for(k.encode(), 3) == 1]
    assert sorted(state.records) == sorted(home) and 0 < len(home) < len(keys)
    assert {r.rejection for r in out.results if r.error} == {"misplaced_key"}
    assert len([r for r in out.results if r.error]) == len(keys) - len(home)
