"""Everything that talks to Kafka, against a broker that only speaks SASL_SSL (SCRAM-SHA-512
with a certificate from a local CA): the tour's commands, a worker, a Spark job, the client
API; wrong credentials and an untrusted CA as one clear line; no password in any output.

All in one module so the run (one process per module under xdist) starts one broker.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from click.testing import CliRunner

from amps_on_kafka.broker.certs import make_ca, write_pem
from amps_on_kafka.cli import main
from amps_on_kafka.client import COMPLETED, AsyncClient, Client
from amps_on_kafka.config import Config
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log import native_producer as native_producer_module
from amps_on_kafka.log import replay as replay_module
from amps_on_kafka.log.kafka import reader_config
from amps_on_kafka.log.native_reader import native_reader
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.server import gateway as gateway_module
from amps_on_kafka.server.gateway import Gateway

PASSWORD_ENV = "AMPS_TEST_KAFKA_PASSWORD"
WORKER_READY = 90.0  # seconds: a worker process on a busy 2-core machine
CLEAR_ERROR = 15.0  # seconds: a refused login must not take librdkafka's retries


def cli(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, list(args), input=stdin)


def test_the_tour_commands_work_over_sasl_ssl(secured_kafka):
    """`broker start --secure` printed what a client needs, password redacted; with
    --kafka-config the tour's commands create, publish, list, replay, describe, resolve a
    bookmark, show the log's extent and delete. The file's
    bootstrap.servers wins over $KAFKA_BOOTSTRAP_SERVERS (the plain test broker)."""
    assert "sasl.password=[redacted]" in secured_kafka.start_output
    assert str(secured_kafka.properties_file) in secured_kafka.start_output
    assert secured_kafka.password not in secured_kafka.start_output
    config = ("--kafka-config", str(secured_kafka.properties_file))
    topic = f"secured-tour-{uuid.uuid4().hex[:8]}"
    created = cli("topics", "create", topic, "--partitions", "2", "--key", "/id", *config)
    assert created.exit_code == 0, created.output
    docs = "\n".join(orjson.dumps({"id": i, "qty": i * 10}).decode() for i in range(5))
    published = cli("publish", topic, *config, stdin=docs)
    assert published.exit_code == 0, published.output
    listed = cli("topics", "list", *config)
    assert topic in listed.stdout
    replayed = cli("replay", topic, *config)
    assert replayed.exit_code == 0, replayed.output
    ids = sorted(orjson.loads(line)["data"]["id"] for line in replayed.stdout.splitlines())
    assert ids == list(range(5))
    described = cli("topics", "describe", topic, *config)
    assert "registered: 2 partitions, key /id" in described.stdout, described.output
    resolved = cli("bookmark", "resolve", topic, "0", "--format", "json", *config)
    assert sum(part["end"] for part in orjson.loads(resolved.stdout)) == 5, resolved.output
    assert "retention.ms=" in cli("log", "info", topic, *config).stdout
    deleted = cli("topics", "delete", topic, "--yes", *config)
    assert deleted.exit_code == 0 and topic not in cli("topics", "list", *config).stdout


def test_a_worker_and_the_client_api_over_sasl_ssl(secured_kafka, tmp_path, monkeypatch):
    """The config's Kafka Properties (password from the environment) reach the worker's
    every client; the client API publishes with kafka_config, and through the gateway
    (its producer); the SOW is served. The
    worker logs at DEBUG with librdkafka's security debugging on: no password in it.
    About 10 s: a worker process starting (imports, group join, recovery)."""
    monkeypatch.setenv(PASSWORD_ENV, secured_kafka.password)
    topic = f"secured-sow-{uuid.uuid4().hex[:8]}"
    config_file = _worker_config(secured_kafka, topic, tmp_path)
    created = cli("topics", "create", "--config", str(config_file))
    assert created.exit_code == 0, created.output
    with Client("secured-publisher") as client:
        client.connect(
            f"kafka://{secured_kafka.bootstrap}", kafka_config=_by_reference(secured_kafka)
        )
        for i in range(3):
            client.publish(topic, {"id": i, "qty": i})
        client.publish_flush(30)
    ready_file, log_file = tmp_path / "ready.json", tmp_path / "worker.log"
    command = [sys.executable, "-m", "amps_on_kafka.cli", "worker", "--config", str(config_file)]
    options = ["--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"]
    with log_file.open("wb") as log_out:
        worker = subprocess.Popen(
            [*command, *options, "--ready-file", str(ready_file), "--log-level", "DEBUG"],
            stderr=log_out,
        )
    try:
        gateway = _await_ready(worker, ready_file)
        rows = _await_sow(gateway, topic, expected=3)
        assert sorted(row["id"] for row in rows) == [0, 1, 2]
        with Client("secured-gateway-publisher") as client:  # the gateway's own producer
            client.connect(gateway)
            client.logon(timeout=CLEAR_ERROR)
            client.publish(topic, {"id": 3, "qty": 3})
            client.publish_flush(30)
        assert len(_await_sow(gateway, topic, expected=4)) == 4
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    log = log_file.read_text(errors="replace")
    assert "SASL" in log  # librdkafka's security debugging did reach the log
    assert secured_kafka.password not in log


def test_a_spark_export_reads_over_sasl_ssl(secured_kafka, tmp_path):
    """The Spark tasks get the properties as kafka.* options and read every record.

    The module's one slow test (20-80 s on a busy 2-core machine, nearly all of it the
    Spark session's JVM and a first job): only a real job shows that what its tasks
    receive connects."""
    pytest.importorskip("pyspark", reason="the spark extra")
    pq = pytest.importorskip("pyarrow.parquet")
    config = ("--kafka-config", str(secured_kafka.properties_file))
    topic = f"secured-spark-{uuid.uuid4().hex[:8]}"
    assert cli("topics", "create", topic, *config).exit_code == 0
    docs = "\n".join(orjson.dumps({"id": i}).decode() for i in range(4))
    assert cli("publish", topic, *config, stdin=docs).exit_code == 0
    out = tmp_path / "export"
    exported = cli("spark", "export", topic, "--out", str(out), "--master", "local[1]", *config)
    assert exported.exit_code == 0, exported.output
    assert pq.read_table(out).num_rows == 4
    assert secured_kafka.password not in exported.output


def test_the_asyncio_client_publishes_and_replays_over_sasl_ssl(secured_kafka):
    """AsyncClient.connect takes kafka_config as Client.connect does (a properties
    file here): an asyncio application reaches a secured Kafka too."""
    topic = f"secured-async-{uuid.uuid4().hex[:8]}"
    config = ("--kafka-config", str(secured_kafka.properties_file))
    assert cli("topics", "create", topic, *config).exit_code == 0

    async def publish_and_replay() -> list[int]:
        async with AsyncClient("secured-async") as client:
            uri = f"kafka://{secured_kafka.bootstrap}"
            await client.connect(uri, kafka_config=secured_kafka.properties_file)
            await client.logon(timeout=CLEAR_ERROR)
            for i in range(3):
                await client.publish(topic, {"id": i})
            await client.publish_flush(30)
            async with await client.bookmark_subscribe(topic, "0") as stream:
                return [message.data["id"] async for message in _until_completed(stream)]

    assert sorted(asyncio.run(publish_and_replay())) == [0, 1, 2]


def test_a_replay_reads_over_sasl_ssl_through_either_reader(secured_kafka, monkeypatch):
    """The compiled reader (log/native_reader.py) takes the secured broker's settings as
    text, as confluent-kafka does: it reads over SASL_SSL, the same records."""
    topic = f"secured-replay-{uuid.uuid4().hex[:8]}"
    config = ("--kafka-config", str(secured_kafka.properties_file))
    assert cli("topics", "create", topic, *config).exit_code == 0
    with Client("secured-replay") as client:
        client.connect(f"kafka://{secured_kafka.bootstrap}", kafka_config=config[1])
        client.logon(timeout=CLEAR_ERROR)
        for i in range(3):
            client.publish(topic, {"id": i})
        client.publish_flush(30)

    def read(native: bool) -> list:
        with Replay(secured_kafka.bootstrap, topic, "0", max_idle=1.0) as replay:
            assert (replay._native is not None) is native
            return [(m.bookmark, m.data) for m in replay if m is not COMPLETED]

    compiled = native_reader(reader_config("127.0.0.1:1")) is not None
    through_native = read(compiled)
    monkeypatch.setattr(replay_module, "native_reader", lambda config: None)
    assert through_native == read(False)
    assert sorted(data["id"] for _, data in through_native) == [0, 1, 2]


def test_the_gateway_publishes_over_sasl_ssl_through_either_producer(secured_kafka, monkeypatch):
    """The gateway's compiled producer (log/native_producer.py) takes the secured broker's
    settings as text, as confluent-kafka's does: its publishes reach the log alike."""
    topic = f"secured-gateway-{uuid.uuid4().hex[:8]}"
    config = ("--kafka-config", str(secured_kafka.properties_file))
    assert cli("topics", "create", topic, *config).exit_code == 0

    def publish(native: bool) -> None:
        engine = SowEngine(Config(), {}, now_ms)
        with Gateway(engine, secured_kafka.bootstrap, listen="127.0.0.1:0") as gateway:
            assert getattr(gateway.producer, "compiled", False) is native
            with Client(f"secured-gateway-{native}") as client:
                client.connect(f"tcp://{gateway.address}/amps/json")
                client.logon(timeout=CLEAR_ERROR)
                for i in range(3):
                    client.publish(topic, {"id": i, "native": native})
                client.publish_flush(30)

    published_through_either(secured_kafka.bootstrap, topic, publish, gateway_module, monkeypatch)


def test_a_kafka_client_publishes_over_sasl_ssl_through_either_producer(secured_kafka, monkeypatch):
    """A kafka:// client's own compiled producer (log/native_producer.own_producer) takes
    the secured broker's settings as text too: its publishes reach the log alike."""
    topic = f"secured-own-{uuid.uuid4().hex[:8]}"
    config = ("--kafka-config", str(secured_kafka.properties_file))
    assert cli("topics", "create", topic, *config).exit_code == 0

    def publish(native: bool) -> None:
        with Client(f"secured-own-{native}") as client:
            client.connect(f"kafka://{secured_kafka.bootstrap}", kafka_config=config[1])
            client.logon(timeout=CLEAR_ERROR)
            for i in range(3):
                client.publish(topic, {"id": i, "native": native})
            client.publish_flush(30)
            producer = client._transport.publisher._producer
            assert isinstance(producer, native_producer_module.CompiledProducer) is native

    published_through_either(
        secured_kafka.bootstrap, topic, publish, native_producer_module, monkeypatch
    )


def published_through_either(
    bootstrap: str,
    topic: str,
    publish: Callable[[bool], None],
    module: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`publish(native)` writes ids 0-2 with `native` in each: through the compiled
    producer where there is one, then through confluent-kafka's (`module.native_producer`
    patched to None). The log must hold both runs' records alike."""
    compiled = core is not None and hasattr(core, "RdProducer")
    publish(compiled)
    monkeypatch.setattr(module, "native_producer", lambda *args: None)
    publish(False)
    with Replay(bootstrap, topic, "0", max_idle=1.0) as replay:
        read = sorted((m.data["native"], m.data["id"]) for m in replay if m is not COMPLETED)
    assert read == sorted([(False, i) for i in range(3)] + [(compiled, i) for i in range(3)])


async def _until_completed(stream):
    """The messages of a replay up to its COMPLETED marker."""
    async for message in stream:
        if message is COMPLETED:
            return
        yield message


@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_wrong_credentials_or_an_untrusted_ca_are_one_clear_line(secured_kafka, tmp_path, wrong):
    """Refused at once (not after librdkafka's retries), named, without the password."""
    text = secured_kafka.properties_file.read_text()
    if wrong == "password":
        text = text.replace(secured_kafka.password, f"not-{secured_kafka.password}")
        expected = ["refused the credentials", "SASL authentication error"]
    else:
        other = make_ca("some other CA")
        write_pem(other, tmp_path / "other-ca.pem")
        ca = secured_kafka.bootstrap.properties["ssl.ca.location"]
        text = text.replace(ca, str(tmp_path / "other-ca.pem"))
        expected = ["failed the TLS handshake", "certificate verify failed"]
    bad = tmp_path / "bad.properties"
    bad.write_text(text)
    started = time.monotonic()
    result = cli("topics", "list", "--kafka-config", str(bad))
    seconds = time.monotonic() - started
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: Kafka at {secured_kafka.bootstrap} ")
    assert all(part in line for part in expected), line
    assert secured_kafka.password not in result.output
    assert seconds < CLEAR_ERROR
    with Client("refused") as client:  # the client API says the same
        client.connect(f"kafka://{secured_kafka.bootstrap}", kafka_config=bad)
        with pytest.raises(TransportError, match=expected[0]):
            client.logon(timeout=CLEAR_ERROR)


def test_plaintext_against_the_secured_listener_says_what_to_check(secured_kafka):
    """The broker just hangs up on a plaintext client; the line says why that may be."""
    result = cli("topics", "list", "--bootstrap", str(secured_kafka.bootstrap))
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert f"no Kafka broker answers at {secured_kafka.bootstrap}" in line
    assert "does its listener want TLS or SASL (security.protocol" in line


def _by_reference(secured) -> dict[str, str]:
    """The client properties with the password as a reference to the environment."""
    return {**secured.bootstrap.properties, "sasl.password": f"${{env:{PASSWORD_ENV}}}"}


def _worker_config(secured, topic: str, tmp_path: Path) -> Path:
    properties = secured.bootstrap.properties
    path = tmp_path / "config.yaml"
    path.write_text(
        "Kafka:\n"
        f"  BootstrapServers: {secured.bootstrap}\n"
        "  Properties:\n"
        "    security.protocol: SASL_SSL\n"
        "    sasl.mechanisms: SCRAM-SHA-512\n"
        f"    sasl.username: {properties['sasl.username']}\n"
        f"    sasl.password: ${{env:{PASSWORD_ENV}}}\n"
        f"    ssl.ca.location: {properties['ssl.ca.location']}\n"
        "    debug: security\n"
        f"Topics:\n  - Name: {topic}\n    Partitions: 2\n"
        f"SOW:\n  - Topic: {topic}\n    Key: /id\n"
        "Authentication:\n  Anonymous: true\n"
    )
    return path


def _await_ready(worker: subprocess.Popen, ready_file: Path) -> str:
    deadline = time.monotonic() + WORKER_READY
    while not ready_file.exists():
        assert worker.poll() is None, "the worker exited before it was ready"
        assert time.monotonic() < deadline, "the worker was not ready in time"
        time.sleep(0.2)
    return orjson.loads(ready_file.read_bytes())["gateway"]


def _await_sow(gateway: str, topic: str, expected: int) -> list[dict]:
    deadline = time.monotonic() + WORKER_READY
    while True:
        result = cli("sow", topic, "--server", gateway)
        rows = [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]
        if len(rows) >= expected or time.monotonic() > deadline:
            return [row.get("data", row) for row in rows]
        time.sleep(0.3)
