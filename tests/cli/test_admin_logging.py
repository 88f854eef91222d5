"""Issue 16, logging: `--log-format json`, the worker's summary line, and anomalies logged
once each with their context (a skipped record, a rebalance)."""

from __future__ import annotations

import logging
import signal
import time
import uuid

import orjson
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from amps_on_kafka.cli import main
from amps_on_kafka.cli.logs import formatter
from amps_on_kafka.config import Config
from amps_on_kafka.processor.summary import GatewayCounts, Summary
from amps_on_kafka.processor.worker import Worker
from tests.cli.test_failures import Running, write_config


def _record(name: str, message: str, **extra) -> logging.LogRecord:
    record = logging.getLogger(name).makeRecord(
        name, logging.WARNING, __file__, 1, message, ("x",), None, extra=extra
    )
    return record


def test_a_json_line_has_time_level_logger_message_and_the_context_fields():
    line = formatter("json").format(
        _record("amps_on_kafka.audit", "logon refused for %s", user="ann", peer=("10.0.0.1", 5))
    )
    doc = orjson.loads(line)
    assert doc["level"] == "WARNING"
    assert doc["logger"] == "amps_on_kafka.audit"
    assert doc["message"] == "logon refused for x"
    assert (doc["user"], doc["peer"]) == ("ann", ["10.0.0.1", 5])
    assert doc["time"].endswith("+00:00") and doc["time"][:4].isdigit()
    assert "\n" not in line


def test_a_json_line_carries_a_traceback_in_one_field():
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    doc = orjson.loads(formatter("json").format(record))
    assert "ValueError: bad" in doc["exc_info"]


def test_text_is_the_default_format():
    line = formatter("text").format(_record("amps_on_kafka.x", "hello %s"))
    assert line.endswith(" WARNING amps_on_kafka.x: hello x")


def test_an_unknown_log_format_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(
        main, ["worker", "--config", str(tmp_path / "c.yaml"), "--log-format", "xml"]
    )
    assert result.exit_code == 2 and "'--log-format'" in result.output


@pytest.fixture
def worker(bootstrap, topic_factory, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="amps_on_kafka")  # the assignment's line too
    topic = topic_factory(partitions=1, key=("/id",))
    config = Config.model_validate(
        {"Topics": [{"Name": topic}], "SOW": [{"Topic": topic, "Key": "/id"}]}
    )
    started = Worker(config, bootstrap, tmp_path / "state", group_id=f"g-{uuid.uuid4().hex}")
    started.start()
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def _events(caplog, event: str) -> list[logging.LogRecord]:
    """Lines with this context `event`, from the fixture's setup and the test itself."""
    records = caplog.get_records("setup") + caplog.records
    return [r for r in records if getattr(r, "event", None) == event]


def test_the_worker_logs_each_anomaly_once_with_its_context_and_a_summary(
    worker, bootstrap, caplog
):
    topic = worker.config.topics[0].name
    gateway = [GatewayCounts(sessions=3, slow_consumers=5, refused=1)]
    summary = Summary(worker, gateway=lambda: gateway[0], every=3600)
    gateway[0] = GatewayCounts(sessions=3, slow_consumers=7, refused=1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in (b'{"id": 1}', b"not json", b'{"id": 2}'):
        producer.produce(topic, value, key=b"k", partition=0)
    assert producer.flush(10) == 0
    deadline = time.monotonic() + 30
    while worker.applied < 3:
        assert time.monotonic() < deadline, f"applied {worker.applied} of 3"
        time.sleep(0.05)

    (skipped,) = _events(caplog, "skipped")
    assert (skipped.topic, skipped.partition, skipped.offset) == (topic, 0, 1)
    assert skipped.reason == "bad_record" and skipped.dead_letter_topic is None
    assert f"skipped record {topic}|0|1|" in skipped.getMessage()

    summary.log_now()
    (line,) = _events(caplog, "summary")
    assert (line.applied, line.skipped, line.sessions) == (3, 1, 3)
    assert (line.slow_consumers, line.refused_connections) == (2, 0)  # since the last line
    assert line.partitions == 1 and line.lag == 0 and line.kafka_down_seconds is None
    assert "applied 3 records" in line.getMessage() and "1 skipped" in line.getMessage()

    worker.stop()
    (assigned,) = _events(caplog, "assigned")
    (revoked,) = _events(caplog, "revoked")
    assert assigned.partitions == revoked.partitions == [f"{topic}|0"]
    assert "from the start of the log" in assigned.getMessage()


def test_with_log_format_json_every_stderr_line_of_a_worker_is_json(
    bootstrap, topic_factory, tmp_path
):
    """A log shipper reading the worker's stderr meets nothing but JSON, the ready line
    included; the summary line comes every Worker.SummaryEvery."""
    topic = topic_factory(partitions=1, key=("/id",))
    config = write_config(
        tmp_path,
        f"Topics: [{{Name: {topic}}}]\nSOW: [{{Topic: {topic}, Key: /id}}]\n"
        "Worker: {SummaryEvery: 0.2s}\n",
    )
    running = Running(
        "worker", "--config", config, "--state-dir", str(tmp_path / "state"),
        "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "info",
        bootstrap=bootstrap,
    )  # fmt: skip
    try:
        ready = orjson.loads(running.wait_for("worker ready: gateway="))
        summary = orjson.loads(running.wait_for('"event": "summary"'))
        code, stderr = running.interrupt(signal.SIGTERM)
    finally:
        running.kill()
    assert code == 0
    assert ready["event"] == "ready" and ready["gateway"].startswith("tcp://127.0.0.1:")
    assert ready["level"] == "INFO" and ready["logger"] == "amps_on_kafka.cli"
    assert (summary["sessions"], summary["partitions"], summary["lag"]) == (0, 1, 0)
    for line in stderr.splitlines():
        assert {"time", "level", "logger", "message"} <= set(orjson.loads(line)), line
