"""Issue 16, the admin CLI: topics delete/describe, --format json, config check/schema,
sow-delete and ping, against the real broker and a real worker's gateway."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka.admin import NewTopic

from amps_on_kafka.cli import main
from amps_on_kafka.log.kafka import admin_client, topic_names
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.topics import repartition_topic
from tests.conftest import delete_topics
from tests.server.conftest import client_to, served
from tests.server.helpers import WAIT

__all__ = ["client_to", "served"]  # fixtures


@pytest.fixture
def name(bootstrap):
    made = f"cli-admin-{uuid.uuid4().hex[:8]}"
    yield made
    delete_topics(bootstrap, [made, repartition_topic(made)])


def _json(result) -> object:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.output)


# -- topics ---------------------------------------------------------------------------
def test_describe_shows_the_registered_spec_beside_kafkas_view(run, name):
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    text = run("topics", "describe", name).output
    assert "registered: 2 partitions, key /id, json, partitioner murmur2" in text
    assert "in Kafka:   2 partitions, replication factor 1" in text
    assert "message.timestamp.type=LogAppendTime" in text  # set on the topic at creation
    assert "min.insync.replicas" not in text  # the broker's, not the topic's own
    doc = _json(run("topics", "describe", name, "--format", "json"))
    assert doc["registered"]["key"] == ["/id"] and doc["registered"]["partitions"] == 2
    assert [p["partition"] for p in doc["kafka"]["partitions"]] == [0, 1]
    assert doc["kafka"]["replication_factor"] == 1
    listed = _json(run("topics", "list", "--format", "json"))
    assert {"name": name, "partitions": 2} in listed


def test_topics_list_while_topics_are_being_deleted(run, bootstrap):
    """Other operators delete topics while one lists them (a shared broker): the list
    asked Kafka about each topic after listing them all, and a topic deleted in between
    failed the whole command with 'topic ... does not exist'."""
    names = [f"cli-admin-going-{uuid.uuid4().hex[:8]}" for _ in range(30)]
    admin = admin_client(bootstrap)
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(30)
    deleting = threading.Thread(target=lambda: [delete_topics(bootstrap, [n]) for n in names])
    deleting.start()
    try:
        outcomes = [run("topics", "list") for _ in range(20) if deleting.is_alive()]
    finally:
        deleting.join()
    assert outcomes, "the topics were deleted before the first list"
    failed = [o.output for o in outcomes if o.exit_code != 0]
    assert not failed, failed


def test_describe_of_an_unknown_topic_is_an_error(run, name):
    result = run("topics", "describe", name)
    assert result.exit_code == 1 and "neither in Kafka nor in the topic registry" in result.output


def test_delete_asks_first_then_removes_the_topic_and_its_registry_entry(run, name, bootstrap):
    created = run("topics", "create", name, "-p", "2", "--key", "/id")
    assert created.exit_code == 0, created.output
    declined = run("topics", "delete", name, stdin="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert name in topic_names(admin_client(bootstrap))
    deleted = run("topics", "delete", name, stdin="y\n")
    assert deleted.exit_code == 0 and f"{name}: deleted" in deleted.output
    assert name not in TopicRegistry(bootstrap).entries()
    deadline = time.monotonic() + 30  # Kafka deletes asynchronously
    while name in topic_names(admin_client(bootstrap)):
        assert time.monotonic() < deadline, "still in Kafka's metadata"
        time.sleep(0.2)
    again = run("topics", "delete", name, "--yes")
    assert again.exit_code == 1 and f"no such topic: {name}" in again.output
    # recreated with another spec: the old entry no longer stands in the way
    assert run("topics", "create", name, "-p", "1").exit_code == 0


def test_the_registry_topic_is_not_deleted(run):
    result = run("topics", "delete", "_amps_topics", "--yes")
    assert result.exit_code == 2 and "topic registry itself" in result.output


# -- --format json on log info and bookmark resolve ---------------------------------------
def test_log_info_and_bookmark_resolve_as_json(run, name):
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    assert run("publish", name, stdin='{"id": 1}\n{"id": 2}\n{"id": 3}\n').exit_code == 0
    (info,) = _json(run("log", "info", name, "--format", "json"))
    assert info["topic"] == name and "retention.ms" in info["configs"]
    rows = info["partitions"]
    assert sum(row["next_offset"] for row in rows) == 3
    filled = [row for row in rows if row["earliest"] is not None]
    assert all(row["latest_written"].endswith("Z") for row in filled)
    starts = _json(run("bookmark", "resolve", name, "0", "--format", "json"))
    assert {(s["partition"], s["start"]) for s in starts} == {(0, 0), (1, 0)}
    assert sum(s["end"] for s in starts) == 3


# -- config check / schema ----------------------------------------------------------------
BAD = """\
Topics:
  - Name: "bad name"
    Partitions: 0
  - Name: ok
    MessageType: xml
SOW:
  - Topic: ok
    Key: id
Gateway:
  ReadTimeout: soon
  Nonsense: 1
"""


def test_config_check_lists_every_problem_without_kafka(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never asked
    file = tmp_path / "bad.yaml"
    file.write_text(BAD)
    result = CliRunner().invoke(main, ["config", "check", str(file)])
    assert result.exit_code == 1
    problems = [line for line in result.output.splitlines() if line.startswith(f"{file}: ")]
    assert [p.split(": ")[1] for p in problems] == [
        "Topics[0].Name",
        "Topics[0].Partitions",
        "Topics[1].MessageType",
        "SOW[0].Key",
        "Gateway.ReadTimeout",
        "Gateway.Nonsense",
    ]
    assert result.output.rstrip().endswith("6 problems")


def test_config_check_reads_each_avro_schema(tmp_path):
    file = tmp_path / "c.yaml"
    (tmp_path / "broken.avsc").write_text('{"type": "record"}')
    file.write_text(
        "Topics: [{Name: a, MessageType: avro, Schema: broken.avsc},"
        " {Name: b, MessageType: avro, Schema: missing.avsc}]\n"
    )
    result = CliRunner().invoke(main, ["config", "check", str(file)])
    assert result.exit_code == 1
    assert "topic a: invalid Avro schema" in result.output
    assert "topic b: can't read Avro schema" in result.output


def test_a_valid_config_passes_and_the_schema_describes_it(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text(
        "Topics: [{Name: t}]\nSOW: [{Topic: t, Key: /id}]\nWorker: {SummaryEvery: 30s}\n"
    )
    result = CliRunner().invoke(main, ["config", "check", str(file)])
    assert result.exit_code == 0 and "valid (1 topics, 1 SOW, 0 queues)" in result.output
    schema = _json(CliRunner().invoke(main, ["config", "schema"]))
    assert {"Topics", "SOW", "Gateway", "Worker", "Queues"} <= set(schema["properties"])
    timeout = schema["$defs"]["GatewayConfig"]["properties"]["ReadTimeout"]
    assert {"type": "string"} in timeout["anyOf"]  # "30s" is a duration too


def test_config_check_with_kafka_compares_without_changing_anything(run, name, tmp_path, bootstrap):
    assert run("topics", "create", name, "-p", "2", "--key", "/id").exit_code == 0
    missing = f"{name}-missing"
    file = tmp_path / "c.yaml"
    file.write_text(
        f"Topics: [{{Name: {name}, Partitions: 3}}, {{Name: {missing}}}]\n"
        f"SOW: [{{Topic: {name}, Key: /id, DeadLetterTopic: {name}-dl}},"
        f" {{Topic: {missing}, Key: /id}}]\n"
    )
    assert run("config", "check", str(file)).exit_code == 0  # the file alone is fine
    result = run("config", "check", str(file), "--kafka")
    assert result.exit_code == 1 and "3 problems" in result.output
    assert f"topic '{name}' exists with another spec" in result.output
    assert f"SOW topic '{missing}' does not exist on Kafka" in result.output
    assert f"DeadLetterTopic '{name}-dl' does not exist" in result.output
    assert missing not in topic_names(admin_client(bootstrap))


# -- through a gateway: sow-delete and ping ------------------------------------------------
def test_sow_delete_by_filter_and_by_key_then_ping(served, client_to):
    client = client_to(served.address)
    with client.subscribe(served.topic, timeout=WAIT) as applied:
        for i in range(5):
            client.publish(served.topic, {"id": i, "qty": i * 10})
        client.publish_flush(WAIT)
        assert len([next(applied) for _ in range(5)]) == 5
    runner = CliRunner()
    server = ["--server", served.uri]
    by_filter = runner.invoke(main, ["sow-delete", served.topic, "--filter", "/qty >= 30", *server])
    assert by_filter.exit_code == 0 and "deleted 2 records" in by_filter.output
    by_key = runner.invoke(main, ["sow-delete", served.topic, "--key", "0", "--key", "1", *server])
    assert by_key.exit_code == 0 and "deleted 2 records" in by_key.output
    assert [r.data["id"] for r in client.sow(served.topic)] == [2]
    neither = runner.invoke(main, ["sow-delete", served.topic, *server])
    assert neither.exit_code == 2 and "give either --filter or --key" in neither.output
    pinged = runner.invoke(main, ["ping", *server])
    assert pinged.exit_code == 0 and " ms, heartbeat " in pinged.output


def test_ping_says_clearly_when_no_gateway_answers():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        result = CliRunner().invoke(
            main, ["ping", "--server", f"tcp://127.0.0.1:{port}/amps/json", "--timeout", "0.5"]
        )
        assert result.exit_code == 1
        assert f"Error: no reply from the gateway at 127.0.0.1:{port}" in result.output
    refused = CliRunner().invoke(main, ["ping", "--server", f"tcp://127.0.0.1:{port}/amps/json"])
    assert refused.exit_code == 1 and "can't connect to the gateway" in refused.output


@pytest.mark.parametrize(
    ("admin", "gateway", "clash"),
    [
        ("127.0.0.1:9007", None, True),  # the gateway's default
        ("0.0.0.0:9100", ":9100", True),
        (":9100", "127.0.0.1:9100", True),
        ("127.0.0.1:9100", "127.0.0.2:9100", False),
        ("127.0.0.1:0", "127.0.0.1:0", False),  # each picks a free port
    ],
)
def test_config_check_refuses_an_admin_port_on_the_gateways(tmp_path, admin, gateway, clash):
    """The worker bound its admin port first, then failed: 'gateway can't listen on ...:
    address already in use', its own admin port holding the address."""
    file = tmp_path / "c.yaml"
    listen = f"\nGateway: {{Listen: '{gateway}'}}" if gateway else ""
    file.write_text(
        f"Topics: [{{Name: t}}]\nSOW: [{{Topic: t, Key: /id}}]\n"
        f"Admin: {{Listen: '{admin}'}}{listen}\n"
    )
    result = CliRunner().invoke(main, ["config", "check", str(file)])
    assert (result.exit_code == 1) == clash, result.output
    assert ("takes the port of Gateway.Listen" in result.output) == clash


def test_a_worker_whose_listen_takes_the_admin_port_says_so_before_kafka(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # never asked
    file = tmp_path / "c.yaml"
    file.write_text("Topics: [{Name: t}]\nSOW: [{Topic: t, Key: /id}]\nAdmin: {Listen: ':9100'}\n")
    result = CliRunner().invoke(main, ["worker", "--config", str(file), "--listen", "0.0.0.0:9100"])
    assert result.exit_code == 1
    assert "--listen 0.0.0.0:9100 takes the port of Admin.Listen ':9100'" in result.output
